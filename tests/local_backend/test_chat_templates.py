"""Chat templates render as transformers renders them: the same text from the same template,
for templates that branch on tools, raise exceptions and add a generation prompt."""
from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from local_backend.tokenizer import TemplateError, Tokenizer

# Written in the style of the Qwen and Llama templates: a tools branch, a think-block strip
# on earlier assistant turns, a namespace, reversed iteration, and raise_exception.
TEMPLATE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- 'Tools:' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=messages | length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == 'user' and ns.last_user == messages | length - 1 %}
        {%- set ns.last_user = messages | length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('role ' + message.role + ' is not supported') }}
    {%- elif message.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in message.content %}
        {{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}
    {%- elif message.role != 'system' or not loop.first %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café? 日本語"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>easy</think>\n\n4"},
     {"role": "user", "content": "and 3+3?"}],
]


@pytest.fixture
def tokenizer_dir(checkpoints, tmp_path):
    path = shutil.copytree(checkpoints["qwen3"], tmp_path / "qwen3")
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_rendering_equals_transformers(tokenizer_dir, messages, add_generation_prompt):
    ours = Tokenizer(tokenizer_dir).render_chat(messages, add_generation_prompt=add_generation_prompt)
    theirs = AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs


def test_raise_exception_is_a_template_error(tokenizer_dir):
    with pytest.raises(TemplateError, match="role tool is not supported"):
        Tokenizer(tokenizer_dir).render_chat([{"role": "tool", "content": "42"}])
