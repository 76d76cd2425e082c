"""Detached error feedback (common.strategies.DetachedEFDataParallel) against the update written out."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from common.compressors import CompressorRNG, build_compressor
from common.compressors.random_block import RandomBlock
from common.config import RunConfig
from common.methods import check_run
from common.strategies import DetachedEFDataParallel, check_def_options
from tests.distributed import run_ranks

LR, MOMENTUM, WD, DENSITY, STEPS, SEED = 0.1, 0.9, 0.01, 0.25, 5, 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3))


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def _strategy(options: dict, compressor: str = "random_block") -> DetachedEFDataParallel:
    return DetachedEFDataParallel(
        build_compressor(compressor, density=DENSITY),
        momentum=MOMENTUM,
        weight_decay=WD,
        options=options,
        seed=SEED,
    )


def _step(strategy: DetachedEFDataParallel, model: nn.Module, optimizer, rank: int, step: int) -> None:
    x, y = _data(rank, step)
    optimizer.zero_grad()
    strategy.forward_backward(model, x, y, nn.functional.cross_entropy)
    strategy.after_backward(model)
    optimizer.step()
    strategy.after_step(model)


def _run(rank: int, world_size: int, options: dict, steps: int = STEPS) -> dict[str, object]:
    model = _model()
    strategy = _strategy(options)
    strategy.setup(model)
    optimizer = torch.optim.SGD(strategy.param_groups(model), lr=LR, momentum=0.5, weight_decay=0.5)
    trace = []
    for step in range(steps):
        _step(strategy, model, optimizer, rank, step)
        trace.append(
            {
                "x": {n: v.clone() for n, v in strategy.x.items()},
                "e": {n: strategy.error(n).clone() for n in strategy.x}
                if strategy.options.feedback
                else None,
                "lr_m": {n: LR * m.clone() for n, m in strategy.m.items()},
            }
        )
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "x": {n: v.clone() for n, v in strategy.x.items()},
        "trace": trace,
        "bits": strategy.stats.bits_sent,
        "dense_bits": strategy.stats.dense_bits,
    }


def _reference(world_size: int, mu: float, feedback: bool, average_every: int | None) -> dict[str, dict]:
    """The authors' Def.py (and ef.py at mu = 0) for ``world_size`` workers in one process."""
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    x = {n: p.detach().clone() for n, p in model.named_parameters()}
    e = [{n: torch.zeros_like(x[n]) for n in names} for _ in range(world_size)]
    m = [{n: torch.zeros_like(x[n]) for n in names} for _ in range(world_size)]
    comp, rng = RandomBlock(DENSITY), CompressorRNG(SEED, 0)
    comp2, rng2 = RandomBlock(DENSITY), CompressorRNG(SEED + 7_919, 0)

    draws: dict[tuple[int, str], int] = {}  # GradientSync keys each tensor's draws by (name, count)

    def block_mean(values: list[dict], c: RandomBlock, r: CompressorRNG) -> tuple[dict, list[dict]]:
        """Per tensor one shared block: the mean of the blocks and each worker's kept part."""
        means, kept = {}, [{} for _ in values]
        for n in names:
            sent = []
            payloads = [None] * len(values)
            count = draws.get((id(r), n), 0)
            draws[(id(r), n)] = count + 1
            r.reseed(f"{n}#{count}")
            payloads[0] = c.compress(values[0][n], r)  # one draw per tensor, shared by all
            for k in range(len(values)):
                p = payloads[0].with_wire({"values": _block(values[k][n], payloads[0])})
                sent.append(c.decompress(p))
                kept[k][n] = values[k][n] - sent[-1]
            means[n] = sum(sent) / len(values)
        return means, kept

    for step in range(STEPS):
        p_k = []
        for k in range(world_size):
            for n, p in model.named_parameters():
                with torch.no_grad():
                    p.copy_(x[n] - mu * e[k][n])
            model.zero_grad()
            xb, yb = _data(k, step)
            nn.functional.cross_entropy(model(xb), yb).backward()
            update = {}
            for n, p in model.named_parameters():
                d = p.grad + WD * p.detach()
                m[k][n] = MOMENTUM * m[k][n] + d if step else d.clone()
                update[n] = e[k][n] + LR * m[k][n]
            p_k.append(update)
        c, kept = block_mean(p_k, comp, rng)
        for n in names:
            x[n] = x[n] - c[n]
        e = kept if feedback else [{n: torch.zeros_like(x[n]) for n in names} for _ in range(world_size)]
        if average_every and (step + 1) % average_every == 0:
            for store in ("e", "m"):
                values = e if store == "e" else m
                means, rest = block_mean(values, comp2, rng2)
                new = [{n: means[n] + rest[k][n] for n in names} for k in range(world_size)]
                if store == "e":
                    e = new
                else:
                    m = new
    return {"x": x, "params": [{n: x[n] - mu * e[k][n] for n in names} for k in range(world_size)]}


