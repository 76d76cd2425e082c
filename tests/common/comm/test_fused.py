"""The fused route (common.comm.routes.fused): a bucket in a fixed number of ops, no host read, each
tensor's own semantics.

What a GPU step would pay is counted here on CPU tensors: every ATen op dispatched (a launch on a
GPU) with a ``TorchDispatchMode``, and every host read with the profiler, which also sees the ops
inside other ops' implementations (``segment_reduce`` checks its lengths with ``.item()`` unless
told not to) and those run in a collective's completion callback on another thread.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from common.comm import GradientSync
from common.compressors import build_compressor
from common.compressors.base import CompressorRNG
from common.compressors.segments import SegmentDraws, Segments, hash32, num_kept_table
from common.compressors.topk import topk_indices
from kernels import ternarize as ternarize_kernel
from kernels._buckets import bucket_norms
from kernels.qsgd_quantize import reference as qsgd_reference
from kernels.ternarize import reference as ternary_reference
from tests.distributed import run_ranks
from tests.helpers.dispatch import count_ops

#: (name, options, error feedback): every compressor with a fused route.
FUSED = [
    ("topk", {"density": 0.01}, True),
    ("dgc", {"density": 0.01}, True),
    ("randomk", {"density": 0.02}, False),
    ("randomk", {"density": 0.02, "shared_indices": False, "scaled": False}, True),
    ("random_block", {"density": 0.05}, True),
    ("random_block", {"density": 0.05, "scaled": True}, False),
    ("terngrad", {}, False),
    ("terngrad", {"clip_at": "own"}, True),
    ("terngrad", {"shared_scaler": False}, False),
    ("qsgd", {"bits": 4}, False),
    ("qsgd", {"bits": 2, "norm": "max", "bucket_size": 128}, True),
    ("signsgd", {}, True),
    ("signsgd", {"scaled": False, "vote": "majority"}, False),
]
#: The elementwise compressors compress a bucket whole on every route.
ELEMENTWISE = [("fp16", {}, True), ("bf16", {}, False), ("identity", {}, True)]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}-ef{int(e)}" for n, o, e in FUSED]
EVERY = FUSED + ELEMENTWISE
EVERY_IDS = IDS + [f"{n}-ef{int(e)}" for n, _, e in ELEMENTWISE]
HOST_READS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::nonzero",
    "aten::unique",
    "aten::_unique2",
    "aten::masked_select",
    "aten::is_nonzero",
    "aten::equal",
}
ODD = [1, 7, 1023, 4097]


def _bucket(num_tensors: int, seed: int = 0) -> tuple[list[str], list[int], Tensor]:
    """``num_tensors`` tensors of assorted sizes (odd ones, and one past the sampled top-k's
    threshold of 2^15 entries)."""
    sizes = [ODD[i % 4] + 3 * i for i in range(num_tensors)]
    sizes[0] = 40_000
    names = [f"layer{i}.weight" for i in range(num_tensors)]
    return names, sizes, torch.randn(sum(sizes), generator=torch.Generator().manual_seed(seed))


def _sync(name: str, options: dict, ef: bool, fused: bool = True) -> GradientSync:
    return GradientSync(
        build_compressor(name, **options),
        error_feedback=ef,
        bucket_numel=10**9,
        compress_per_tensor=True,
        fused=fused,
    )


def _reads(events) -> list[str]:
    """The host reads among profiler events, less ``_assert_async``'s own (on a CPU it checks at
    once, which is a read; on a GPU it checks on the device)."""
    return [e.name for e in events if e.name in HOST_READS and "aten::_assert_async" not in _ancestors(e)]


def _ancestors(event) -> set[str]:
    names = set()
    while event.cpu_parent is not None:
        event = event.cpu_parent
        names.add(event.name)
    return names


def _host_reads(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return _reads(prof.events())


@pytest.mark.parametrize("name,options,ef", EVERY, ids=EVERY_IDS)
def test_a_bucket_costs_the_same_ops_whatever_it_holds_and_reads_nothing(name, options, ef):
    """Ops dispatched by one bucket's reduction: the same for 8 tensors as for 128, and none of
    them reads a device value (world size 1: the collectives are no-ops, the compression runs)."""
    totals = []
    for num_tensors in (8, 128):
        names, sizes, flat = _bucket(num_tensors)
        sync = _sync(name, options, ef)
        sync.reduce_flat(names, flat.clone(), sizes)  # builds the layout's tables once
        counter = count_ops(lambda: sync.reduce_flat(names, flat.clone(), sizes))  # noqa: B023
        totals.append(counter.total)
        assert counter.host_reads == []
        assert _host_reads(lambda: sync.reduce_flat(names, flat.clone(), sizes)) == []  # noqa: B023
    assert abs(totals[0] - totals[1]) <= 4, totals


def test_the_per_tensor_route_grows_with_the_tensors():
    """The contrast the fused route removes (top-k: a few ops per tensor)."""
    counts = []
    for num_tensors in (8, 128):
        names, sizes, flat = _bucket(num_tensors)
        sync = GradientSync(
            build_compressor("topk", density=0.01), bucket_numel=10**9, compress_per_tensor=True
        )
        sync.reduce_flat(names, flat.clone(), sizes)
        counts.append(count_ops(lambda: sync.reduce_flat(names, flat.clone(), sizes)).total)  # noqa: B023
    assert counts[1] > 10 * counts[0] / 2


class _Draws(SegmentDraws):
    """Draws whose numbers a test chose (to compare with the per-tensor route given the same)."""

    def __init__(
        self, segments: Segments, uniform: Tensor | None = None, below: Tensor | None = None
    ) -> None:
        super().__init__(segments, seed=0, rank=0, counts=[0] * len(segments))
        self._uniform, self._below = uniform, below

    def uniform(self, stream: str = "local") -> Tensor:
        assert self._uniform is not None
        return self._uniform

    def integers_below(self, bounds_S: Tensor, stream: str = "shared") -> Tensor:
        assert self._below is not None
        return self._below


def _segments(sizes: list[int]) -> Segments:
    return Segments([f"t{i}" for i in range(len(sizes))], sizes, "cpu")


@pytest.mark.parametrize("density", [0.001, 0.01, 0.3])
def test_topk_keeps_each_tensors_own_k_largest(density):
    sizes = [*ODD, 40_000, 100_003, 2]
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(1))
    segments = _segments(sizes)
    topk = build_compressor("topk", density=density)
    payload = topk.compress_segments(flat, segments, SegmentDraws(segments, 0, 0, [0] * len(sizes)))
    kept = num_kept_table(segments, density)
    indices = payload.wire["indices"].long()
    assert payload.wire["values"].numel() == sum(kept)
    assert not payload.local["inexact"].any()
    slot = 0
    for start, n, k in zip(segments.starts, sizes, kept, strict=True):
        mine = indices[slot : slot + k]
        reference = topk_indices(flat[start : start + n].abs(), k) + start
        assert set(mine.tolist()) == set(reference.tolist())
        assert torch.equal(payload.wire["values"][slot : slot + k], flat[mine])
        slot += k
    decoded = topk.decode_segments_into([payload], torch.empty_like(flat))
    per_tensor = torch.cat(
        [topk.decompress(topk.compress(part, CompressorRNG(0, 0))) for part in flat.split(sizes)]
    )
    assert torch.equal(decoded, per_tensor)


def test_topk_ties_and_zeros_fill_by_position_and_a_missed_threshold_is_flagged():
    sizes = [50_000, 9]
    flat = torch.zeros(sum(sizes))
    flat[:10] = torch.arange(1.0, 11.0)  # 10 nonzeros, k = 500: the rest are ties at 0
    segments = _segments(sizes)
    payload = build_compressor("topk", density=0.01).compress_segments(
        flat, segments, SegmentDraws(segments, 0, 0, [0, 0])
    )
    first = payload.wire["indices"][:500].long()
    assert set(range(10)) <= set(first.tolist()) and len(set(first.tolist())) == 500
    assert not payload.local["inexact"].any()
    # a tensor whose large entries all sit where the strided sample does not look
    sizes = [1 << 16]
    flat = torch.rand(sizes[0]) * 1e-3
    sample = torch.arange(math.ceil(256 * sizes[0] / (2 * 656))).mul_(1_000_003).remainder_(sizes[0])
    flat[sample] = 1.0 + torch.rand(sample.numel())  # the sample sees only large entries
    segments = _segments(sizes)
    payload = build_compressor("topk", density=0.01).compress_segments(
        flat, segments, SegmentDraws(segments, 0, 0, [0])
    )
    assert payload.local["inexact"].all()
    valid = payload.local["valid"]
    assert (payload.wire["values"][valid] > 1.0).all()  # what it holds is of the largest


def _per_tensor_dgc_starts(dgc, sizes: list[int], seed: int) -> list[int]:
    starts = []
    for i, n in enumerate(sizes):
        samples, stride = dgc.sample_plan(n)
        generator = torch.Generator().manual_seed(seed + i)
        starts.append(int(torch.randint(stride, (1,), generator=generator)) if samples < n else 0)
    return starts


@pytest.mark.parametrize("density", [0.001, 0.01, 0.1])
def test_dgc_sends_what_it_sends_per_tensor_given_the_same_sample(density):
    """DGC per tensor (threshold from a strided sample, adaptation, hierarchical top-k, magnitude
    truncation) against the fused selection, the sample's start the same."""
    sizes = [*ODD, 40_000, 250_000, 3]
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(2)) ** 3  # heavy tails
    segments = _segments(sizes)
    dgc = build_compressor("dgc", density=density)
    starts = _per_tensor_dgc_starts(dgc, sizes, seed=10)
    payload = dgc.compress_segments(flat, segments, _Draws(segments, below=torch.tensor(starts)))
    decoded = dgc.decode_segments_into([payload], torch.empty_like(flat))
    sent = 0
    for i, (start, n) in enumerate(zip(segments.starts, sizes, strict=True)):
        rng = CompressorRNG(0, 0)
        rng.local.manual_seed(10 + i)
        one = dgc.compress(flat[start : start + n], rng)
        sent += one.wire["values"].numel()
        assert torch.equal(decoded[start : start + n], dgc.decompress(one)), (i, dgc.last_selection)
    assert int(payload.local["num_sent"]) == sent
    assert payload.wire["values"].numel() == sum(num_kept_table(segments, density))


