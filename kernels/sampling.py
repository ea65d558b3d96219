"""Sampling reductions: log-softmax, logsumexp, argmax and the seeded sampler.

Every entry point takes logits [B, V] and treats rows independently. Dispatch
follows kernels.mode: `invariant` runs the Triton kernels in kernels/sampling_triton.py
(fixed-size splits of V merged in a fixed order, so a row's bits never depend on B
or on its position); `standard` runs stock torch ops (the baseline whose cost
invariance is measured against); anything else (invariant mode on a CPU tensor
without the interpreter) runs the plain-torch references below.

Sampling semantics (all modes that filter agree on them):
  * temperature <= 0: exact greedy, argmax of the raw logits, ties to the lowest id.
  * otherwise s = logits * (1 / temperature) in fp32 (the reciprocal an IEEE
    division, the product unfused, identical on CPU and GPU), and tokens are
    ranked by s descending, ties by lowest token id. The kept set is the shortest
    prefix of that ranking that satisfies an active condition, never empty:
      top_k in [1, V):  the prefix has top_k tokens;
      top_p < 1:        the prefix's softmax(s) mass (over the full vocabulary) is
                        >= top_p, the token that crosses top_p included.
    With both active the shorter prefix wins, i.e. the intersection of the two sets.
  * the token is drawn by inverting the CDF of softmax(s) restricted to the kept set,
    walked in token-id order, at one uniform u in [0, 1): the first kept id whose
    running mass exceeds u * total. u comes from Philox keyed by (seed, step)
    (kernels/philox.py), so it depends on nothing else. The reference sums in fp64;
    the Triton kernel sums in fp32 (over fixed-size chunks of V, or over a short kept
    set in id order), so the two can pick neighbouring tokens when u lies within
    rounding (~1e-6 of the total mass) of a step of the CDF. If rounding leaves the
    target unreached, the last kept token with mass is drawn; a row whose kept scores
    are all -inf draws token 0.
"""
from __future__ import annotations

import torch

from kernels import philox, sampling_triton
from kernels.mode import get_mode, use_triton


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] any float dtype -> fp32 [B, V]."""
    _check_logits(logits)
    if use_triton(logits):
        return sampling_triton.log_softmax(logits)
    return torch.log_softmax(logits.float(), dim=-1)


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> fp32 [B]."""
    _check_logits(logits)
    if use_triton(logits):
        return sampling_triton.logsumexp(logits)
    return torch.logsumexp(logits.float(), dim=-1)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> int64 [B]; ties go to the lowest token id."""
    _check_logits(logits)
    if use_triton(logits):
        return sampling_triton.argmax(logits)
    if get_mode() == "standard":
        return torch.argmax(logits, dim=-1)
    return argmax_torch(logits.float())


def sample(logits, seeds, steps, temperature, top_k, top_p, filtered: bool | None = None) -> torch.Tensor:
    """One token per row; row i depends only on (logits[i], seeds[i], steps[i], its params).

    logits [B, V] fp32/bf16; seeds, steps int64 [B]; temperature fp32 [B];
    top_k int32 [B] (0 = off); top_p fp32 [B] (1.0 = off). Returns int64 [B].
    filtered: whether any row filters (row_filters), when the caller knows it on the
    host; None finds out with one device sync. Both the invariant kernels and standard mode's
    sampler run the top-k / top-p machinery only when it is true, and trust it: a row that
    filters in a batch passed filtered=False is drawn unfiltered. The token never depends on
    it otherwise.
    """
    _check_logits(logits)
    batch = logits.shape[0]
    for name, t in (("seeds", seeds), ("steps", steps), ("temperature", temperature),
                    ("top_k", top_k), ("top_p", top_p)):
        if t.shape != (batch,):
            raise ValueError(f"{name} must have shape ({batch},), got {tuple(t.shape)}")
    if filtered is None and (use_triton(logits) or get_mode() == "standard"):
        filtered = bool(row_filters(temperature, top_k, top_p, logits.shape[-1]).any())
    if use_triton(logits):
        return sampling_triton.sample(logits, seeds, steps, temperature, top_k, top_p, filtered)
    if get_mode() == "standard":
        return sample_standard(logits, temperature, top_k, top_p, filtered)
    return sample_reference(logits, seeds, steps, temperature, top_k, top_p)


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a 2-D float tensor [B, V], got {tuple(logits.shape)} {logits.dtype}")


def row_filters(temperature, top_k, top_p, vocab: int) -> torch.Tensor:
    """The sampled rows that top-k (in [1, vocab)) or top-p (< 1) cuts: bool [B] for tensors,
    a bool for one row's plain numbers (what a caller knows on the host)."""
    return (temperature > 0) & (((top_k > 0) & (top_k < vocab)) | (top_p < 1.0))