def _block(value: torch.Tensor, payload) -> torch.Tensor:
    flat = value.reshape(-1)
    k = payload.wire["values"].numel()
    return flat[(torch.arange(k) + payload.local["offset"]) % flat.numel()]


@pytest.mark.parametrize(
    "options",
    [
        {"mu": 0.0},  # classic error feedback (the code's ef.py)
        {"mu": 0.3},  # DEF
        {"mu": 1.0},  # SAEF
        {"mu": 0.3, "average_every": 2},  # DEF-A, the authors' code's variant
        {"feedback": False},  # the block alone
    ],
    ids=["ef", "def", "saef", "def-a", "none"],
)
def test_step_equals_the_update_written_out_on_two_ranks(tmp_path, options: dict) -> None:
    results = run_ranks(_run, 2, options, tmp_path=tmp_path)
    merged = check_def_options(options)
    mu = merged.mu if merged.feedback else 0.0
    ref = _reference(2, mu, merged.feedback, merged.average_every)
    for rank, r in enumerate(results):
        for n, value in ref["x"].items():
            torch.testing.assert_close(r["x"][n], value, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(r["params"][n], ref["params"][rank][n], rtol=1e-5, atol=1e-6)
    # the global model is the same on both ranks, bit for bit
    for n in ref["x"]:
        assert torch.equal(results[0]["x"][n], results[1]["x"][n])
    if mu:  # and the gradient points differ by mu (e_0 - e_1)
        assert any(not torch.equal(results[0]["params"][n], results[1]["params"][n]) for n in ref["x"])


def test_mu_zero_is_classic_error_feedback_step_for_step(tmp_path) -> None:
    ef = run_ranks(_run, 2, {"mu": 0.0}, tmp_path=tmp_path / "ef")
    ref = _reference(2, 0.0, True, None)
    for r in ef:
        for n, value in ref["x"].items():
            torch.testing.assert_close(r["params"][n], value, rtol=1e-5, atol=1e-6)
            assert torch.equal(r["params"][n], r["x"][n])  # mu = 0: the gradient is taken at x


def test_error_is_conserved_and_the_virtual_iterate_is_momentum_sgd(tmp_path) -> None:
    """e_k = p_k - C(p_k) exactly, hence the virtual iterate x - mean(e) moves by -mean(lr m) each
    step; DEF-A's averaging keeps the mean error and the mean momentum (its C2 terms cancel)."""
    for options in ({"mu": 0.3}, {"mu": 0.3, "average_every": 1}):
        results = run_ranks(_run, 4, options, tmp_path=tmp_path / str(len(options)))
        model = _model()
        virtual = {n: p.detach().clone() for n, p in model.named_parameters()}
        for step in range(STEPS):
            for n in virtual:
                virtual[n] = virtual[n] - sum(r["trace"][step]["lr_m"][n] for r in results) / 4
                mean_e = sum(r["trace"][step]["e"][n] for r in results).view_as(virtual[n]) / 4
                torch.testing.assert_close(
                    results[0]["trace"][step]["x"][n] - mean_e, virtual[n], rtol=1e-5, atol=1e-6
                )


def _resume_run(rank: int, world_size: int) -> dict[str, bool]:
    options = {"mu": 0.3, "average_every": 2}
    straight = _run(rank, world_size, options, steps=4)["params"]
    model = _model()
    strategy = _strategy(options)
    strategy.setup(model)
    optimizer = torch.optim.SGD(strategy.param_groups(model), lr=LR)
    for step in range(2):
        _step(strategy, model, optimizer, rank, step)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "strategy": strategy.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    model = _model()
    resumed = _strategy(options)
    resumed.setup(model)
    optimizer = torch.optim.SGD(resumed.param_groups(model), lr=LR)
    model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["strategy"])
    for step in range(2, 4):
        _step(resumed, model, optimizer, rank, step)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"same": all(torch.equal(params[n], straight[n]) for n in params)}


