"""Sampling reductions: bits, invariance, tie rules, accuracy and distributions.

Without CUDA the Triton kernels run under TRITON_INTERPRET=1 at small V (a few
milliseconds per program, so thousands of draws are out of reach there): the
distribution checks then run on the torch reference, and the kernel is shown to
invert the same CDF at the same u (to rounding) and to keep exactly the same set.
With CUDA the same tests run on the GPU and the `gpu` ones add the real
vocabulary, V = 152064 (Qwen2/3), in bf16 and fp32.
"""
import pytest
import torch

from kernels import device as device_module
from kernels import mode, philox, sampling, sampling_candidates, sampling_filter, sampling_triton

QWEN_VOCAB = 152064
SHIPPED_CAP = sampling_candidates._CAP


@pytest.fixture(autouse=True)
def small_splits(monkeypatch):
    """Under the interpreter, shrink the chunk size so that a small V still spans several chunks and
    programs, take the radix select's digits 8 bits at a time (4 rounds: half the launches) with
    programs that each loop over several listed rows, and cap the candidate lists at 64 so that
    rows take both top-k / top-p paths and both settles; the histogram keeps a shallowest bucket per
    16 tokens, so that gather programs read some tiles of a row, several rounds each."""
    if not torch.cuda.is_available():
        for name, value in {"_BLOCK": 128, "_CHUNKS": 2}.items():
            monkeypatch.setattr(sampling_triton, name, value)
        monkeypatch.setattr(sampling_filter, "_BITS", 8)
        monkeypatch.setattr(sampling_filter, "_LISTED", 5)
        monkeypatch.setattr(sampling_filter, "_ROWS", 3)
        monkeypatch.setattr(sampling_candidates, "_CAP", 64)
        monkeypatch.setattr(sampling_candidates, "_SMALL", 16)
        monkeypatch.setattr(sampling_candidates, "_TILE", 16)


def _params(gen, n, device, greedy_every=5):
    """Mixed per-row sampling parameters: some greedy rows, some top-k, some top-p, some both."""
    temperature = torch.rand(n, generator=gen) * 1.5 + 0.05
    temperature[::greedy_every] = 0.0
    top_k = torch.randint(1, 40, (n,), generator=gen, dtype=torch.int32)
    top_k[::3] = 0
    top_p = torch.rand(n, generator=gen) * 0.95 + 0.02
    top_p[::2] = 1.0
    seeds = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)
    steps = torch.randint(0, 2**40, (n,), generator=gen)
    return [t.to(device) for t in (seeds, steps, temperature, top_k, top_p)]


def _tied_logits(gen, n, vocab, device, dtype=torch.float32):
    # Rounding to halves makes many exact ties, including at the top-k / top-p boundary.
    x = (torch.randn(n, vocab, generator=gen) * 3).mul(2).round().div(2)
    return x.to(device=device, dtype=dtype)


def _rows(args, rows):
    return [a[rows] for a in args]


# ---------------------------------------------------------------- generator