def argmax_reference(x: torch.Tensor) -> torch.Tensor:
    # Spelled out rather than torch.argmax so the lowest-id tie rule is explicit on every device.
    ids = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    best = x.max(dim=-1, keepdim=True).values
    return torch.where(x == best, ids, x.shape[-1]).min(dim=-1).values


def argmax_torch(x: torch.Tensor) -> torch.Tensor:
    """argmax_reference's answer at torch.argmax's speed (a third of the time, on a CPU row of
    49k): torch.argmax too takes the lowest id among equal maxima (documented), but it ranks NaN
    above every number, where the reference answers V for a row that holds one."""
    ids = torch.argmax(x, dim=-1)
    return torch.where(x.gather(-1, ids.unsqueeze(-1)).squeeze(-1).isnan(), x.shape[-1], ids)


def keep_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Bool [B, V]: the shortest prefix of the (value desc, id asc) ranking meeting top-k / top-p."""
    vocab = scaled.shape[-1]
    # A stable descending sort leaves equal values in ascending id order.
    values, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    weights = torch.exp(values - values[:, :1])
    # mass strictly before each rank
    before = torch.cat([torch.zeros_like(weights[:, :1]), torch.cumsum(weights, dim=-1)[:, :-1]], dim=-1)
    rank = torch.arange(vocab, device=scaled.device).expand_as(values)
    k = top_k.to(torch.int64).view(-1, 1)
    p = top_p.to(torch.float32).view(-1, 1)
    k_on = (k > 0) & (k < vocab)
    p_on = p < 1.0
    stop = (rank >= 1) & ((k_on & (rank >= k)) | (p_on & (before >= p * weights.sum(dim=-1, keepdim=True))))
    return torch.zeros_like(stop).scatter(-1, order, ~stop)


def reciprocal_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """fp32 1 / temperature (IEEE division), 1 for greedy rows: one division per row, not per token."""
    t = temperature.float()
    return torch.where(t > 0, 1.0 / torch.where(t > 0, t, 1.0), 1.0)


def scale(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """fp32 logits * (1 / temperature), greedy rows unscaled, -0.0 folded into +0.0."""
    scaled = logits.float() * reciprocal_temperature(temperature).view(-1, 1)
    return torch.where(scaled == 0, 0.0, scaled)


def kept_cdf(scaled: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """fp64 [B, V]: running softmax mass of the kept tokens in token-id order, normalized to end at 1."""
    kept = torch.where(keep, scaled.double(), float("-inf"))
    top = kept.max(dim=-1, keepdim=True).values
    weights = torch.exp(kept - torch.where(top == float("-inf"), 0.0, top))
    running = weights.cumsum(dim=-1)
    return running / running[:, -1:].clamp_min(torch.finfo(torch.float64).tiny)


def sample_reference(logits, seeds, steps, temperature, top_k, top_p) -> torch.Tensor:
    vocab = logits.shape[-1]
    # The CPU backend decodes through here one row at a time: a greedy row needs only the
    # argmax, and a row that filters nothing no ranking (a sort of the whole vocabulary).
    if bool((temperature <= 0).all()):
        return argmax_torch(logits.float())
    scaled = scale(logits, temperature)
    if bool(row_filters(temperature, top_k, top_p, vocab).any()):
        keep = keep_mask(scaled, top_k, top_p)
    else:
        keep = torch.ones_like(scaled, dtype=torch.bool)
    cdf = kept_cdf(scaled, keep)
    u = philox.row_uniform_reference(seeds, steps).to(device=cdf.device, dtype=torch.float64).view(-1, 1)
    drawn = (cdf <= u).sum(dim=-1)
    ids = torch.arange(vocab, device=cdf.device).expand_as(cdf)
    has_mass = torch.cat([cdf[:, :1] > 0, cdf[:, 1:] > cdf[:, :-1]], dim=-1)
    last = torch.where(has_mass, ids, 0).max(dim=-1).values
    drawn = torch.where(drawn < vocab, drawn, last)
    return torch.where(temperature.to(cdf.device) <= 0, argmax_torch(logits.float()), drawn)


def sample_standard(logits, temperature, top_k, top_p, filtered: bool) -> torch.Tensor:
    """The stock torch sampler: softmax + multinomial from the global generator, no per-row seed.
    Like the stock engines it sorts only when some row filters, which the caller knows (sample)."""
    greedy = temperature <= 0
    scaled = scale(logits, temperature)
    if filtered:
        scaled = torch.where(keep_mask(scaled, top_k, top_p), scaled, float("-inf"))
    drawn = torch.multinomial(torch.softmax(scaled, dim=-1), 1).view(-1)
    return torch.where(greedy, torch.argmax(logits, dim=-1), drawn)
