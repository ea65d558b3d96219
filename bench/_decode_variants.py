"""TEMPORARY (deleted after the GPU run): new decode variants vs the previous kernel, bits and time."""
from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

CPU = not torch.cuda.is_available()
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import triton  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from kernels import attention_triton as new  # noqa: E402
from kernels import attention_triton_old as old  # noqa: E402

DEV = "cpu" if CPU else "cuda"
DTYPE = torch.float16 if CPU else torch.bfloat16
PAGE = 16
VARIANTS = [(2, False, False), (3, False, False), (2, True, False), (3, True, False), (2, True, True),
            (3, True, True)]  # stages, prefetch, fused; the last is the default


def set_variant(v):
    new.DECODE_STAGES, new.PREFETCH, new.FUSED_MERGE = v


def case(rng, gen, H, H_KV, D, max_ctx, kv_split):
    B = rng.choice([1, 2, 3, 8, 17, 64]) if not CPU else rng.randint(1, 4)
    kv_lens = [rng.randint(1, max_ctx) for _ in range(B)]
    mode = rng.choice(["decode", "decode", "mixed"])
    q_lens = [1 if mode == "decode" else rng.choice([1, rng.randint(1, min(n, 70))]) for n in kv_lens]
    n_pages = [-(-n // PAGE) for n in kv_lens]
    total = sum(n_pages) + 4
    kc = torch.randn(total, PAGE, H_KV, D, generator=gen, device=DEV).to(DTYPE)
    vc = torch.randn(total, PAGE, H_KV, D, generator=gen, device=DEV).to(DTYPE)
    perm = torch.randperm(total, generator=gen, device=DEV).tolist()
    width, used, tables = max(n_pages), 0, []
    for n in n_pages:
        tables.append(perm[used: used + n] + [-1] * (width - n))
        used += n
    q = torch.randn(sum(q_lens), H, D, generator=gen, device=DEV).to(DTYPE)
    cu = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32, device=DEV)
    args = (q, kc, vc, torch.tensor(tables, dtype=torch.int32, device=DEV), cu,
            torch.tensor(kv_lens, dtype=torch.int32, device=DEV), D ** -0.5)
    return args, dict(max_q_len=max(q_lens), max_kv_len=max(kv_lens), kv_split=kv_split)


def bit_check(n_cases, seed=0):
    rng = random.Random(seed)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    heads = [(32, 8, 128), (8, 8, 128), (32, 4, 128)] if not CPU else [(8, 2, 32), (4, 4, 32)]
    max_ctx, kv_split = (9000, old.KV_SPLIT) if not CPU else (300, 128)
    out = {"cases": 0, "calls": 0, "elements_differing": 0, "calls_differing": 0}
    for i in range(n_cases):
        H, H_KV, D = heads[i % len(heads)]
        args, kw = case(rng, gen, H, H_KV, D, max_ctx if i % 5 else 4 * max_ctx if not CPU else max_ctx, kv_split)
        out["cases"] += 1
        for path in (None, True, False):
            want = old.paged_attention_triton(*args, **kw, split_per_program=path)
            for v in VARIANTS if (i % len(heads) == 0 and not CPU) else VARIANTS[-3:]:
                set_variant(v)
                try:
                    got = new.paged_attention_triton(*args, **kw, split_per_program=path)
                except Exception as e:  # noqa: BLE001
                    out["failed"] = out.get("failed", []) + [f"{v} {path}: {repr(e)[:200]}"]
                    continue
                diff = int((got.view(torch.int16) != want.view(torch.int16)).sum())
                out["calls"] += 1
                out["elements_differing"] += diff
                out["calls_differing"] += diff > 0
                if diff:
                    print("DIFF", v, path, kw, diff, flush=True)
    set_variant(VARIANTS[-1])
    return out


def timing():
    H, H_KV, D = 32, 8, 128
    gen = torch.Generator(device=DEV).manual_seed(1)
    rows = []
    shapes = [(1, 512), (1, 2048), (1, 8192), (1, 32768), (8, 512), (8, 2048), (8, 8192), (32, 512),
              (64, 2048), (256, 512)]
    for B, ctx in shapes:
        n = B * (-(-ctx // PAGE))
        kc = torch.randn(n, PAGE, H_KV, D, device=DEV, dtype=DTYPE, generator=gen)
        vc = torch.randn(n, PAGE, H_KV, D, device=DEV, dtype=DTYPE, generator=gen)
        tables = torch.randperm(n, device=DEV, generator=gen).view(B, -1).int()
        q = torch.randn(B, H, D, device=DEV, dtype=DTYPE, generator=gen)
        cu = torch.arange(B + 1, device=DEV, dtype=torch.int32)
        kv_lens = torch.full((B,), ctx, device=DEV, dtype=torch.int32)
        args = (q, kc, vc, tables, cu, kv_lens, D ** -0.5)
        kw = dict(max_q_len=1, max_kv_len=ctx)
        row = {"batch": B, "context": ctx}
        k = kc[tables.long()].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
        v = vc[tables.long()].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
        try:
            cudnn()
            row["cudnn_us"] = triton.testing.do_bench_cudagraph(cudnn, rep=50, return_mode="median") * 1e3
        except Exception as e:  # noqa: BLE001
            row["cudnn_us"] = None
            print("cudnn failed", e)
        row["old_us"] = triton.testing.do_bench_cudagraph(
            lambda: old.paged_attention_triton(*args, **kw), rep=50, return_mode="median") * 1e3
        for vv in VARIANTS:
            set_variant(vv)
            name = "s%d%s%s_us" % (vv[0], "p" if vv[1] else "-", "f" if vv[2] else "-")
            try:
                new.paged_attention_triton(*args, **kw)
                row[name] = triton.testing.do_bench_cudagraph(lambda: new.paged_attention_triton(*args, **kw),
                                                              rep=50, return_mode="median") * 1e3
            except Exception as e:  # noqa: BLE001
                row[name] = None
                print("FAILED", name, repr(e)[:300], flush=True)
        row["old_again_us"] = triton.testing.do_bench_cudagraph(
            lambda: old.paged_attention_triton(*args, **kw), rep=50, return_mode="median") * 1e3
        set_variant(VARIANTS[-1])
        print(json.dumps({k_: (round(x, 2) if isinstance(x, float) else x) for k_, x in row.items()}), flush=True)
        rows.append(row)
        del kc, vc, k, v
    return rows


if __name__ == "__main__":
    t0 = time.time()
    res = {"bits": bit_check(int(sys.argv[1]) if len(sys.argv) > 1 else (4 if CPU else 60))}
    print("bits:", res["bits"], f"[{time.time() - t0:.0f}s]", flush=True)
    if not CPU:
        res["timing"] = timing()
    out = Path(os.environ.get("OUT", "/tmp"))
    if not CPU:
        cols = list(res["timing"][0])
        lines = ["bits: " + json.dumps(res["bits"]), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in res["timing"]:
            lines.append("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
        (out / "decode_variants.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    (out / "decode_variants.json").write_text(json.dumps(res, indent=1))
