"""Token masks (constrained decoding) before the sampler: a masked row draws only allowed
tokens, and its token does not depend on the batch around it (masked and free rows mixed)."""
from __future__ import annotations

import torch

from kernels import apply_min_p, apply_repetition_penalty, apply_token_mask, sampling
from test_sampling import _params, _rows, _tied_logits


def _bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, V] -> int32 words [B, ceil(V / 32)], bit t % 32 of word t // 32 for token t."""
    batch, vocab = allowed.shape
    padded = torch.zeros(batch, -(-vocab // 32) * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    words = (padded.view(batch, -1, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def test_mask_sets_exactly_the_disallowed_tokens_to_minus_inf(gen, device):
    logits = torch.randn(3, 70, generator=gen).to(device)
    allowed = torch.rand(3, 70, generator=gen) < 0.3
    allowed[:, 31] = allowed[:, 63] = True   # the sign bit of a word
    out = apply_token_mask(logits, _bitmask(allowed).to(device))
    assert torch.equal(out.isinf().cpu(), ~allowed)
    assert torch.equal(out.cpu()[allowed], logits.cpu()[allowed])


def test_masked_rows_draw_allowed_tokens_and_do_not_depend_on_the_batch(gen, device):
    vocab = 100   # small: off a GPU the Triton sampler runs interpreted
    for batch in (4,):
        x = _tied_logits(gen, batch, vocab, device)
        args = _params(gen, batch, device, greedy_every=3)
        allowed = torch.rand(batch, vocab, generator=gen) < 0.1
        allowed[::2] = True   # free rows: every token allowed
        allowed[:, 0] = True  # never empty
        masks = _bitmask(allowed).to(device)

        def run(rows):
            return sampling.sample(apply_token_mask(x[rows], masks[rows]), *_rows(args, rows), filtered=True)

        order = torch.randperm(batch, generator=gen).to(device)
        together = run(order)
        for position, row in enumerate(order.tolist()):
            alone = run(torch.tensor([row], device=device))
            assert torch.equal(together[position], alone[0])
            assert allowed[row, int(alone[0])]


def test_min_p_keeps_the_tokens_within_its_ratio_of_the_likeliest_row_by_row(gen, device):
    logits = _tied_logits(gen, 5, 64, device)
    min_p = torch.tensor([0.0, 0.1, 0.5, 1.0, 0.3], device=device)
    temperature = torch.tensor([1.0, 0.7, 1.0, 1.3, 0.0], device=device)
    out = apply_min_p(logits, min_p, temperature)
    probs = torch.softmax(logits.float() / temperature.clamp_min(1e-6).unsqueeze(-1), dim=-1)
    kept = probs >= min_p.unsqueeze(-1) * probs.amax(-1, keepdim=True) * (1 - 1e-6)
    for row in (1, 2, 3):
        assert torch.equal(~out[row].isinf(), kept[row])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[4], logits[4])   # off, and greedy
    assert torch.equal(out[3].isinf(), logits[3] < logits[3].max())   # min_p 1: the likeliest alone
    for row in range(5):   # a row alone gives its bits in the batch
        assert torch.equal(apply_min_p(logits[row:row + 1], min_p[row:row + 1], temperature[row:row + 1])[0], out[row])


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits(gen, device):
    logits = torch.randn(4, 70, generator=gen).to(device=device, dtype=torch.bfloat16)
    seen = torch.rand(4, 70, generator=gen) < 0.3
    seen[:, 31] = True   # the sign bit of a word
    penalty = torch.tensor([1.0, 1.3, 2.0, 0.8], device=device)
    out = apply_repetition_penalty(logits, _bitmask(seen).to(device), penalty)
    assert out.dtype == logits.dtype and torch.equal(out[0], logits[0])   # 1: off, exactly
    x = logits.float().cpu()
    for row in range(1, 4):
        p = float(penalty[row])
        expected = [(v / p if v > 0 else v * p) if s else v for v, s in zip(x[row].tolist(), seen[row].tolist())]
        assert torch.equal(out[row].cpu(), torch.tensor(expected).to(logits.dtype))
        alone = apply_repetition_penalty(logits[row:row + 1], _bitmask(seen[row:row + 1]).to(device), penalty[row:row + 1])
        assert torch.equal(alone[0], out[row])
