"""Collectives, CommStats and GradientSync on real gloo ranks (CPU processes)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common.comm import CommStats, GradientSync, all_gather_variable, exchange
from common.compressors import CompressorRNG, build_compressor
from tests.distributed import run_ranks


def _grads(rank: int, sizes=(10, 33, 1)):
    g = torch.Generator().manual_seed(100 + rank)
    return [(f"p{i}", torch.randn(n, generator=g)) for i, n in enumerate(sizes)]


def _scenarios(rank: int, world: int) -> dict:
    out: dict = {}

    # 1. GradientSync(identity) == all-reduce mean; bits counted exactly (32 bits per fp32 entry).
    grads = _grads(rank)
    sync = GradientSync(build_compressor("identity"))
    sync.sync(grads)
    out["identity"] = [t.clone() for _, t in grads]
    out["identity_stats"] = sync.stats.summary()

    # 2. Variable-size all-gather of (fp32 values, int32 indices), sizes differing by rank.
    values = torch.arange(rank + 1, dtype=torch.float32) + 10 * rank
    indices = torch.arange(2 * rank + 3, dtype=torch.int32)
    stats = CommStats()
    gathered = all_gather_variable([values, indices], stats=stats)
    out["gathered"] = [[t.clone() for t in ts] for ts in gathered]
    out["gather_bits"] = stats.bits_sent
    out["gather_calls"] = dict(stats.calls)

    # 3. Top-k through the all-gather transport, no error feedback.
    grads = _grads(rank, sizes=(200,))
    local = grads[0][1].clone()
    sync = GradientSync(build_compressor("topk", density=0.05))
    sync.sync(grads)
    out["topk_local"] = local
    out["topk_mean"] = grads[0][1].clone()
    out["topk_bits"] = sync.stats.bits_sent

    # 4. fp16 all-reduce with error feedback: the residual is what this rank's fp16 cast dropped.
    grads = _grads(rank, sizes=(50,))
    before = grads[0][1].clone()
    sync = GradientSync(build_compressor("fp16"), error_feedback=True)
    sync.sync(grads)
    out["fp16_before"] = before
    out["fp16_mean"] = grads[0][1].clone()
    out["fp16_residual"] = sync.error_feedback.residuals["p0"].clone()

    # 5. Shared-index random-k through all-reduce: the same indices on every rank.
    grads = _grads(rank, sizes=(300,))
    out["randk_local"] = grads[0][1].clone()
    sync = GradientSync(build_compressor("randomk", density=0.1, scaled=False), seed=4)
    sync.sync(grads)
    out["randk_mean"] = grads[0][1].clone()

    # 7. Compress per tensor, communicate per bucket: same result as per tensor, one collective.
    for name, opts, ef in [
        ("topk", {"density": 0.1}, False),
        ("fp16", {}, True),
        ("randomk", {"density": 0.2}, True),
    ]:
        results = {}
        for mode, kwargs in [
            ("per_tensor", {}),
            ("bucket", {"bucket_numel": 10**6, "compress_per_tensor": True}),
        ]:
            grads = _grads(rank, sizes=(40, 7, 100))
            sync = GradientSync(build_compressor(name, **opts), error_feedback=ef, seed=2, **kwargs)
            for _ in range(2):  # twice, so the residuals are used
                sync.sync(grads)
            residuals = sync.error_feedback.residuals if ef else {}
            results[mode] = (
                [t.clone() for _, t in grads],
                dict(sync.stats.calls),
                sync.stats.bits_sent,
                residuals,
            )
        out[f"per_tensor_vs_bucket_{name}"] = results

    # 6. Point-to-point ring exchange.
    send = torch.full((4,), float(rank))
    recv = torch.empty(4)
    stats = CommStats()
    exchange({(rank + 1) % world: send}, {(rank - 1) % world: recv}, stats=stats)
    out["ring"] = recv
    out["ring_bits"] = stats.bits_sent
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request, tmp_path_factory):
    world = request.param
    return world, run_ranks(_scenarios, world, tmp_path=tmp_path_factory.mktemp("comm"))


def test_identity_sync_equals_allreduce_mean(results):
    world, res = results
    for i in range(3):
        expected = sum(t for _, t in [_grads(r)[i] for r in range(world)]) / world
        for r in range(world):
            torch.testing.assert_close(res[r]["identity"][i], expected, rtol=1e-6, atol=1e-7)
    stats = res[0]["identity_stats"]
    assert stats["bits_sent"] == 32 * (10 + 33 + 1) == stats["dense_bits_per_step"]
    assert stats["compression_factor"] == 1.0 and stats["comm_calls"] == 3


def test_variable_size_all_gather(results):
    world, res = results
    for r in range(world):
        got = res[r]["gathered"]
        for src in range(world):
            assert torch.equal(got[src][0], torch.arange(src + 1, dtype=torch.float32) + 10 * src)
            assert torch.equal(got[src][1], torch.arange(2 * src + 3, dtype=torch.int32))
    # counts: 2 int64 per rank; data: padded to the longest rank's bytes (last rank)
    longest = 4 * world + 4 * (2 * (world - 1) + 3)
    assert res[0]["gather_bits"] == 2 * 64 + 8 * longest
    assert res[0]["gather_calls"] == {"all_gather_counts": 1, "all_gather": 1}


def test_topk_allgather_equals_dense_reference(results):
    world, res = results
    comp = build_compressor("topk", density=0.05)
    expected = sum(
        comp.decompress(comp.compress(res[r]["topk_local"], CompressorRNG(0, r))) for r in range(world)
    )
    for r in range(world):  # bit for bit: the route divides only the sent positions, zeros elsewhere
        assert torch.equal(res[r]["topk_mean"], expected / world)
    # fixed k = 10 of 200: values fp32 + indices int32, no size exchange
    assert res[0]["topk_bits"] == 10 * 64


def test_fp16_allreduce_with_error_feedback(results):
    world, res = results
    for r in range(world):
        before = res[r]["fp16_before"]
        assert torch.equal(res[r]["fp16_residual"], before - before.half().float())
    # Each rank sends its fp16 cast divided by the world size (PyTorch's fp16 hook does the same);
    # the half-precision sum is the mean.
    expected = sum(res[r]["fp16_before"].half().div(world) for r in range(world)).float()
    if world == 2:  # one addition: no order to differ in
        assert torch.equal(res[0]["fp16_mean"], expected)
    # gloo sums in fp16 in its own order: equal up to fp16 rounding of partial sums
    torch.testing.assert_close(res[0]["fp16_mean"], expected, rtol=0, atol=1e-3)


def test_randomk_shared_indices_allreduce(results):
    world, res = results
    kept = res[0]["randk_mean"] != 0
    assert int(kept.sum()) == 30
    dense_mean = sum(res[r]["randk_local"] for r in range(world)) / world
    for r in range(world):
        assert torch.equal(res[r]["randk_mean"] != 0, kept)
        torch.testing.assert_close(res[r]["randk_mean"][kept], dense_mean[kept])


@pytest.mark.parametrize("name", ["topk", "fp16", "randomk"])
def test_compress_per_tensor_in_one_collective_per_bucket(results, name):
    world, res = results
    for r in range(world):
        per_tensor, bucket = (
            res[r][f"per_tensor_vs_bucket_{name}"]["per_tensor"],
            res[r][f"per_tensor_vs_bucket_{name}"]["bucket"],
        )
        for a, b in zip(per_tensor[0], bucket[0], strict=True):
            if name == "topk":  # all-gather: every rank sums the same payloads in the same order
                assert torch.equal(a, b)
            else:  # gloo's all-reduce adds chunk by chunk, and a fused buffer is chunked otherwise
                torch.testing.assert_close(a, b, rtol=1e-6, atol=2e-3 if name == "fp16" else 1e-6)
        for key, residual in per_tensor[3].items():  # step 2's input is step 1's (close) mean
            torch.testing.assert_close(residual, bucket[3][key], rtol=1e-5, atol=2e-3)
        assert sum(per_tensor[1].values()) == 3 * 2 and sum(bucket[1].values()) == 1 * 2
        assert per_tensor[2] == bucket[2]  # the same bits, in fewer calls


def test_point_to_point_ring(results):
    world, res = results
    for r in range(world):
        assert torch.equal(res[r]["ring"], torch.full((4,), float((r - 1) % world)))
        assert res[r]["ring_bits"] == 4 * 32


def test_allreduce_refuses_nonlinear_compressor():
    with pytest.raises(ValueError, match="not linear.*Use transport='allgather'"):
        GradientSync(build_compressor("topk", density=0.1), transport="allreduce")
    with pytest.raises(
        ValueError, match="unknown transport 'ring'; valid transports: auto, allreduce, allgather"
    ):
        GradientSync(build_compressor("identity"), transport="ring")


def test_world_size_one_is_a_no_op():
    grads = _grads(0)
    before = [t.clone() for _, t in grads]
    sync = GradientSync(build_compressor("topk", density=0.5), error_feedback=True)
    sync.sync(grads)
    assert sync.stats.bits_sent == 0 and sync.stats.calls == {}
    for (_, t), b in zip(grads, before, strict=True):
        kept = t != 0
        assert torch.equal(t[kept], b[kept])  # the compressed value itself, nothing communicated


# -- DDP comm hook against the explicit path -------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))


def _ddp_vs_explicit(rank: int, world: int, name: str, options: dict, per_tensor: bool = True) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from common.comm import install_ddp_hook

    data = torch.randn(6, 4, 12, generator=torch.Generator().manual_seed(rank))
    target = torch.randint(0, 5, (6, 4), generator=torch.Generator().manual_seed(50 + rank))

    hooked = DDP(_model())
    hook_sync = install_ddp_hook(
        hooked, name, error_feedback=True, compress_per_tensor=per_tensor, seed=3, **options
    )
    explicit = _model()
    explicit_sync = GradientSync(
        build_compressor(name, **options),
        error_feedback=True,
        seed=3,
        bucket_numel=10**9,
        compress_per_tensor=per_tensor,
    )
    opt_h = torch.optim.SGD(hooked.parameters(), lr=0.1, momentum=0.9)
    opt_e = torch.optim.SGD(explicit.parameters(), lr=0.1, momentum=0.9)
    for step in range(6):
        for model, opt in ((hooked, opt_h), (explicit, opt_e)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(data[step]), target[step]).backward()
            if model is explicit:
                explicit_sync.sync_gradients(explicit)
            opt.step()
    return {
        "hooked": [p.detach().clone() for p in hooked.module.parameters()],
        "explicit": [p.detach().clone() for p in explicit.parameters()],
        "hook_bits": hook_sync.stats.bits_sent,
        "explicit_bits": explicit_sync.stats.bits_sent,
        "hook_steps": hook_sync.stats.steps,
        "residual_keys": sorted(hook_sync.error_feedback.residuals),
        "world": dist.get_world_size(),
    }


@pytest.mark.parametrize(
    "name,options,per_tensor",
    [
        # not linear: all-gather inside the hook; per tensor (the default: 10 % of each tensor)
        # and per flat bucket (10 % of the whole bucket)
        ("topk", {"density": 0.1}, True),
        ("topk", {"density": 0.1}, False),
        # linear: the hook's all-reduce runs in the background (overlapped by DDP), then the
        # residual update happens in the future's callback. (Both compressors here give results
        # independent of the bucket's layout, which DDP changes after the first step.)
        ("fp16", {}, True),
    ],
)
def test_ddp_hook_equals_explicit_path(tmp_path, name, options, per_tensor):
    res = run_ranks(_ddp_vs_explicit, 2, name, options, per_tensor, tmp_path=tmp_path)
    for r in res:
        for h, e in zip(r["hooked"], r["explicit"], strict=True):
            torch.testing.assert_close(h, e, rtol=1e-6, atol=1e-7)
        assert r["hook_bits"] == r["explicit_bits"] > 0
        assert r["hook_steps"] == 6
        assert r["residual_keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    # ranks stay identical
    for a, b in zip(res[0]["hooked"], res[1]["hooked"], strict=True):
        assert torch.equal(a, b)


def _thinwire_vs_torch_cast_hook(rank: int, world: int, name: str) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from common.comm import install_ddp_hook

    torch_hook = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[name]
    data = torch.randn(5, 8, 12, generator=torch.Generator().manual_seed(rank))
    target = torch.randint(0, 5, (5, 8), generator=torch.Generator().manual_seed(50 + rank))
    params = {}
    for which in ("thinwire", "torch"):
        # 1e-4 MB buckets: one tensor or two per bucket, several collectives in flight
        model = DDP(_model(), bucket_cap_mb=1e-4)
        if which == "thinwire":
            install_ddp_hook(model, name)
        else:
            model.register_comm_hook(None, torch_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(5):
            opt.zero_grad()
            nn.functional.cross_entropy(model(data[step]), target[step]).backward()
            opt.step()
        params[which] = [p.detach().clone() for p in model.module.parameters()]
    return params


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_the_cast_hooks_equal_pytorchs_bit_for_bit(tmp_path, name):
    """thinwire's fp16 and bf16 hooks do PyTorch's arithmetic: cast, divide by the world size,
    sum in the half dtype, cast back (5 SGD steps on 3 gloo ranks, several buckets; 3, as a
    division by 2 is exact in bf16 whichever side of the sum it is done)."""
    for r in run_ranks(_thinwire_vs_torch_cast_hook, 3, name, tmp_path=tmp_path):
        for ours, theirs in zip(r["thinwire"], r["torch"], strict=True):
            assert torch.equal(ours, theirs)


def test_the_hook_needs_ddp_and_leaves_bucketing_to_it():
    from common.comm import install_ddp_hook

    with pytest.raises(TypeError, match=r"needs the DistributedDataParallel wrapper, got Sequential: wrap"):
        install_ddp_hook(_model(), "topk", density=0.1)
    with pytest.raises(ValueError, match=r"bucket_numel is DDP's through the hook: set .*bucket_cap_mb"):
        install_ddp_hook(object.__new__(DistributedDataParallel), "fp16", bucket_numel=100)


def test_a_hook_keyword_typo_lists_the_hooks_keywords_and_the_compressors_options():
    from common.comm import install_ddp_hook

    ddp = object.__new__(DistributedDataParallel)  # refused before DDP is touched
    hook = "error_feedback, compress_per_tensor, transport, seed, group, stats, fused"
    with pytest.raises(ValueError) as error:
        install_ddp_hook(ddp, "topk", density=0.1, error_feedbak=True)
    assert str(error.value) == (
        f"unknown keyword(s) error_feedbak for install_ddp_hook: its own are {hook}; compressor 'topk' takes density"
    )
    with pytest.raises(ValueError) as error:  # an instance: its options are set when it is built
        install_ddp_hook(ddp, build_compressor("dgc", density=0.01), error_feedbak=True)
    assert str(error.value).startswith(
        f"unknown keyword(s) error_feedbak for install_ddp_hook: its own are {hook}; "
    )
    assert "compressor DGC takes density, sample_ratio, strided_sample" in str(error.value)
    assert str(error.value).endswith("(when it is built, not here)")
    with pytest.raises(
        ValueError, match="compressor 'randomk' option scaled must be true or false, got 'no'"
    ):
        install_ddp_hook(ddp, "randomk", density=0.1, scaled="no")


def test_an_elementwise_compressor_compresses_a_bucket_in_one_call():
    """fp16, bf16 and identity give the same entries per tensor or per bucket: one call per bucket
    (per tensor, MobileNetV2's 158 tensors made thinwire's fp16 hook 1.08x a no-hook DDP step where
    torch's was 1.02x; in one call 1.02x against 0.99x: benchmarks/results/ddp_hooks.md)."""
    for name, units in (("fp16", {"a+b": 1}), ("topk", {"a": 1, "b": 1})):
        options = {"density": 0.5} if name == "topk" else {}
        sync = GradientSync(build_compressor(name, **options), bucket_numel=10**6, compress_per_tensor=True)
        a, b = torch.randn(5), torch.randn(3, 4)
        expected = (a.half().float(), b.half().float())
        sync.sync([("a", a), ("b", b)])
        assert sync._draws == units, name
        if name == "fp16":  # one process: the mean is the cast itself
            assert torch.equal(a, expected[0]) and torch.equal(b, expected[1])


def _gather_in_background(rank: int, world: int) -> dict:
    """Rank 1 joins the all-gather late: rank 0's future is still pending when the hook returns it
    (the collective runs while DDP goes on with the backward pass), and the mean it ends with
    equals the blocking path's."""
    import time

    torch.manual_seed(rank)
    flat = torch.randn(4000)
    sizes = [1000, 3000]
    names = ["a", "b"]
    blocking = GradientSync(
        build_compressor("topk", density=0.05), error_feedback=True, compress_per_tensor=True
    )
    background = GradientSync(
        build_compressor("topk", density=0.05), error_feedback=True, compress_per_tensor=True
    )
    expected = blocking.reduce_flat(names, flat.clone(), sizes).clone()
    if rank == 1:
        time.sleep(1.0)
    future = background.reduce_flat_async(names, flat.clone(), sizes)
    pending = not future.done()
    result = future.wait()
    residuals = {n: background.error_feedback.residuals[n].clone() for n in names}
    return {
        "pending": pending,
        "equal": torch.equal(result, expected),
        "residuals_equal": all(
            torch.equal(residuals[n], blocking.error_feedback.residuals[n]) for n in names
        ),
        "bits": (background.stats.bits_sent, blocking.stats.bits_sent),
    }


def test_the_all_gather_route_runs_in_the_background_and_equals_the_blocking_one(tmp_path):
    results = run_ranks(_gather_in_background, 2, tmp_path=tmp_path)
    assert results[0]["pending"]  # rank 0 got its future before rank 1 had sent anything
    for r in results:
        assert r["equal"] and r["residuals_equal"]
        assert r["bits"][0] == r["bits"][1] > 0


def _launched(reduce, *args) -> tuple:
    """``reduce(*args)``'s future, and how many tensors of at least ``_WHOLE`` entries (a copy of
    the tensors reduced) a ``cat`` made on this thread while launching it (the decoding may run on
    a collective's thread, or here if it completed first: the payloads' own cats are smaller)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class BigCats(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.cat and out.numel() >= _WHOLE:
                BigCats.count += 1
            return out

    with BigCats():
        future = reduce(*args)
    return future, BigCats.count


_WHOLE = 6000  # the entries of the tensors _tensors_where_they_lie reduces


def _tensors_where_they_lie(rank: int, world: int, name: str, fused: bool) -> dict:
    """``reduce_tensors_async`` of every other tensor of a buffer (as DGC's sparsified tensors of a
    DDP bucket), two steps, against ``reduce_flat_async`` of their concatenation; the ``cat`` ops
    each dispatches on this thread."""
    from common.feedback import MomentumCorrection

    def sync() -> GradientSync:
        memory = MomentumCorrection(0.9) if name == "dgc" else True
        return GradientSync(
            build_compressor(name, density=0.05),
            error_feedback=memory,
            transport="allgather",
            bucket_numel=10**9,
            compress_per_tensor=True,
            fused=fused,
        )

    names, sizes, chosen = ["a", "a.bias", "b", "b.bias", "c"], [1000, 7, 3000, 5, 2000], [0, 2, 4]
    assert sum(sizes[i] for i in chosen) == _WHOLE
    views_sync, flat_sync = sync(), sync()
    out: dict = {"equal": [], "in_place": [], "untouched": [], "cats": []}
    for step in range(2):
        buffer = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(10 * rank + step))
        before = buffer.clone()
        views = [t for i, t in enumerate(buffer.split(sizes)) if i in chosen]
        flat = torch.cat(views)
        chosen_names, chosen_sizes = [names[i] for i in chosen], [sizes[i] for i in chosen]
        flat_round = _launched(flat_sync.reduce_flat_async, chosen_names, flat, chosen_sizes)
        views_round = _launched(views_sync.reduce_tensors_async, chosen_names, views)
        cats = [flat_round[1], views_round[1]]
        flat_round[0].wait()
        result = views_round[0].wait()
        out["cats"].append(cats)
        out["equal"].append(torch.equal(torch.cat(result), flat))  # flat: the mean, in place
        out["in_place"].append([t.data_ptr() for t in result] == [v.data_ptr() for v in views])
        kept = [i for i in range(len(sizes)) if i not in chosen]
        out["untouched"].append(
            all(torch.equal(buffer.split(sizes)[i], before.split(sizes)[i]) for i in kept)
        )
    out["residuals"] = all(
        torch.equal(views_sync.error_feedback.residuals[n], flat_sync.error_feedback.residuals[n])
        for n in ("a", "b", "c")
    )
    return out


@pytest.mark.parametrize("name", ["topk", "dgc"])
@pytest.mark.parametrize("fused", [False, True], ids=["per-tensor", "fused"])
def test_tensors_are_reduced_where_they_lie(tmp_path, name, fused):
    """``GradientSync.reduce_tensors_async`` (DGC's hook: its sparsified tensors of a DDP bucket)
    gives the flat bucket's means and residuals bit for bit, written into the tensors, the rest of
    the buffer untouched; on the per-tensor route without gathering them into a flat bucket, on
    the fused route through one (a ``cat`` of them)."""
    for result in run_ranks(_tensors_where_they_lie, 2, name, fused, tmp_path=tmp_path):
        assert result["equal"] == result["in_place"] == result["untouched"] == [True, True]
        assert result["residuals"]
        # the fused route's first step builds its tables (both syncs alike): count the difference
        assert [views - flat for flat, views in result["cats"]] == [1 if fused else 0] * 2
        assert fused or result["cats"] == [[0, 0]] * 2
