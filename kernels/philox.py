"""Philox-4x32-10, the counter-based generator behind seeded sampling.

Both versions below compute the same 32-bit words bit for bit: the Triton one
in uint32 registers, the torch one in int64 with every product split into 16-bit
halves so that nothing overflows. That is what lets a CPU run and a GPU run of
the sampler draw identical noise.

Stream layout (fixed; changing it changes every sampled answer):
  key     = (seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF)
  counter = (0, step & 0xFFFFFFFF, step >> 32 & 0xFFFFFFFF, 0)
  u       = (output[0] >> 8) * 2**-24, uniform on [0, 1) in steps of 2**-24
One uniform per (seed, step): the sampler inverts the row's CDF at u, so its
per-token work is a single exp and the generator costs one call per row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11).
# constexpr so the Triton kernels can read them; `.value` for the torch side.
ROUND_A = tl.constexpr(0xD2511F53)
ROUND_B = tl.constexpr(0xCD9E8D57)
KEY_A = tl.constexpr(0x9E3779B9)
KEY_B = tl.constexpr(0xBB67AE85)
ROUNDS = tl.constexpr(10)
_M32 = 0xFFFFFFFF


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Ten Philox rounds on uint32 tensors; returns the four output words."""
    for _ in tl.static_range(ROUNDS):
        a = c0
        b = c2
        c0 = tl.umulhi(b, ROUND_B) ^ c1 ^ k0
        c2 = tl.umulhi(a, ROUND_A) ^ c3 ^ k1
        c1 = b * ROUND_B
        c3 = a * ROUND_A
        k0 = k0 + KEY_A
        k1 = k1 + KEY_B
    return c0, c1, c2, c3


@triton.jit
def row_uniform(seed, step):
    """int64 seed and step scalars -> the row's fp32 u in [0, 1) (exact: 24 bits)."""
    zero = tl.full([], 0, tl.uint32)
    word, _, _, _ = philox4x32(zero, (step & 0xFFFFFFFF).to(tl.uint32), ((step >> 32) & 0xFFFFFFFF).to(tl.uint32),
                               zero, (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    return (word >> 8).to(tl.float32) * 5.9604644775390625e-08


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # 16-bit halves keep every partial product below 2**33, far from int64 overflow.
    al, ah = a & 0xFFFF, a >> 16
    bl, bh = b & 0xFFFF, b >> 16
    mid = al * bh + ah * bl
    low = al * bl + ((mid & 0xFFFF) << 16)
    hi = ah * bh + (mid >> 16) + (low >> 32)
    return hi, low & _M32


def philox4x32_reference(c0, c1, c2, c3, k0, k1):
    """The same ten rounds on int64 tensors holding values in [0, 2**32)."""
    for _ in range(ROUNDS.value):
        hi_b, lo_b = _mulhilo(ROUND_B.value, c2)
        hi_a, lo_a = _mulhilo(ROUND_A.value, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + KEY_A.value) & _M32
        k1 = (k1 + KEY_B.value) & _M32
    return c0, c1, c2, c3


def row_bits_reference(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """[B] seeds, [B] steps -> int64 [B]: the 32-bit Philox word behind each row's u."""
    seeds = seeds.to(torch.int64)
    steps = steps.to(torch.int64)
    zeros = torch.zeros_like(seeds)
    word, _, _, _ = philox4x32_reference(zeros, steps & _M32, (steps >> 32) & _M32, zeros,
                                         seeds & _M32, (seeds >> 32) & _M32)
    return word


def row_uniform_reference(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    return (row_bits_reference(seeds, steps) >> 8).to(torch.float32) * 5.9604644775390625e-08