def test_philox_reference_matches_random123_known_answers():
    vectors = [  # (counter, key) -> output, from Random123's kat_vectors for philox4x32_10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for counter, key, expected in vectors:
        words = philox.philox4x32_reference(*(torch.tensor([v]) for v in counter + key))
        assert tuple(w.item() for w in words) == expected


def test_triton_uniforms_equal_reference(gen, device):
    seeds = torch.cat([torch.tensor([0, -1, 2**32, 2**63 - 1]), torch.randint(-2**63, 2**63 - 1, (4,), generator=gen)])
    steps = torch.cat([torch.tensor([0, 2**32 + 5, 1, 2**62]), torch.randint(0, 2**40, (4,), generator=gen)])
    got = sampling_triton.row_uniforms(seeds.to(device), steps.to(device))
    assert torch.equal(got.cpu(), philox.row_uniform_reference(seeds, steps))
    assert philox.row_bits_reference(seeds[:1], steps[:1]).item() == 0x6627E8D5  # seed 0, step 0: Random123's word 0
    assert got[0].item() == (0x6627E8D5 >> 8) / 2**24
    assert 0.0 <= float(got.min()) and float(got.max()) < 1.0


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 37, 4096 + 129])
def test_logsumexp_and_log_softmax_match_fp64(randn, dtype, vocab):
    x = randn(3, vocab, dtype=dtype) * 4
    x[1, ::3] = float("-inf")
    exact = torch.log_softmax(x.double(), dim=-1)
    got = sampling.log_softmax(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    finite = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(got), finite)
    assert torch.allclose(got[finite].double(), exact[finite], atol=1e-5, rtol=1e-5)
    lse = sampling.logsumexp(x)
    assert lse.dtype == torch.float32 and lse.shape == (3,)
    assert torch.allclose(lse.double(), torch.logsumexp(x.double(), dim=-1), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("lag", [1, 3, 32])
def test_one_launch_log_softmax_gives_the_two_launch_bits(randn, monkeypatch, lag):
    """Large batches take one launch whose writers wait on their row's partials; here it is
    forced at a small size, with writers trailing their row by `lag` rows (1: the next step)."""
    x = randn(9, 5 * 4096 + 300) * 4  # 6 chunks: 3 partial programs and 3 writers per row
    x[2, ::5] = float("-inf")
    two = sampling_triton.log_softmax(x)
    monkeypatch.setattr(sampling_triton, "_ONE_LAUNCH_BYTES", 0)
    monkeypatch.setattr(sampling_triton, "_LAG", {4: lag})
    one = sampling_triton.log_softmax(x)
    assert torch.equal(one, two)
    exact = torch.log_softmax(x.double(), dim=-1)
    finite = torch.isfinite(exact)
    assert torch.allclose(one[finite].double(), exact[finite], atol=1e-5, rtol=1e-5)


def test_argmax_breaks_ties_by_lowest_id(device):
    vocab = 2 * 4096 + 77  # several splits and chunks: ties inside one, across them, in the same lane
    x = torch.zeros(5, vocab, device=device)
    x[0, [4100, 4, 9]] = 7.0
    x[1, [8200, 8193]] = 3.0
    x[2] = -1.0  # every token ties
    x[3, [vocab - 1]] = 1.0
    x[4] = float("-inf")
    assert sampling.argmax(x).tolist() == [4, 8193, 0, vocab - 1, 0]


def test_cpu_argmax_gives_the_reference_answer(gen):
    """The CPU backend's greedy path (torch.argmax) answers as the spelled-out reference does on
    ties (of +0.0 and -0.0 too), infinities and rows that hold NaN, at a real vocabulary."""
    x = _tied_logits(gen, 9, 49152, "cpu")
    x[0, [7, 40000]] = 99.0
    x[1, [3, 5]] = float("nan")
    x[2, -1] = float("nan")
    x[3] = float("-inf")
    x[4, [11, 30000]] = float("inf")
    x[5] = -1.0
    x[5, [6, 2]] = torch.tensor([0.0, -0.0])
    x[6] = 0.0
    x[6, 4] = -0.0
    x[7] = float("nan")
    assert torch.equal(sampling.argmax_torch(x), sampling.argmax_reference(x))
    assert sampling.argmax_torch(x)[:8].tolist() == [7, 49152, 49152, 0, 11, 2, 0, 49152]


def test_argmax_matches_reference_on_bf16(gen, device):
    x = _tied_logits(gen, 16, 5000, device, torch.bfloat16)
    got = sampling.argmax(x)
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), sampling.argmax_reference(x.float().cpu()))


# ---------------------------------------------------------------- sampler semantics


def test_greedy_is_argmax_whatever_top_k_top_p(gen, device):
    x = _tied_logits(gen, 12, 300, device)
    seeds, steps, _, top_k, top_p = _params(gen, 12, device)
    temperature = torch.zeros(12, device=device)
    assert torch.equal(sampling.sample(x, seeds, steps, temperature, top_k, top_p), sampling.argmax(x))


