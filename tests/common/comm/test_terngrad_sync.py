"""TernGrad through GradientSync on real gloo ranks: scaler sharing, both code transports, fp32 layers."""

from __future__ import annotations

import math

import pytest
import torch

from common.comm import GradientSync
from common.comm.routes.base import code_route
from common.compressors import CompressorRNG, build_compressor
from tests.distributed import run_ranks

SIZES = (1000, 37, 5)


def _grads(rank: int):
    g = torch.Generator().manual_seed(7 + rank)
    return [(f"layer{i}.weight", torch.randn(n, generator=g) * (i + 1)) for i, n in enumerate(SIZES)]


def _sync(options: dict, *, error_feedback: bool = False, bucket: bool = False):
    compressor = build_compressor("terngrad", **options)
    return GradientSync(
        compressor,
        error_feedback=error_feedback,
        bucket_numel=10**6 if bucket else None,
        compress_per_tensor=bucket,
        seed=3,
    )


def _scenarios(rank: int, world: int) -> dict:
    out: dict = {}
    for label, options in {
        "allgather": {"code_transport": "allgather"},
        "allreduce": {"code_transport": "allreduce"},
        "own_scalers": {"shared_scaler": False},
    }.items():
        grads = _grads(rank)
        sync = _sync(options, bucket=True)
        sync.sync(grads)
        out[label] = [t.clone() for _, t in grads]
        out[label + "_stats"] = sync.stats.state_dict()

    # The reference: each rank's ternarization with the agreed (max) scalers, decoded and averaged.
    compressor = build_compressor("terngrad")
    rng = CompressorRNG(3, rank)
    grads = _grads(rank)
    scalers = torch.stack([compressor.scaler(t) for _, t in grads])
    torch.distributed.all_reduce(scalers, op=torch.distributed.ReduceOp.MAX)
    mine = []
    for (name, t), s in zip(grads, scalers):
        rng.reseed(f"{name}#0")  # GradientSync keys each tensor's draws by its name and count
        mine.append(compressor.decompress(compressor.compress(t, rng, scaler=s)))
    everyone = [torch.zeros_like(t) for t in mine]
    for i, t in enumerate(mine):
        parts = [torch.zeros_like(t) for _ in range(world)]
        torch.distributed.all_gather(parts, t)
        everyone[i] = torch.stack(parts).sum(0) / world
    out["reference"] = everyone
    out["scalers"] = scalers

    # The logits layer and small tensors stay fp32: exactly the dense mean.
    grads = _grads(rank)
    dense = [t.clone() for _, t in grads]
    for t in dense:
        torch.distributed.all_reduce(t)
        t /= world
    sync = _sync({"fp32_layers": ["layer0"], "fp32_below": 10}, error_feedback=True, bucket=True)
    sync.sync(grads)
    out["fp32"] = [t.clone() for _, t in grads]
    out["dense"] = dense
    out["fp32_routes"] = dict(sync.stats.routes)

    # Unknown names in the fp32 list: a clear error at the first step.
    sync = _sync({"fp32_layers": ["nope"]})
    try:
        sync.sync(_grads(rank))
        out["unknown_error"] = None
    except ValueError as error:
        out["unknown_error"] = str(error)
    return out


@pytest.fixture(scope="module", params=[2, 4])
def results(request, tmp_path_factory):
    world = request.param
    return world, run_ranks(_scenarios, world, tmp_path=tmp_path_factory.mktemp("terngrad"))


