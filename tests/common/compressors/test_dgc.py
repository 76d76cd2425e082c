"""Deep Gradient Compression: the sampled-threshold sparsifier, momentum correction, warm-up, and
both through GradientSync on two gloo ranks."""

from __future__ import annotations

import math

import pytest
import torch

from common.comm import GradientSync
from common.compressors import DGC, CompressorRNG, build_compressor
from common.compressors.dgc_warmup import PAPER_WARMUP, warmup_density
from common.feedback import ErrorFeedback, MomentumCorrection
from tests.distributed import run_ranks
from tests.helpers import official_dgc

# A 100 000-entry tensor at density 0.01: k = 1000; the strided sample has 1030 entries at stride 97
# and its threshold is the 11th largest sampled magnitude.
N, DENSITY, K = 100_000, 0.01, 1000
A_POS = torch.arange(900) * 111  # 900 entries: every strided sample holds 9 or 10 of them
B_POS = torch.arange(1000) * 100 + 50
B_POS = B_POS + torch.isin(B_POS, A_POS).long()  # 9 collisions moved one place on


def _hits_per_start(positions: torch.Tensor) -> set[int]:
    """How many of ``positions`` the strided sample holds, for every possible random start."""
    return {int(torch.isin(s + 97 * torch.arange(1030), positions).sum()) for s in range(97)}