def _order_keys(s: torch.Tensor) -> torch.Tensor:
    bits = s.contiguous().view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _assert_inverts_the_cdf(x, args, drawn, tol):
    """Each sampled row's token holds u in its step of the fp64 kept-set CDF, to within tol;
    greedy rows are the argmax. Returns how many rows differ from sample_reference."""
    x, args, drawn = x.cpu(), [a.cpu() for a in args], drawn.cpu()
    seeds, steps, temperature, top_k, top_p = args
    scaled = sampling.scale(x, temperature)
    keep = sampling.keep_mask(scaled, top_k, top_p)
    cdf = sampling.kept_cdf(scaled, keep)
    u = philox.row_uniform_reference(seeds, steps).double()
    rows = torch.arange(x.shape[0])
    sampled = temperature > 0
    assert torch.equal(drawn[~sampled], sampling.argmax_reference(x.float())[~sampled])
    assert keep[rows, drawn][sampled].all()
    upper = cdf[rows, drawn]
    lower = torch.where(drawn > 0, cdf[rows, (drawn - 1).clamp_min(0)], 0.0)
    assert (upper > lower)[sampled].all()  # the token carries mass
    assert (lower <= u + tol)[sampled].all() and (u < upper + tol)[sampled].all()
    return int((drawn != sampling.sample_reference(x, *args)).sum())


def test_sampler_inverts_the_kept_cdf(gen, device):
    x = _tied_logits(gen, 16, 300, device)
    x[1, ::3] = float("-inf")  # tokens without mass are never drawn
    args = _params(gen, 16, device)
    assert _assert_inverts_the_cdf(x, args, sampling.sample(x, *args), tol=1e-5) == 0


def _assert_keeps_the_reference_set(x, temperature, top_k, top_p):
    threshold, cut, settled = sampling_triton.kept_bounds(x, temperature, top_k, top_p).cpu().unbind(-1)
    scaled = sampling.scale(x.cpu(), temperature.cpu())
    keys, ids = _order_keys(scaled), torch.arange(x.shape[1])
    kept = (keys > threshold.view(-1, 1)) | ((keys == threshold.view(-1, 1)) & (ids <= cut.view(-1, 1)))
    want = sampling.keep_mask(scaled, top_k.cpu(), top_p.cpu())
    sampled = temperature.cpu() > 0
    assert torch.equal(kept[sampled], want[sampled])
    assert (threshold[~sampled] == -2**31).all() and (cut[~sampled] == x.shape[1]).all()
    return keys == threshold.view(-1, 1), kept, sampled, settled.bool()


def test_kernel_keeps_exactly_the_reference_set(gen, device):
    x = _tied_logits(gen, 24, 300, device)
    _, _, temperature, top_k, top_p = _params(gen, 24, device)
    # top-k reaching into a -inf tail: past what any candidate list holds, whatever its cap
    x[1, 20:] = float("-inf")
    top_k[1], top_p[1], temperature[1] = 250, 1.0, 1.0
    boundary, kept, sampled, settled = _assert_keeps_the_reference_set(x, temperature, top_k, top_p)
    filtering = sampling.row_filters(temperature, top_k, top_p, x.shape[1]).cpu()
    # the inputs do put ties on the boundary: some rows keep only part of them
    assert (boundary & ~kept).any(dim=-1)[filtering].any()
    # and both paths ran: short candidate lists settle rows, the radix select takes the rest
    assert settled[filtering].any() and not settled[filtering].all() and not settled[~filtering].any()


@pytest.mark.parametrize("cap", [SHIPPED_CAP, 16])
def test_kept_set_edge_cases(device, monkeypatch, cap):
    """Every token tied, top_p 0 (one token), top-k at and past V, -inf tails, a row of one
    finite token; at the shipped digit width, also under the interpreter, with candidate lists
    of the shipped length (most rows settle there) and of 16 (most go to the radix select)."""
    monkeypatch.setattr(sampling_filter, "_BITS", 4)
    monkeypatch.setattr(sampling_candidates, "_CAP", cap)
    vocab = 300
    x = torch.zeros(6, vocab)
    x[1, 7::5] = 2.0
    x[2, 50:] = float("-inf")
    x[3, :] = torch.arange(vocab) % 3 - 1.0
    x[4, 1:] = float("-inf")
    x[5, 100:103] = 1.0
    temperature = torch.ones(6)
    top_k = torch.tensor([150, 0, 60, 299, 5, 300], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.0, 0.5, 0.999, 0.3, 0.9])
    _assert_keeps_the_reference_set(x.to(device), temperature.to(device), top_k.to(device), top_p.to(device))


