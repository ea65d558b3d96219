"""Digests of every invariant kernel's output on fixed inputs, to compare GPUs bit for bit.

Inputs come from a CPU generator with a fixed seed, so every machine feeds the kernels the
same bits; the script prints one sha256 per (op, shape) and writes them as JSON, with the
toolchain that compiled the kernels. Run it on two GPUs, or on one GPU under two Tritons, and
diff the files: equal digests mean bit-identical results across the chips (or compilers).

    python3 bench/cross_gpu_hashes.py --out bench/results/hashes_h100.json
    python3 bench/cross_gpu_hashes.py --compare hashes_h100.json hashes_h200.json hashes_cpu_reference.json

--compare prints the markdown table of bench/results/cross_gpu.md: each file's digests
side by side, whether the first two (the GPUs) agree, and whether the first matches the last.
"""
from __future__ import annotations

import argparse
import hashlib
import json

import torch

import kernels

# Where the kernels run; "cpu" gives a dry run of the script on the torch references.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def inputs(seed: int, *shape, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype).to(DEVICE)


def matmuls() -> dict[str, str]:
    out = {}
    for m, k, n in [(1, 4096, 4096), (64, 4096, 14336), (1024, 14336, 4096), (4096, 4096, 4096)]:
        a, w = inputs(m * 7 + 1, m, k), inputs(k * 3 + n, n, k)
        out[f"matmul M={m} K={k} N={n}"] = digest(kernels.matmul(a, w.t()))
    return out


def norms() -> dict[str, str]:
    x, res, w = inputs(11, 2048, 4096), inputs(12, 2048, 4096), inputs(13, 4096)
    normed, new_res = kernels.rms_norm_residual(x, res, w, 1e-6)
    return {"rms_norm 2048x4096": digest(kernels.rms_norm(x, w, 1e-6)),
            "rms_norm_residual 2048x4096": digest(torch.cat([normed, new_res]))}


def paged(lens, q_lens, seed) -> str:
    """Digest of one paged attention call: sequences of kv length lens, the last q_lens rows queried."""
    heads, kv_heads, dim, page = 32, 8, 128, 16
    blocks = sum((n + page - 1) // page for n in lens)
    k_cache, v_cache = inputs(seed, blocks, page, kv_heads, dim), inputs(seed + 1, blocks, page, kv_heads, dim)
    perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(seed + 2))
    table = torch.zeros(len(lens), max((n + page - 1) // page for n in lens), dtype=torch.int32)
    at = 0
    for s, n in enumerate(lens):
        used = (n + page - 1) // page
        table[s, :used] = perm[at:at + used].to(torch.int32)
        at += used
    q = inputs(seed + 3, sum(q_lens), heads, dim)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    o = kernels.paged_attention(q, k_cache, v_cache, table.to(DEVICE), cu.to(DEVICE), torch.tensor(lens, dtype=torch.int32).to(DEVICE),
                                max_q_len=max(q_lens), max_kv_len=max(lens))
    return digest(o)


def attention() -> dict[str, str]:
    # Decode, full prefill, a chunk over a cached prefix, decode; then long context, past
    # position 8192 where the splits widen (added with KERNEL_VERSION 4).
    return {"paged_attention mixed batch": paged([1, 200, 1500, 5000], [1, 200, 37, 1], 21),
            "paged_attention long context": paged([20000, 9000, 12345], [1, 1, 70], 41)}


def sampling() -> dict[str, str]:
    b, vocab = 64, 152064
    logits = inputs(31, b, vocab, dtype=torch.float32)
    seeds = torch.arange(b, dtype=torch.int64).to(DEVICE) * 1_000_003
    steps = torch.arange(b, dtype=torch.int64).to(DEVICE) % 7
    temperature = torch.full((b,), 0.8).to(DEVICE)
    top_k = torch.tensor([0, 50] * (b // 2), dtype=torch.int32).to(DEVICE)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0] * (b // 4)).to(DEVICE)
    return {"log_softmax 64x152064": digest(kernels.log_softmax(logits)),
            "argmax 64x152064": digest(kernels.argmax(logits)),
            "sample 64x152064": digest(kernels.sample(logits, seeds, steps, temperature, top_k, top_p))}


def mixture_of_experts() -> dict[str, str]:
    """Qwen3-30B-A3B's experts (H 2048, I 768, 128 experts, top 8): routing, and the experts at a
    decode size (a block per slot) and a batch (sorted blocks)."""
    h, i, e, k = 2048, 768, 128, 8
    gate_up = (inputs(41, e, 2 * i, h).float() * h ** -0.5).to(torch.bfloat16)
    down = (inputs(42, e, h, i).float() * i ** -0.5).to(torch.bfloat16)
    out = {}
    for t in (1, 256):
        x = inputs(43 + t, t, h)
        weights, ids = kernels.moe.route(inputs(44 + t, t, e), k, True)
        out[f"moe route T={t} E={e} k={k}"] = digest(torch.cat([weights.view(torch.int32), ids], 1))
        out[f"moe experts T={t} H={h} I={i}"] = digest(kernels.moe.experts(x, weights, ids, gate_up, down))
    return out


def compare(paths: list[str]) -> str:
    runs = [json.load(open(path)) for path in paths]
    # The same chip under two compilers is two columns: name the toolchain where a run recorded it.
    names = [run["device"] + (f" ({run['toolchain']})" if "toolchain" in run else "") for run in runs]
    lines = [f"| op | {' | '.join(names)} | {names[0]} == {names[1]} | {names[0]} == {names[-1]} |",
             "|---" * (len(runs) + 3) + "|"]
    agree = 0
    for op in runs[0]["digests"]:
        cells = [run["digests"].get(op, "-") for run in runs]
        same = cells[0] == cells[1]
        agree += same
        lines.append(f"| {op} | {' | '.join(cells)} | {'yes' if same else 'no'} | "
                     f"{'yes' if cells[0] == cells[-1] else 'no'} |")
    versions = sorted({run["kernel_version"] for run in runs})
    lines.append(f"\n{agree} of {len(runs[0]['digests'])} outputs bit-identical between {names[0]} and {names[1]} "
                 f"(KERNEL_VERSION {', '.join(versions)}).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs="+", metavar="FILE", help="digest files: GPU, GPU, ..., reference")
    args = parser.parse_args()
    if args.compare:
        print(compare(args.compare))
        return
    if not args.out:
        parser.error("--out or --compare is required")
    kernels.set_mode("invariant")
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
              "toolchain": kernels.toolchain(torch.device(DEVICE)), "kernel_version": kernels.KERNEL_VERSION,
              "digests": {}}
    for part in (matmuls, norms, attention, sampling, mixture_of_experts):
        result["digests"].update(part())
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}  {result['toolchain']}")
    for name, value in result["digests"].items():
        print(f"{name:40s} {value}")


if __name__ == "__main__":
    main()