def _background(seed: int = 0) -> torch.Tensor:
    """Small distinct entries, |x| < 1."""
    return torch.rand(N, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _two_levels() -> torch.Tensor:
    """900 entries in [5, 6) (distinct) and 1000 tied at 4: the sample's 11 largest always include
    a 4, so the sampled threshold is 4 and 1900 entries (> 1.3 k) are selected."""
    x = _background()
    x[A_POS] = 5 + torch.arange(900) / 900
    x[B_POS] = -4.0
    return x


def _compress(comp: DGC, x: torch.Tensor, seed: int = 0):
    payload = comp.compress(x, CompressorRNG(seed, 0))
    return payload, comp.decompress(payload)


def test_the_strided_sample_plan_follows_the_code():
    comp = DGC(DENSITY)
    assert comp.sample_plan(N) == (1030, 97)  # stride 129 lowered by 8 until 1000 samples fit
    assert comp.sample_plan(200) == (200, 1)  # numel <= 2 / density: the whole tensor
    assert DGC(DENSITY, sample_ratio=1.0).sample_plan(N) == (N, 1)
    assert _hits_per_start(A_POS) == {9, 10} and min(_hits_per_start(torch.cat([A_POS, B_POS]))) >= 11


def test_threshold_within_bounds_sends_at_most_k():
    x = _background()
    w_pos = torch.arange(1200) * 83  # 12 or 13 in every sample: the threshold is 5 -> 1200 selected
    assert min(_hits_per_start(w_pos)) >= 11
    x[w_pos] = 5.0
    for truncation in ("magnitude", "position"):
        comp = DGC(DENSITY, truncation=truncation)
        payload, out = _compress(comp, x)
        sel = comp.last_selection
        assert sel["branch"] == "within_bounds" and not sel["fallback"] and sel["iterations"] == 0
        assert sel["threshold"] == 5.0 and sel["selected"] == 1200 and K <= sel["selected"] <= 1.3 * K
        assert sel["sent"] == K == payload.wire["values"].numel()
        sent = payload.wire["indices"].long()
        assert torch.isin(sent, w_pos).all() and torch.equal(out[sent], x[sent])
        if truncation == "position":  # the code's indices[:num_selects]: the lowest positions
            assert torch.equal(sent, w_pos[:K])


def test_fallback_sends_exactly_the_top_k_of_the_selected():
    x = _two_levels()
    comp = DGC(DENSITY, truncation="position")  # the fallback is by magnitude in either mode
    _, out = _compress(comp, x)
    sel = comp.last_selection
    assert sel["branch"] == "hierarchical_topk" and sel["fallback"] and sel["threshold"] == 4.0
    assert sel["selected"] == 1900 > 1.3 * K and sel["sent"] == K
    kept = out != 0
    assert int(kept.sum()) == K and torch.equal(out[kept], x[kept])
    assert kept[A_POS].all()  # all of the larger level, then 100 of the ties
    assert x[kept].abs().min() >= x[~kept].abs().max()


def test_without_resample_the_threshold_moves_up_then_down():
    x = _two_levels()
    comp = DGC(DENSITY, resample=False)
    _, out = _compress(comp, x)
    sel = comp.last_selection
    # 4 -> 1900 selected; x 1.3 = 5.2 -> 720 (< 0.8 k); x 0.8 = 4.16 -> the 900 of [5, 6)
    assert sel["branch"] == "within_bounds" and sel["iterations"] == 2
    assert sel["threshold"] == pytest.approx(4.16) and sel["selected"] == sel["sent"] == 900
    assert torch.equal((out != 0).nonzero().view(-1), A_POS)
    comp = DGC(DENSITY, resample=False, max_adaptation_iters=1)
    _compress(comp, x)
    assert comp.last_selection["branch"] == "max_iterations"
    assert comp.last_selection["selected"] == comp.last_selection["sent"] == 720 < 0.8 * K


@pytest.mark.parametrize("seed", range(4))
def test_random_gradients_hit_one_of_the_documented_outcomes(seed):
    x = torch.randn(N, generator=torch.Generator().manual_seed(seed))
    comp = DGC(DENSITY)
    _, out = _compress(comp, x, seed)
    sel = comp.last_selection
    kept = out != 0
    assert sel["sent"] == int(kept.sum()) == min(sel["selected"], K)
    if sel["fallback"]:
        assert sel["selected"] > 1.3 * K and sel["sent"] == K
    else:
        assert sel["branch"] == "within_bounds" and 0.8 * K <= sel["selected"] <= 1.3 * K
    # magnitude truncation: the exact top-sent of x
    assert x[kept].abs().min() >= x[~kept].abs().max()


@pytest.mark.parametrize("numel", [1, 7, 1023, 4097])
def test_small_tensors_send_their_exact_top_k_and_bits_are_counted(numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    comp = DGC(0.001)  # sampled whole, as in the code (4097 too: no stride leaves 2000 samples)
    payload, out = _compress(comp, x)
    k = math.ceil(0.001 * numel)
    assert comp.last_selection["branch"] == "exact" and comp.last_selection["sent"] == k
    values, indices = payload.wire["values"], payload.wire["indices"]
    assert values.dtype == torch.float32 and indices.dtype == torch.int32
    assert payload.num_bits == values.numel() * 32 + indices.numel() * 32 == 64 * k
    assert torch.equal(out.abs().topk(k).values, x.abs().topk(k).values)


def test_payload_shape_dtype_rng_and_linearity_flags():
    x = torch.randn(64, 33, generator=torch.Generator().manual_seed(1))
    comp = build_compressor("dgc", density=0.01)
    before = torch.random.get_rng_state()
    p1 = comp.compress(x, CompressorRNG(seed=3, rank=1))
    p2 = comp.compress(x, CompressorRNG(seed=3, rank=1))
    assert torch.equal(torch.random.get_rng_state(), before)  # only rng.local is drawn from
    assert all(torch.equal(p1.wire[key], p2.wire[key]) for key in p1.wire)
    out = comp.decompress(p1)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert not comp.linear and not comp.unbiased and not comp.fixed_size


def test_set_density_changes_k_between_steps():
    comp = DGC(0.001)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert _compress(comp, x)[0].wire["values"].numel() == 1
    comp.set_density(warmup_density(0, 0.001))
    num_sent = _compress(comp, x)[0].wire["values"].numel()
    assert comp.density == 0.25 and comp.last_selection["k"] == 250 and 0.8 * 250 <= num_sent <= 250
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\].*got 0"):
        comp.set_density(0)


def test_warmup_schedule_per_epoch():
    assert [warmup_density(e, 0.001) for e in range(7)] == [*PAPER_WARMUP, 0.001, 0.001]
    assert PAPER_WARMUP == (0.25, 0.0625, 0.015625, 0.00390625, 0.001)
    assert warmup_density(100, 0.01) == 0.01
    assert [warmup_density(e, 0.01, [0.5, 0.1]) for e in range(3)] == [0.5, 0.1, 0.01]
    assert warmup_density(4, 0.01) == 0.01  # never sparser than the final density
    assert warmup_density(0, 0.01, []) == 0.01


# -- momentum correction ------------------------------------------------------------------------


def _step(mc: MomentumCorrection, grad: torch.Tensor, send: list[int]):
    """One step with a fixed selection: the entries at ``send`` are sent exactly."""
    compensated = mc.compensate(["w"], grad, [grad.numel()])
    sent = torch.zeros_like(compensated)
    sent[send] = compensated[send]
    mc.update(["w"], compensated, sent, [grad.numel()])
    return compensated, sent


def test_momentum_correction_matches_the_paper_by_hand():
    mc = MomentumCorrection(momentum=0.5)
    # step 1: u = g = [1, 2, 4]; v = u; send entry 2 -> v = [1, 2, 0], u masked = [1, 2, 0]
    c, _ = _step(mc, torch.tensor([1.0, 2.0, 4.0]), [2])
    assert c.tolist() == [1.0, 2.0, 4.0]
    assert mc.momentums["w"].tolist() == [1.0, 2.0, 0.0] and mc.residuals["w"].tolist() == [1.0, 2.0, 0.0]
    # step 2: u = 0.5 [1, 2, 0] + [2, 0, -2] = [2.5, 1, -2]; v = [1, 2, 0] + u = [3.5, 3, -2]; send 0
    c, _ = _step(mc, torch.tensor([2.0, 0.0, -2.0]), [0])
    assert c.tolist() == [3.5, 3.0, -2.0]
    assert mc.momentums["w"].tolist() == [0.0, 1.0, -2.0] and mc.residuals["w"].tolist() == [0.0, 3.0, -2.0]
    # step 3: u = 0.5 [0, 1, -2] + [1, 1, 1] = [1, 1.5, 0]; v = [0, 3, -2] + u = [1, 4.5, -2]; send 1
    c, sent = _step(mc, torch.tensor([1.0, 1.0, 1.0]), [1])
    assert c.tolist() == [1.0, 4.5, -2.0] and sent.tolist() == [0.0, 4.5, 0.0]
    assert mc.momentums["w"].tolist() == [1.0, 0.0, 0.0] and mc.residuals["w"].tolist() == [1.0, 0.0, -2.0]


def test_nesterov_and_no_masking_by_hand():
    mc = MomentumCorrection(momentum=0.5, nesterov=True)
    # u = 0.5 (0 + g) = [0.5, 1]; v = 0 + u + g = [1.5, 3]
    assert _step(mc, torch.tensor([1.0, 2.0]), [1])[0].tolist() == [1.5, 3.0]
    assert mc.momentums["w"].tolist() == [0.5, 0.0]
    mc = MomentumCorrection(momentum=0.5, masking=False)
    _step(mc, torch.tensor([1.0, 2.0, 4.0]), [2])
    assert mc.momentums["w"].tolist() == [1.0, 2.0, 4.0]  # u kept where sent
    c, _ = _step(mc, torch.tensor([2.0, 0.0, -2.0]), [0])
    # u = [2.5, 1, 0]; v = [1, 2, 0] + u
    assert mc.momentums["w"].tolist() == [2.5, 1.0, 0.0] and c.tolist() == [3.5, 3.0, 0.0]


def test_masking_zeroes_exactly_the_sent_entries_and_conservation_holds():
    mc, comp, rng = MomentumCorrection(momentum=0.9), DGC(0.05), CompressorRNG(0, 0)
    sizes, names = [3000, 500], ["a", "b"]
    for step in range(4):
        grad = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(step))
        u_before = torch.cat([mc.momentum_buffer(n, torch.empty(s)) for n, s in zip(names, sizes)])
        compensated = mc.compensate(names, grad, sizes)
        sent = comp.decompress(comp.compress(compensated, rng))
        mc.update(names, compensated, sent, sizes)
        u = torch.cat([mc.momentums[n] for n in names])
        v = torch.cat([mc.residuals[n] for n in names])
        was_sent = sent != 0
        assert int(was_sent.sum()) == comp.last_selection["sent"] > 0
        assert torch.equal(sent + v, compensated)  # conservation, exact
        assert not u[was_sent].any() and not v[was_sent].any()
        assert torch.equal(u[~was_sent], (0.9 * u_before + grad)[~was_sent])
        assert torch.equal(v[~was_sent], compensated[~was_sent])


