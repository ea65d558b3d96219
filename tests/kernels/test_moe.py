import random

import pytest
import torch

from kernels import moe
from kernels.mode import mode

# Under the interpreter: small sizes, fp16 for bits (its fp32 dot is a BLAS call that rounds by a
# row's place in the block; its bf16 dot is wrong), fp32 too for correctness. On a GPU: Qwen3-30B-A3B's
# experts (H 2048, I 768, 128 experts, top 8) in bf16.
if torch.cuda.is_available():
    H, I, E, K = 2048, 768, 128, 8
    DTYPES = (torch.bfloat16,)
    BIT_DTYPE = torch.bfloat16
    BATCH_SIZES = (1, 2, 3, 4, 5, 8, 16, 31, 32, 33, 64, 100, 256, 511, 1024, 2048, 4096)
    TRIALS = 16
else:
    # H and I end inside a BLOCK_K step: the masked K tail runs.
    H, I, E, K = 96, 80, 8, 2
    DTYPES = (torch.float16, torch.float32)
    BIT_DTYPE = torch.float16
    BATCH_SIZES = (1, 2, 3, 5, 17, 24)   # to 32 slots a block per slot, more are sorted
    TRIALS = 4



REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def rel_err(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def expert_weights(randn, dtype):
    # Scaled so that SiLU·up and the products stay in range at any H.
    return randn(E, 2 * I, H, dtype=dtype) * H ** -0.5, randn(E, H, I, dtype=dtype) * I ** -0.5


def routed(randn, t, dtype):
    x = randn(t, H, dtype=dtype)
    weights, ids = moe.route(randn(t, E, dtype=dtype), K, True)
    return x, weights, ids


def test_route_picks_the_top_k_ties_to_the_lowest_id(device):
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, -1.0, 2.0, 0.5, 0.0],
                           [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0],
                           [-5.0, 0.0, 0.0, 1.0, -5.0, 1.0, -5.0, 0.0]], device=device)
    weights, ids = moe.route(logits, 3, normalize=True)
    assert ids.tolist() == [[1, 3, 5], [0, 1, 2], [3, 5, 1]]
    assert torch.allclose(weights[:2].cpu(), torch.full((2, 3), 1 / 3))
    # Unnormalised: the softmax's own probabilities.
    raw, _ = moe.route(logits, 3, normalize=False)
    assert torch.allclose(raw.cpu(), logits.softmax(-1).gather(1, ids.long()).cpu())


@pytest.mark.parametrize("normalize", (True, False))
def test_route_matches_the_reference(normalize, randn):
    logits = randn(37, E, dtype=torch.float16)
    weights, ids = moe.route(logits, K, normalize)
    ref_w, ref_ids = moe.route_reference(logits, K, normalize)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(weights, ref_w, rtol=1e-6, atol=0)


def test_route_rows_do_not_depend_on_the_batch(randn, gen):
    rng = random.Random(gen.initial_seed())
    row = randn(1, E, dtype=BIT_DTYPE)
    alone = moe.route(row, K, True)
    for _ in range(TRIALS):
        m = rng.choice(BATCH_SIZES)
        pos = rng.randrange(m)
        batch = randn(m, E, dtype=BIT_DTYPE)
        batch[pos] = row[0]
        weights, ids = moe.route(batch, K, True)
        assert torch.equal(weights[pos], alone[0][0]) and torch.equal(ids[pos], alone[1][0]), (m, pos)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", (BATCH_SIZES[0], BATCH_SIZES[-1]))
def test_experts_match_the_reference(t, dtype, randn):
    x, weights, ids = routed(randn, t, dtype)
    gate_up, down = expert_weights(randn, dtype)
    out = moe.experts(x, weights, ids, gate_up, down)
    ref = moe.experts_reference(x.double(), weights.double(), ids, gate_up.double(), down.double())
    assert out.dtype == dtype and out.shape == (t, H)
    assert rel_err(out, ref) < REL_TOL[dtype]


def test_the_standard_path_agrees(randn):
    x, weights, ids = routed(randn, 9, DTYPES[0])
    gate_up, down = expert_weights(randn, DTYPES[0])
    ref = moe.experts_reference(x.double(), weights.double(), ids, gate_up.double(), down.double())
    with mode("standard"):
        out = moe.experts(x, weights, ids, gate_up, down)
    assert rel_err(out, ref) < REL_TOL[DTYPES[0]]


def test_a_tokens_bits_do_not_depend_on_the_batch(randn, gen):
    """A token alone, and among others at a random place, many choosing its experts too, in a
    decode-size batch (a block per slot) or a prefill-size one (sorted blocks): the same bits."""
    rng = random.Random(gen.initial_seed())
    gate_up, down = expert_weights(randn, BIT_DTYPE)
    x, weights, ids = routed(randn, 1, BIT_DTYPE)
    alone = moe.experts(x, weights, ids, gate_up, down)
    for _ in range(TRIALS):
        m = rng.choice(BATCH_SIZES)
        pos = rng.randrange(m)
        bx, bw, bids = routed(randn, m, BIT_DTYPE)
        crowd = torch.rand(m, generator=gen) < 0.5   # these share the token's experts
        bids[crowd.to(bids.device)] = ids[0]
        bx[pos], bw[pos], bids[pos] = x[0], weights[0], ids[0]
        assert torch.equal(moe.experts(bx, bw, bids, gate_up, down)[pos], alone[0]), (m, pos)


@pytest.mark.parametrize("layout", ("slot", "sorted"))
def test_every_tile_config_gives_the_same_bits(layout, randn, gpu):
    # The dispatch picks a layout and a tile per size: only allowed because all of them sum a
    # row identically on the GPU's MMA instructions (mma.sync at 16 rows, wgmma at 64).
    x, weights, ids = routed(randn, 24, BIT_DTYPE)
    gate_up, down = expert_weights(randn, BIT_DTYPE)
    first = moe._experts_triton(x, weights, ids, gate_up, down, ("slot", moe.CONFIGS["slot"]))
    for config in moe.CONFIGS.values():
        for block_n in (32, 64, 128):
            tile = (config[0], block_n, *config[2:])
            out = moe._experts_triton(x, weights, ids, gate_up, down, (layout, tile))
            assert torch.equal(out, first), (layout, tile)


@pytest.mark.parametrize("t", (3, 40))
def test_sorted_blocks_hold_every_slot_once(t, randn, device):
    _, _, ids = routed(randn, t, torch.float32)
    block_m = 16
    rows, experts = moe._align(ids, E, block_m)
    flat = ids.reshape(-1).cpu()
    rows, experts = rows.cpu().view(-1, block_m), experts.cpu()
    seen = []
    for block, expert in zip(rows, experts.tolist()):
        slots = [s for s in block.tolist() if s < flat.numel()]
        if expert < 0:
            assert not slots
            continue
        assert slots and all(flat[s] == expert for s in slots)
        seen += slots
    assert sorted(seen) == list(range(flat.numel()))
    assert experts.tolist() == sorted(experts.tolist(), key=lambda e: (e < 0, e))   # in expert order, unused last