def test_sorted_and_searched_settles_agree(gen, device, monkeypatch):
    """Short lists are settled by sorting, long ones by search; both sum integers, so every
    list gives one answer whichever way it goes."""
    x = _tied_logits(gen, 16, 300, device)
    args = _params(gen, 16, device, greedy_every=16)
    args[3][::4] = 0  # some top-p lists run long
    runs = []
    cap = min(sampling_candidates._CAP, 256)  # (a sort as wide as the shipped cap takes minutes to compile)
    monkeypatch.setattr(sampling_candidates, "_CAP", cap)
    for small in (cap, 2):  # every list sorted, then (nearly) every one searched
        monkeypatch.setattr(sampling_candidates, "_SMALL", small)
        runs.append((sampling_triton.kept_bounds(x, *args[2:]), sampling.sample(x, *args, filtered=True)))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert runs[0][0][:, 2].sum() >= 8  # most rows were settled by the list


def test_keep_mask_semantics_are_the_documented_prefix():
    # softmax mass 0.5, 0.2, 0.2, 0.1 (tokens 1 and 2 tie).
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1]] * 5))
    top_k = torch.tensor([0, 0, 2, 1, 3], dtype=torch.int32)
    top_p = torch.tensor([0.6, 0.65, 1.0, 0.99, 0.75])
    mask = sampling.keep_mask(logits, top_k, top_p)
    assert mask.tolist() == [
        [True, True, False, False],   # 0.5 < 0.6: the crossing token 1 is in, its tie 2 (higher id) is not
        [True, True, False, False],   # likewise for any p in (0.5, 0.7]
        [True, True, False, False],   # top-k 2 takes the lower id of the tie
        [True, False, False, False],  # top-k 1 is shorter than top-p 0.99
        [True, True, True, False],    # top-p 0.75 needs three tokens, top-k allows three
    ]