def test_checkpoint_resume_continues_exactly(tmp_path) -> None:
    assert all(r["same"] for r in run_ranks(_resume_run, 2, tmp_path=tmp_path))


def _eval_run(rank: int, world_size: int) -> dict[str, object]:
    out = {}
    for eval_at in ("virtual", "global"):
        model = _model()
        strategy = _strategy({"mu": 0.3, "eval_at": eval_at})
        strategy.setup(model)
        optimizer = torch.optim.SGD(strategy.param_groups(model), lr=LR)
        for step in range(3):
            _step(strategy, model, optimizer, rank, step)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        strategy.before_eval(model)
        out[eval_at] = {n: p.detach().clone() for n, p in model.named_parameters()}
        strategy.after_eval(model)
        out[f"{eval_at}_restored"] = all(torch.equal(p, before[n]) for n, p in model.named_parameters())
        out[f"{eval_at}_x"] = {n: v.clone() for n, v in strategy.x.items()}
        out[f"{eval_at}_e"] = {n: strategy.error(n).clone() for n in strategy.x}
    return out


def test_evaluation_swaps_in_the_virtual_iterate_and_back(tmp_path) -> None:
    results = run_ranks(_eval_run, 2, tmp_path=tmp_path)
    for eval_at in ("virtual", "global"):
        assert all(r[f"{eval_at}_restored"] for r in results)
        for n, value in results[0][eval_at].items():
            assert torch.equal(value, results[1][eval_at][n])  # one evaluated model on all ranks
            x = results[0][f"{eval_at}_x"][n]
            if eval_at == "global":
                assert torch.equal(value, x)
            else:
                mean_e = (results[0]["virtual_e"][n] + results[1]["virtual_e"][n]).view_as(x) / 2
                torch.testing.assert_close(value, x - mean_e)


def test_defa_traffic_is_counted_but_not_its_dense_equivalent(tmp_path) -> None:
    plain = run_ranks(_run, 2, {"mu": 0.3}, tmp_path=tmp_path / "def")[0]
    averaged = run_ranks(_run, 2, {"mu": 0.3, "average_every": 1}, tmp_path=tmp_path / "defa")[0]
    assert averaged["dense_bits"] == plain["dense_bits"]  # the same gradients
    assert averaged["bits"] == 3 * plain["bits"]  # C(p), C2(e), C2(m): three blocks per tensor


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mu": 1.5}, r"def mu must be a number in \[0, 1\]"),
        ({"mu": "0.3"}, r"def mu must be a number in \[0, 1\]"),
        ({"average_every": 0}, "def average_every must be an int >= 1"),
        ({"average_every": 2, "feedback": False}, "needs feedback: true"),
        ({"eval_at": "local"}, "def eval_at must be one of virtual, global"),
        ({"coeff": 0.3}, "unknown def option.*coeff.*allowed: feedback, mu, average_every, eval_at"),
        ({"feedback": "yes"}, "def feedback must be true or false"),
    ],
)
def test_bad_options_rejected(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_def_options(options)
    with pytest.raises(ValueError, match=message):
        check_run(
            RunConfig(
                dataset="cifar10",
                model="vgg_small",
                compressor="random_block",
                compressor_options={"density": 0.1},
                strategy="def",
                strategy_options=options,
            )
        )


def test_config_rejects_what_def_cannot_use() -> None:
    base = dict(dataset="cifar10", model="vgg_small", compressor="random_block", strategy="def")
    with pytest.raises(ValueError, match="density"):
        check_run(RunConfig(**base))  # random_block needs its density
    with pytest.raises(ValueError, match="strategy def applies momentum SGD itself: optimizer must be sgd"):
        check_run(RunConfig(**base, compressor_options={"density": 0.1}, optimizer="adamw"))
    with pytest.raises(ValueError, match="set error_feedback: false"):
        check_run(RunConfig(**base, compressor_options={"density": 0.1}, error_feedback=True))
    with pytest.raises(ValueError, match="average_every .*compressor 'identity' has none"):
        DetachedEFDataParallel(
            build_compressor("identity"), momentum=0.9, weight_decay=0.0, options={"average_every": 1}
        )