def test_clipping_scales_the_call_to_clip_norm_over_sqrt_world_size():
    mc = MomentumCorrection(momentum=0.9, clip_norm=2.0, world_size=4)  # 2 / sqrt(4) = 1
    grad = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 10
    c = mc.compensate(["a", "b"], grad, [200, 100])
    torch.testing.assert_close(torch.linalg.vector_norm(c), torch.tensor(1.0), rtol=1e-5, atol=0)
    torch.testing.assert_close(c, grad / torch.linalg.vector_norm(grad), rtol=1e-5, atol=1e-7)
    small = torch.full((4,), 0.1)  # norm 0.2 < 1: untouched
    assert torch.equal(MomentumCorrection(clip_norm=2.0, world_size=4).compensate(["w"], small, [4]), small)


def test_state_dict_round_trips_exactly():
    mc = MomentumCorrection(momentum=0.9)
    for step in range(3):
        _step(mc, torch.randn(10, generator=torch.Generator().manual_seed(step)), [step])
    state = mc.state_dict()
    clone = MomentumCorrection(momentum=0.9)
    clone.load_state_dict(state)
    grad = torch.randn(10)
    assert torch.equal(_step(clone, grad, [5])[0], _step(mc, grad, [5])[0])
    assert torch.equal(clone.momentums["w"], mc.momentums["w"])
    assert torch.equal(clone.residuals["w"], mc.residuals["w"])
    assert not torch.equal(state["momentums"]["w"], mc.momentums["w"])  # a copy, not a view
    with pytest.raises(ValueError, match="no 'momentums'"):
        clone.load_state_dict(ErrorFeedback().state_dict())


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: build_compressor("dgc", density=0), r"density must be a number in \(0, 1\].*got 0$"),
        (lambda: build_compressor("dgc", density=1.5), r"density must be a number in \(0, 1\].*got 1.5$"),
        (lambda: DGC(sample_ratio=0), r"sample_ratio must be a number in \(0, 1\], got 0$"),
        (lambda: DGC(upper_bound=0.5), r"upper_bound must be a number >= 1 \(times k\), got 0.5$"),
        (lambda: DGC(truncation="first"), r"truncation must be one of magnitude, position, got 'first'"),
        (lambda: MomentumCorrection(momentum=1.0), r"momentum must be a number in \[0, 1\), got 1.0$"),
        (
            lambda: MomentumCorrection(clip_norm=-1),
            r"clip_norm must be None .* or a finite number > 0, got -1$",
        ),
        (lambda: MomentumCorrection(world_size=0), r"world_size must be an int >= 1, got 0$"),
        (
            lambda: warmup_density(0, 0.001, [0.5, 2.0]),
            r"warm-up schedule entries must be densities in \(0, 1\], got 2.0 at position 1",
        ),
        (lambda: warmup_density(-1, 0.001), r"epoch must be an int >= 0, got -1"),
    ],
)
def test_bad_options_are_rejected(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# -- two gloo ranks -----------------------------------------------------------------------------

SIZES = (5000, 300, 7)
NAMES = [f"layer{i}.weight" for i in range(len(SIZES))]


def _grads(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(n, generator=g) * (i + 1) for i, n in enumerate(SIZES)]


def _dgc_ranks(rank: int, world: int) -> dict:
    sync = GradientSync(
        DGC(0.01), error_feedback=MomentumCorrection(momentum=0.9), transport="allgather", seed=3
    )
    # The reference: this rank's own momentum correction and selections, then the dense mean.
    comp, mc, rng = DGC(0.01), MomentumCorrection(momentum=0.9), CompressorRNG(3, rank)
    out: dict = {"synced": [], "reference": [], "sent": []}
    for step in range(3):
        grads = _grads(rank, step)
        sync.sync(list(zip(NAMES, grads, strict=True)))
        out["synced"].append([g.clone() for g in grads])
        means = []
        for name, g in zip(NAMES, _grads(rank, step), strict=True):
            compensated = mc.compensate([name], g, [g.numel()])
            rng.reseed(f"{name}#{step}")  # GradientSync keys each tensor's draws by name and count
            sent = comp.decompress(comp.compress(compensated, rng))
            mc.update([name], compensated, sent, [g.numel()])
            parts = [torch.zeros_like(sent) for _ in range(world)]
            torch.distributed.all_gather(parts, sent)
            means.append(sum(parts) / world)
            out["sent"].append(int((sent != 0).sum()))
        out["reference"].append(means)
    assert isinstance(sync.error_feedback, MomentumCorrection)
    out["state"] = sync.error_feedback.state_dict()
    out["reference_state"] = mc.state_dict()
    out["bits"] = dict(sync.stats.bits_by_op)
    return out


def test_gradient_sync_on_two_ranks_equals_each_ranks_own_selections(tmp_path):
    results = run_ranks(_dgc_ranks, 2, tmp_path=tmp_path)
    for res in results:
        for synced, reference in zip(res["synced"], res["reference"], strict=True):
            for a, b in zip(synced, reference, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        for kind in ("residuals", "momentums"):
            for name in NAMES:
                assert torch.equal(res["state"][kind][name], res["reference_state"][kind][name])
    # per tensor and step, one all-gather of values + indices (64 bits an entry) padded to the
    # larger of the two ranks' payloads
    padded = [max(a, b) for a, b in zip(results[0]["sent"], results[1]["sent"], strict=True)]
    assert results[0]["sent"] != results[1]["sent"]  # each rank selects its own entries
    for res in results:
        assert res["bits"]["all_gather"] == 64 * sum(padded)
    for a, b in zip(results[0]["synced"][-1], results[1]["synced"][-1], strict=True):
        assert torch.equal(a, b)  # every rank ends with the same average


def _official_start(rng: CompressorRNG, stride: int) -> int:
    """The strided sample's start our compressor draws from ``rng.local`` (without using it up)."""
    local = torch.Generator()
    local.set_state(rng.local.get_state())
    return int(torch.randint(stride, (1,), generator=local))


@pytest.mark.parametrize("resample", [True, False])
@pytest.mark.parametrize("case", ["normal", "heavy", "two_levels", "ties"])
def test_position_truncation_equals_the_official_sparsify(case, resample):
    """The code's ``_sparsify`` (tests/helpers/official_dgc.py) given our sample's start: the same
    entries in the same order, every branch (the cases reach the hierarchical top-k, the rounds
    up and down, and in-bounds ends)."""
    gen = torch.Generator().manual_seed(3)
    x = {
        "normal": lambda: torch.randn(N, generator=gen),
        "heavy": lambda: torch.randn(N, generator=gen) ** 5,
        "two_levels": _two_levels,
        "ties": lambda: torch.randint(-3, 4, (N,), generator=gen).float(),
    }[case]()
    comp = DGC(DENSITY, truncation="position", resample=resample)
    _, stride = comp.sample_plan(N)
    branches = set()
    for seed in range(6):
        rng = CompressorRNG(seed, 0)
        start = _official_start(rng, stride)
        values, indices = official_dgc.sparsify(x, DENSITY, start, resample=resample)
        payload = comp.compress(x, rng)
        branches.add(comp.last_selection["branch"])
        if comp.last_selection["branch"] == "hierarchical_topk":  # top-k order: compare as sets
            order = payload.wire["indices"].long().argsort()
            assert torch.equal(payload.wire["indices"].long()[order], indices.sort().values)
            assert torch.equal(payload.wire["values"][order], x[indices.sort().values])
        else:
            assert torch.equal(payload.wire["indices"].long(), indices)
            assert torch.equal(payload.wire["values"], values)
        grad = torch.empty(N)
        assert torch.equal(comp.decompress(payload), official_dgc.decompress(values, indices, grad))
    assert "exact" not in branches  # sampled at a stride, never whole: the code's adaptation ran


def test_the_fused_rounds_select_what_the_mask_rounds_select():
    """``_adapt(fused=True)`` (the CUDA path: kernels.threshold_select into buffers, here its reference)
    gives the same threshold, selection, branch and rounds as the mask path on CPU, overflow
    included (the two-level tensor selects 1900 > 1.3 k)."""
    gen = torch.Generator().manual_seed(5)
    for x in (torch.randn(N, generator=gen), _two_levels(), torch.randn(N, generator=gen) ** 5):
        for resample in (True, False):
            comp = DGC(DENSITY, resample=resample)
            threshold = torch.tensor(float(x.abs().kthvalue(N - 700).values))
            for start in (threshold, threshold * 3, threshold / 3):
                a = comp._adapt(x, start, K, False, fused=False)
                b = comp._adapt(x, start, K, False, fused=True)
                assert torch.equal(a[0], b[0]) and a[2:] == b[2:]
                assert torch.equal(a[1][0], b[1][0]) and torch.equal(a[1][1], b[1][1]) and a[1][2] == b[1][2]