def test_random_block_is_the_per_tensor_block_at_the_same_offsets():
    sizes = [*ODD, 5000]
    flat = torch.randn(sum(sizes))
    segments = _segments(sizes)
    for scaled in (False, True):
        block = build_compressor("random_block", density=0.3, scaled=scaled)
        offsets = torch.tensor([0, 6, 1000, 17, 4999])
        payload = block.compress_segments(flat, segments, _Draws(segments, below=offsets))
        decoded = block.decode_segments_into([payload], torch.empty_like(flat))

        class _Offsets(CompressorRNG):
            def shared_below(self, n: int) -> int:
                return int(offsets[sizes.index(n)])  # noqa: B023

        per_tensor = torch.cat(
            [block.decompress(block.compress(part, _Offsets(0, 0))) for part in flat.split(sizes)]
        )
        assert torch.equal(decoded, per_tensor)


def test_random_k_picks_k_distinct_entries_of_each_tensor_uniformly():
    sizes = [10, 1000, 40_000]
    segments = _segments(sizes)
    randomk = build_compressor("randomk", density=0.1, shared_indices=False, scaled=False)
    hits = torch.zeros(sum(sizes))
    for count in range(200):
        payload = randomk.compress_segments(
            torch.ones(sum(sizes)), segments, SegmentDraws(segments, 3, 0, [count] * 3)
        )
        indices = payload.wire["indices"].long()
        slot = 0
        for start, n, k in zip(segments.starts, sizes, num_kept_table(segments, 0.1), strict=True):
            mine = indices[slot : slot + k]
            assert len(set(mine.tolist())) == k and ((mine >= start) & (mine < start + n)).all()
            slot += k
        hits[indices] += 1
    # each entry of the 1000-entry tensor is kept with probability 0.1: 20 of 200 on average
    middle = hits[10:1010]
    assert 14 < middle.mean() < 26 and middle.max() < 45