def test_sampler_only_draws_from_the_kept_set(device):
    vocab = 6
    logits = torch.log(torch.tensor([0.05, 0.3, 0.3, 0.25, 0.05, 0.05])).expand(24, vocab).contiguous().to(device)
    n = logits.shape[0]
    seeds = torch.arange(n, device=device)
    steps = torch.zeros(n, dtype=torch.int64, device=device)
    temperature = torch.ones(n, device=device)
    top_k = torch.where(torch.arange(n, device=device) < n // 2, 2, 0).to(torch.int32)
    top_p = torch.where(torch.arange(n, device=device) < n // 2, 1.0, 0.7)
    drawn = sampling.sample(logits, seeds, steps, temperature, top_k, top_p)
    assert set(drawn[: n // 2].tolist()) == {1, 2}
    assert set(drawn[n // 2:].tolist()) == {1, 2, 3}  # 0.3 + 0.3 < 0.7 <= 0.3 + 0.3 + 0.25


# ---------------------------------------------------------------- invariance


@pytest.mark.parametrize("op", ["log_softmax", "logsumexp", "argmax", "sample"])
def test_row_bits_do_not_depend_on_batch(gen, device, op):
    vocab = 1024 + 300 if op != "sample" else 300
    for _ in range(3):
        batch = int(torch.randint(2, 9, (1,), generator=gen))
        x = _tied_logits(gen, batch, vocab, device)
        args = _params(gen, batch, device, greedy_every=4)
        run = {
            "log_softmax": lambda rows, **_: sampling.log_softmax(x[rows]),
            "logsumexp": lambda rows, **_: sampling.logsumexp(x[rows]),
            "argmax": lambda rows, **_: sampling.argmax(x[rows]),
            "sample": lambda rows, **hint: sampling.sample(x[rows], *_rows(args, rows), **hint),
        }[op]
        # The host-side hint (filtered=True: some row may filter) changes no bits either.
        hint = {"filtered": True} if op == "sample" else {}
        together = run(torch.randperm(batch, generator=gen).to(device), **hint)
        order = torch.randperm(batch, generator=gen).to(device)
        shuffled = run(order)
        for position, row in enumerate(order.tolist()):
            alone = run(torch.tensor([row], device=device))
            assert torch.equal(shuffled[position], alone[0])
        assert sorted(together.flatten().tolist()) == sorted(shuffled.flatten().tolist())


# ---------------------------------------------------------------- replay and statistics


def test_same_seed_and_step_replay_and_steps_differ(device):
    vocab = 64
    logits = torch.zeros(32, vocab, device=device)  # uniform: every token equally likely
    seeds = torch.full((32,), 1234, device=device)
    steps = torch.arange(32, device=device)
    params = (torch.ones(32, device=device), torch.zeros(32, dtype=torch.int32, device=device),
              torch.ones(32, device=device))
    first = sampling.sample(logits, seeds, steps, *params)
    assert torch.equal(first, sampling.sample(logits, seeds, steps, *params, filtered=False))
    assert len(set(first.tolist())) > 16  # 32 draws from 64 tokens: a stuck stream would repeat


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _draw(logits_row, n, temperature, top_k, top_p, step=0):
    """n draws for one distribution, one per seed: on the GPU through the Triton kernel, else the reference."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logits = logits_row.to(device).expand(n, -1).contiguous()
    args = (torch.arange(n, device=device) * 7919 + 11, torch.full((n,), step, device=device),
            torch.full((n,), temperature, device=device), torch.full((n,), top_k, dtype=torch.int32, device=device),
            torch.full((n,), top_p, device=device))
    if device == "cpu":
        return sampling.sample_reference(logits, *args)
    with mode("invariant"):
        return sampling.sample(logits, *args).cpu()


# chi-square critical values at p = 0.001 for the degrees of freedom used below
_CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88}


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.7, 0, 1.0),
                                                     (1.0, 4, 1.0), (0.9, 0, 0.8), (1.2, 6, 0.9)])
def test_draws_follow_the_filtered_softmax(temperature, top_k, top_p):
    logits = torch.tensor([1.2, -0.3, 0.4, 2.0, 0.0, -1.1, 0.9, 0.5, -0.6, 1.5])
    n = 20000
    counts = torch.bincount(_draw(logits, n, temperature, top_k, top_p), minlength=10).double()
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    keep = sampling.keep_mask((logits / temperature).view(1, -1), torch.tensor([top_k]), torch.tensor([top_p]))[0]
    probs = torch.where(keep, probs, 0.0)
    probs /= probs.sum()
    assert counts[~keep].sum() == 0
    assert _chi_square(counts[keep], probs[keep]) < _CHI2_999[int(keep.sum()) - 1]


def test_consecutive_steps_are_independent():
    logits = torch.zeros(4)
    n = 20000
    a = _draw(logits, n, 1.0, 0, 1.0, step=0)
    b = _draw(logits, n, 1.0, 0, 1.0, step=1)
    table = torch.bincount(a * 4 + b, minlength=16).double().view(4, 4)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / n
    assert float(((table - expected) ** 2 / expected).sum()) < _CHI2_999[9]


# ---------------------------------------------------------------- modes and errors


def test_standard_mode_is_the_stock_torch_sampler(gen, device):
    x = _tied_logits(gen, 8, 100, device)
    args = _params(gen, 8, device, greedy_every=2)
    with mode("standard"):
        drawn = sampling.sample(x, *args)
        assert torch.equal(sampling.argmax(x), torch.argmax(x, dim=-1))
        assert torch.equal(sampling.log_softmax(x), torch.log_softmax(x, dim=-1))
    keep = sampling.keep_mask(sampling.scale(x, args[2]), args[3], args[4])
    assert keep.gather(1, drawn.view(-1, 1)).all()
    greedy = args[2] == 0
    assert torch.equal(drawn[greedy], torch.argmax(x, dim=-1)[greedy])


def test_standard_mode_takes_filtered_from_the_caller(gen, device, monkeypatch):
    # The engine knows from the requests whether any row filters: asked of the tensors instead,
    # the answer would wait for the GPU, and the host could not queue the next step meanwhile.
    x = _tied_logits(gen, 8, 100, device)
    args = _params(gen, 8, device, greedy_every=2)
    filtered = bool(sampling.row_filters(*args[2:], x.shape[-1]).any())
    monkeypatch.setattr(sampling, "row_filters", lambda *a: pytest.fail("asked the tensors"))
    with mode("standard"):
        drawn = sampling.sample(x, *args, filtered=filtered)
    keep = sampling.keep_mask(sampling.scale(x, args[2]), args[3], args[4])
    assert keep.gather(1, drawn.view(-1, 1)).all()


def test_bad_shapes_are_rejected(device):
    x = torch.zeros(2, 10, device=device)
    ones = torch.ones(2, device=device)
    ints = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="2-D"):
        sampling.argmax(torch.zeros(10, device=device))
    with pytest.raises(ValueError, match="top_p"):
        sampling.sample(x, ints, ints, ones, ints.int(), torch.ones(3, device=device))


# ---------------------------------------------------------------- real vocabulary, GPU


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_real_vocab_invariance_and_reference(gpu, gen, dtype):
    batch = 64
    x = (torch.randn(batch, QWEN_VOCAB, generator=gen) * 4).to("cuda", dtype)
    x[:, 1000:2000:7] = x[:, 999:1000]  # exact ties spread over the row
    args = _params(gen, batch, "cuda")
    results = {
        "lse": sampling.logsumexp(x), "lsm": sampling.log_softmax(x),
        "argmax": sampling.argmax(x), "sample": sampling.sample(x, *args),
    }
    for row in torch.randperm(batch, generator=gen)[:8].tolist():
        rows = torch.tensor([row], device="cuda")
        assert torch.equal(results["lse"][row], sampling.logsumexp(x[rows])[0])
        assert torch.equal(results["lsm"][row], sampling.log_softmax(x[rows])[0])
        assert torch.equal(results["argmax"][row], sampling.argmax(x[rows])[0])
        assert torch.equal(results["sample"][row], sampling.sample(x[rows], *_rows(args, rows))[0])
    assert torch.equal(results["argmax"], sampling.argmax_reference(x.float()))
    assert _assert_inverts_the_cdf(x, args, results["sample"], tol=1e-5) <= 1
    exact = torch.log_softmax(x.double(), dim=-1)
    assert torch.allclose(results["lsm"].double(), exact, atol=1e-4, rtol=1e-5)
    assert torch.equal(sampling_triton.row_uniforms(args[0], args[1]).cpu(),
                       philox.row_uniform_reference(args[0].cpu(), args[1].cpu()))


def test_dependent_launch_changes_no_token(gpu, gen, monkeypatch):
    """Unfiltered, the pick launches while pass 1 still runs (sm_90+) and waits for its partials:
    the same tokens as launching it after pass 1 ends."""
    batch = 256
    x = (torch.randn(batch, QWEN_VOCAB, generator=gen) * 4).to("cuda", torch.bfloat16)
    seeds, steps, temperature, _, _ = _params(gen, batch, "cuda")
    off = (torch.zeros(batch, dtype=torch.int32, device="cuda"), torch.ones(batch, device="cuda"))
    overlapped = [sampling.sample(x, seeds + i, steps, temperature, *off, filtered=False) for i in range(4)]
    monkeypatch.setattr(device_module, "dependent_launch", lambda device: False)
    for i, tokens in enumerate(overlapped):
        assert torch.equal(tokens, sampling.sample(x, seeds + i, steps, temperature, *off, filtered=False))


def test_long_kept_sets_do_not_depend_on_batch(gpu, gen):
    """Rows whose kept sets pass the candidate list's cap go through the radix select, several
    listed rows a program at this batch: each row's bounds and token equal those it gets alone."""
    batch = 200
    x = (torch.randn(batch, QWEN_VOCAB, generator=gen) * 4).to("cuda", torch.bfloat16)
    seeds, steps, temperature, _, _ = _params(gen, batch, "cuda", greedy_every=batch + 1)
    top_k = torch.randint(5000, 30000, (batch,), generator=gen, dtype=torch.int32).cuda()
    top_k[::2] = 0
    top_p = torch.where(top_k == 0, 0.999, 1.0).cuda()
    bounds = sampling_triton.kept_bounds(x, temperature, top_k, top_p)
    tokens = sampling.sample(x, seeds, steps, temperature, top_k, top_p)
    assert (bounds[top_k > 0, 2] == 0).all()  # top-k past the cap: none settled by the candidate list
    for row in (0, 37, 101, 150, 199):
        one = slice(row, row + 1)
        assert torch.equal(bounds[one], sampling_triton.kept_bounds(x[one], temperature[one], top_k[one], top_p[one]))
        assert torch.equal(tokens[one], sampling.sample(x[one], seeds[one], steps[one], temperature[one], top_k[one],
                                                        top_p[one]))