def test_int8_allreduce_path_equals_allgather_path_and_the_reference(results):
    _world, res = results
    for rank_result in res:
        for a, b, ref in zip(rank_result["allgather"], rank_result["allreduce"], rank_result["reference"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(a, ref, rtol=1e-6, atol=1e-6)
    # every rank ends with the same average
    for other in res[1:]:
        for a, b in zip(res[0]["allreduce"], other["allreduce"]):
            assert torch.equal(a, b)


def test_decoded_values_are_multiples_of_the_shared_scaler_over_world(results):
    world, res = results
    for t, s in zip(res[0]["allreduce"], res[0]["scalers"]):
        k = t * world / s  # an integer code sum in [-world, world]
        assert torch.allclose(k, k.round(), atol=1e-4)
        assert k.abs().max() <= world + 1e-4


def test_bits_and_routes_are_counted(results):
    _world, res = results
    n_tensors = len(SIZES)
    gather = res[0]["allgather_stats"]
    codes_bits = sum(8 * math.ceil(n / 4) + 32 for n in SIZES)
    # one max all-reduce of the scalers (fp32 each) + one all-gather of the packed codes and scalers
    assert gather["bits_by_op"] == {"all_reduce": 32 * n_tensors, "all_gather": codes_bits}
    assert gather["routes"] == {"terngrad-allgather": n_tensors}
    reduce = res[0]["allreduce_stats"]
    assert reduce["bits_by_op"] == {"all_reduce": 32 * n_tensors + 8 * sum(SIZES)}  # int8 code sums
    assert reduce["routes"] == {"terngrad-int8-allreduce": n_tensors}
    own = res[0]["own_scalers_stats"]
    assert own["bits_by_op"] == {"all_gather": codes_bits}  # no scaler agreement
    assert own["dense_bits"] == 32 * sum(SIZES)


def test_fp32_layers_and_small_tensors_are_the_exact_dense_mean(results):
    _world, res = results
    fp32, dense = res[0]["fp32"], res[0]["dense"]
    torch.testing.assert_close(fp32[0], dense[0])  # layer0 by name
    torch.testing.assert_close(fp32[2], dense[2])  # 5 entries < fp32_below=10
    assert not torch.allclose(fp32[1], dense[1])  # ternarized
    assert res[0]["fp32_routes"] == {"fp32-allreduce": 2, "terngrad-allgather": 1}


def test_unknown_fp32_layer_names_are_rejected(results):
    _, res = results
    message = res[0]["unknown_error"]
    assert message is not None and "fp32_layers names no parameter or module here: nope" in message
    assert "layer0.weight" in message


def test_auto_picks_the_cheaper_code_transport():
    compressor = _sync({}).compressor
    assert code_route(compressor, 4) == "allgather"  # 6 bits/element against 12
    assert code_route(compressor, 8) == "allgather"  # 14 against 14: all-gather on a tie
    assert code_route(compressor, 16) == "allreduce"  # 30 against 15
    assert code_route(_sync({"shared_scaler": False}).compressor, 64) == "allgather"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"clip": 0}, "clip must be a positive finite number"),
        ({"code_transport": "udp"}, "unknown code_transport 'udp'"),
        ({"code_transport": "allreduce", "shared_scaler": False}, "needs shared_scaler=True"),
        ({"fp32_below": -1}, "fp32_below must be an integer >= 0"),
        ({"fp32_layers": "fc"}, "fp32_layers must be a list"),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        build_compressor("terngrad", **options)


def _hook_with_buckets_in_flight(rank: int, world: int, options: dict) -> dict:
    """TernGrad's fused route through DDP's hook, a bucket per layer (several in flight at once),
    and the explicit path's mean of the same gradients (draws keyed by name and count, scalers
    per tensor: the buckets do not change the mean)."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from common.comm import install_ddp_hook

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            *[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(6)], nn.Linear(64, 10)
        )

    model, local = DistributedDataParallel(net(), bucket_cap_mb=0.01), net()
    hook = install_ddp_hook(model, "terngrad", fused=True, **options)
    explicit = GradientSync(
        build_compressor("terngrad", **options), bucket_numel=10**9, compress_per_tensor=True, fused=True
    )
    data = torch.Generator().manual_seed(rank)
    equal = []
    for _ in range(3):
        x, y = torch.randn(8, 64, generator=data), torch.randint(0, 10, (8,), generator=data)
        for m in (model, local):
            m.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
        explicit.sync([(n, p.grad) for n, p in local.named_parameters()])
        equal.append(
            all(torch.equal(a.grad, b.grad) for a, b in zip(model.module.parameters(), local.parameters()))
        )
    buckets = model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")  # DDP's, after step 1
    return {"buckets": len(buckets), "equal": equal, "routes": dict(hook.stats.routes)}


@pytest.mark.parametrize("transport", ["allgather", "allreduce"])
def test_the_fused_route_through_ddp_with_buckets_in_flight_completes(tmp_path, transport):
    """The codes' round used to be launched (and waited for) inside the scalers' completion
    callback, on gloo's worker thread: with several buckets in flight the ranks deadlocked. A
    deadlock fails here at the timeout instead of hanging."""
    results = run_ranks(
        _hook_with_buckets_in_flight, 2, {"code_transport": transport}, tmp_path=tmp_path, timeout=120
    )
    for result in results:
        assert result["buckets"] == 6
        assert result["equal"] == [True, True, True]  # the explicit path's mean, bit for bit
        assert set(result["routes"]) == {
            f"terngrad-{'int8-allreduce' if transport == 'allreduce' else transport}"
        }
