"""Token masks (constrained decoding) before the sampler: a masked row draws only allowed
tokens, and its token does not depend on the batch around it (masked and free rows mixed)."""
from __future__ import annotations

import torch

from kernels import apply_token_mask, sampling
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