def _noise(numel: int, seed: int) -> Tensor:
    return torch.rand(numel, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("clip_at", ["shared", "own"])
def test_terngrad_codes_are_the_per_tensor_codes_given_the_same_scalers_and_noise(clip_at):
    sizes = [*ODD, 20_000]
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(3))
    flat[0] = 5.0  # a one-entry tensor: sigma 0
    segments = _segments(sizes)
    terngrad = build_compressor("terngrad", clip_at=clip_at)
    noise = _noise(sum(sizes), 4)
    scalers = terngrad.scalers_segments(flat, segments)
    per_tensor_scalers = torch.stack([terngrad.scaler(part) for part in flat.split(sizes)])
    torch.testing.assert_close(scalers, per_tensor_scalers, rtol=1e-6, atol=0)
    payload = terngrad.compress_segments(
        flat, segments, _Draws(segments, uniform=noise), scaler=scalers * 1.5
    )
    codes = ternary_reference.ternary_values(payload.wire["codes"], sum(sizes))
    expected = []
    for part, s, u in zip(flat.split(sizes), scalers * 1.5, noise.split(sizes), strict=True):
        g = terngrad.clip_tensor(part) if clip_at == "own" else part
        if clip_at == "own":  # the clamp at the segmented bound (the same sigma as the scaler)
            bound = terngrad.scalers_segments(part, _segments([part.numel()]))
            g = torch.clamp(part, -bound, bound) if part.numel() > 1 else part
        packed = ternarize_kernel(g, s, noise=u)
        expected.append(ternary_reference.ternary_values(packed, part.numel()))
    assert torch.equal(codes, torch.cat(expected))
    with pytest.raises(RuntimeError, match="below this rank's own"):
        terngrad.compress_segments(flat, segments, _Draws(segments, uniform=noise), scaler=scalers * 0.5)


@pytest.mark.parametrize("bits,norm,bucket_size", [(4, "l2", 512), (2, "max", 100), (8, "l2", 7)])
def test_qsgd_codes_are_the_per_tensor_codes_given_the_same_norms_and_noise(bits, norm, bucket_size):
    sizes = [*ODD, 3000]
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(5))
    segments = _segments(sizes)
    qsgd = build_compressor("qsgd", bits=bits, norm=norm, bucket_size=bucket_size)
    noise = _noise(sum(sizes), 6)
    payload = qsgd.compress_segments(flat, segments, _Draws(segments, uniform=noise))
    norms = payload.wire["norms"]
    per_tensor_norms = torch.cat([bucket_norms(part, bucket_size, norm) for part in flat.split(sizes)])
    torch.testing.assert_close(norms, per_tensor_norms, rtol=2e-6, atol=0)
    codes = qsgd_reference.pack_ref.unpack_bits(payload.wire["codes"], bits, sum(sizes))
    expected, b = [], 0
    for part, u in zip(flat.split(sizes), noise.split(sizes), strict=True):
        count = -(-part.numel() // bucket_size)
        scales = qsgd_reference.level_scales(norms[b : b + count], bits)
        expected.append(qsgd_reference.qsgd_codes(part, scales, bucket_size, u, bits))
        b += count
    assert torch.equal(codes, torch.cat(expected))
    decoded = qsgd.decode_segments_into([payload], torch.empty_like(flat))
    reference, b = [], 0
    for part, codes_part in zip(flat.split(sizes), torch.cat(expected).split(sizes), strict=True):
        count = -(-part.numel() // bucket_size)
        packed = qsgd_reference.pack_ref.pack_bits(codes_part, bits)
        reference.append(
            qsgd_reference.qsgd_dequantize_accumulate(
                packed[None], norms[None, b : b + count], part.numel(), bits, bucket_size
            )
        )
        b += count
    assert torch.equal(decoded, torch.cat(reference))


def test_signsgd_sends_the_per_tensor_signs_and_scales():
    sizes = [*ODD, 3000]
    flat = torch.randn(sum(sizes))
    flat[5] = 0.0
    segments = _segments(sizes)
    sign = build_compressor("signsgd")
    payload = sign.compress_segments(flat, segments, SegmentDraws(segments, 0, 0, [0] * 5))
    decoded = sign.decode_segments_into([payload], torch.empty_like(flat))
    per_tensor = torch.cat(
        [sign.decompress(sign.compress(p, CompressorRNG(0, 0))) for p in flat.split(sizes)]
    )
    # the scales: a segmented mean against a per-tensor mean(), a few ulps apart
    torch.testing.assert_close(decoded, per_tensor, rtol=1e-5, atol=0)
    assert torch.equal(torch.sign(decoded), torch.sign(per_tensor))


@pytest.mark.parametrize(
    "name,options,ef", [f for f in FUSED if f[2]], ids=[i for i, f in zip(IDS, FUSED) if f[2]]
)
def test_error_feedback_conserves_exactly_on_the_fused_route(name, options, ef):
    """residual == compensated - sent, bit for bit, with one flat residual buffer for the bucket
    (``sent``: this rank's payload decoded, recomputed from the same draws)."""
    names, sizes, _ = _bucket(6)
    sync = _sync(name, options, ef)
    compressor = sync.compressor
    for step in range(3):
        grad = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(step))
        residual = torch.cat(
            [sync.error_feedback.residuals.get(n, torch.zeros(s)) for n, s in zip(names, sizes)]
        )
        compensated = grad + residual
        sync.reduce_flat(names, grad.clone(), sizes)
        after = torch.cat([sync.error_feedback.residuals[n] for n in names])
        segments = sync.route.fused.layout(names, grad, sizes)
        assert segments is not None
        buffer, _ = sync.error_feedback._flat[tuple(names)]
        assert buffer.data_ptr() == sync.error_feedback.residuals[names[0]].data_ptr()
        draws = SegmentDraws(segments, sync.seed, 0, [step] * len(names))
        if name == "terngrad":  # world size 1: the agreed scalers are this rank's own
            own = compressor.scalers_segments(compensated, segments)
            payload = compressor.compress_segments(compensated, segments, draws, scaler=own, own=own)
        else:
            payload = compressor.compress_segments(compensated, segments, draws)
        sent = compressor.decode_segments_into([payload], torch.empty_like(compensated))
        assert torch.equal(after, compensated - sent)
        if name in ("topk", "dgc", "random_block"):  # at most k entries of each tensor were sent
            kept = num_kept_table(segments, options["density"])
            assert all(int((part != 0).sum()) <= k for part, k in zip(sent.split(sizes), kept, strict=True))


def test_draws_are_keyed_by_name_and_count_not_by_bucket_layout():
    one = _segments([10, 20])
    other = Segments(["t1", "t0"], [20, 10], "cpu")
    a = SegmentDraws(one, 7, 0, [3, 3]).uniform()
    b = SegmentDraws(other, 7, 0, [3, 3]).uniform()
    assert torch.equal(a[:10], b[20:]) and torch.equal(a[10:], b[:20])
    assert not torch.equal(SegmentDraws(one, 7, 0, [4, 4]).uniform(), a)
    assert not torch.equal(SegmentDraws(one, 7, 1, [3, 3]).uniform(), a)  # local: per rank
    assert torch.equal(
        SegmentDraws(one, 7, 1, [3, 3]).uniform("shared"), SegmentDraws(one, 7, 0, [3, 3]).uniform("shared")
    )
    assert hash32(0) == 0 and float(a.min()) >= 0 and float(a.max()) < 1


@pytest.mark.parametrize("name,options,ef", FUSED[:9], ids=IDS[:9])
def test_resume_is_exact_on_the_fused_route(name, options, ef):
    names, sizes, _ = _bucket(5)
    grads = [torch.randn(sum(sizes), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    whole = _sync(name, options, ef)
    out_whole = [whole.reduce_flat(names, g.clone(), sizes).clone() for g in grads]
    first = _sync(name, options, ef)
    for g in grads[:2]:
        first.reduce_flat(names, g.clone(), sizes)
    resumed = _sync(name, options, ef)
    resumed.load_state_dict(first.state_dict())
    out = [resumed.reduce_flat(names, g.clone(), sizes).clone() for g in grads[2:]]
    assert all(torch.equal(a, b) for a, b in zip(out, out_whole[2:], strict=True))


# -- real ranks ------------------------------------------------------------------------------------


def _ddp_step_reads(rank: int, world: int, name: str, options: dict, ef: bool) -> dict:
    """One DDP step through the hook on the fused route: host reads (every thread) and gradients,
    and the explicit path's mean of the same gradients for comparison."""
    from torch.nn.parallel import DistributedDataParallel

    from common.comm import install_ddp_hook

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(300, 200), nn.ReLU(), nn.Linear(200, 10))
    model = DistributedDataParallel(net, bucket_cap_mb=0.2)
    sync = install_ddp_hook(model, name, error_feedback=ef, fused=True, **options)
    x = torch.randn(16, 300, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(rank))
    reads = []
    for step in range(4):  # DDP rebuilds its buckets in the second step (reading sizes): then count
        model.zero_grad()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            nn.functional.cross_entropy(model(x), y).backward()
        if step >= 2:
            reads += _reads(prof.events())
    return {"reads": reads, "grads": [p.grad.clone() for p in net.parameters()], "bits": sync.stats.bits_sent}


@pytest.mark.parametrize(
    "name,options,ef",
    [FUSED[i] for i in (0, 1, 2, 4, 6, 9, 11)],
    ids=[IDS[i] for i in (0, 1, 2, 4, 6, 9, 11)],
)
def test_a_ddp_step_through_the_hook_reads_nothing_on_any_thread(tmp_path, name, options, ef):
    results = run_ranks(_ddp_step_reads, 2, name, options, ef, tmp_path=tmp_path)
    for result in results:
        assert result["reads"] == []
        assert result["bits"] > 0
    for a, b in zip(results[0]["grads"], results[1]["grads"], strict=True):
        assert torch.equal(a, b)  # every rank holds the same mean


def _fused_against_per_tensor(rank: int, world: int, name: str, options: dict) -> dict:
    names, sizes, _ = _bucket(6)
    grad = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(rank))
    fused = _sync(name, options, False)
    per_tensor = _sync(name, options, False, fused=False)
    blocking = fused.reduce_flat(names, grad.clone(), sizes).clone()
    background = _sync(name, options, False).reduce_flat_async(names, grad.clone(), sizes).wait().clone()
    return {
        "fused": blocking,
        "background": background,
        "per_tensor": per_tensor.reduce_flat(names, grad.clone(), sizes).clone(),
        "bits": (fused.stats.bits_sent, per_tensor.stats.bits_sent),
    }


@pytest.mark.parametrize("name,options", [("topk", {"density": 0.01}), ("signsgd", {}), ("terngrad", {})])
def test_two_ranks_fused_equals_per_tensor_and_the_hook_path(tmp_path, name, options):
    """Deterministic methods give the per-tensor route's mean (top-k bit for bit; signSGD's
    segmented scales to the last bit); TernGrad's chained futures give the blocking result."""
    for result in run_ranks(_fused_against_per_tensor, 2, name, options, tmp_path=tmp_path):
        assert torch.equal(result["fused"], result["background"])
        if name == "topk":
            assert torch.equal(result["fused"], result["per_tensor"])
        elif name == "signsgd":
            # two ranks' scales of opposite signs cancel: compare at the scales' own rounding
            torch.testing.assert_close(result["fused"], result["per_tensor"], rtol=1e-5, atol=1e-5)
        fused_bits, per_tensor_bits = result["bits"]
        assert fused_bits <= per_tensor_bits  # one payload per bucket: no per-tensor padding


def _dgc_hook_step_reads(rank: int, world: int) -> dict:
    """DGC's own hook (DGCDataParallel.install) on the fused route: host reads in steady steps."""
    from torch.nn.parallel import DistributedDataParallel

    from common.strategies.dgc import DGCDataParallel

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(300, 200), nn.ReLU(), nn.Linear(200, 10))
    model = DistributedDataParallel(net, bucket_cap_mb=0.2)
    dgc = DGCDataParallel(build_compressor("dgc", density=0.01), momentum=0.9, weight_decay=1e-4, fused=True)
    optimizer = dgc.install(model, lr=0.1)
    x = torch.randn(16, 300, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(rank))
    reads = []
    for step in range(4):
        optimizer.zero_grad()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if step >= 2:
            reads += _reads(prof.events())
    return {
        "reads": reads,
        "params": [p.detach().clone() for p in net.parameters()],
        "sent": dgc.compressor.sent,
    }


def test_dgcs_own_hook_reads_nothing_and_keeps_the_ranks_equal(tmp_path):
    results = run_ranks(_dgc_hook_step_reads, 2, tmp_path=tmp_path)
    for result in results:
        assert result["reads"] == []
        assert result["sent"] > 0  # the device count, read after the steps
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert torch.equal(a, b)
