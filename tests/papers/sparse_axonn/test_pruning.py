"""Magnitude pruning, iterative pruning with rewinding, and mask files (papers.sparse_axonn.pruning)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from papers.sparse_axonn.pruning import (
    apply_masks,
    check_masks,
    load_masks,
    lottery_ticket,
    magnitude_masks,
    masks_sparsity,
    prunable_parameters,
    pruned_nonzero,
    save_masks,
)
from tests.helpers.models import tiny_gpt2


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only contend (a tiny MLP's backward measured 16x slower with
    2 threads than with 1 on this 2-core machine under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 30), nn.LayerNorm(30), nn.ReLU(), nn.Linear(30, 7))


def test_prunable_parameters_are_the_weight_matrices_only():
    net = nn.Sequential(
        nn.Embedding(5, 4), nn.Conv2d(4, 3, 2), nn.BatchNorm2d(3), nn.Linear(3, 2), nn.LayerNorm(2)
    )
    assert [n for n, _ in prunable_parameters(net)] == ["0.weight", "1.weight", "3.weight"]

    gpt2 = tiny_gpt2()
    names = [n for n, _ in prunable_parameters(gpt2)]
    per_block = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]
    expected = ["transformer.wte.weight", "transformer.wpe.weight"]
    expected += [f"transformer.h.{i}.{s}" for i in range(2) for s in per_block]
    assert names == expected  # Conv1D weights in, biases and LayerNorms out, lm_head tied to wte
    assert "lm_head.weight" not in dict(gpt2.named_parameters())

    from trainer.models import GPT2LanguageModel  # the library's wrapper: same weights, one prefix

    wrapped = GPT2LanguageModel(vocab_size=64, n_embd=32, n_positions=32)
    assert [n for n, _ in prunable_parameters(wrapped)] == [f"gpt2.{n}" for n in expected]


def _pruned(masks):
    return {n: int((~m).sum()) for n, m in masks.items()}


def test_global_masks_prune_the_smallest_weights_over_all_tensors():
    net = _net()
    named = prunable_parameters(net)
    masks = magnitude_masks(net, 0.7, scope="global")
    assert list(masks) == ["0.weight", "3.weight"]
    total = sum(p.numel() for _, p in named)  # 600 + 210
    assert sum(_pruned(masks).values()) == round(0.7 * total) == 567
    kept = torch.cat([p.detach().abs()[masks[n]] for n, p in named])
    dropped = torch.cat([p.detach().abs()[~masks[n]] for n, p in named])
    assert dropped.max() <= kept.min()  # one threshold for all tensors
    assert masks_sparsity(masks) == pytest.approx(567 / 810)


def test_layerwise_masks_prune_each_tensor_at_the_sparsity():
    net = _net()
    masks = magnitude_masks(net, 0.7, scope="layerwise")
    assert _pruned(masks) == {"0.weight": 420, "3.weight": 147}
    for name, p in prunable_parameters(net):
        assert p.detach().abs()[~masks[name]].max() <= p.detach().abs()[masks[name]].min()


def test_counts_round_to_nearest_and_ties_prune_the_earlier_entry():
    # 0.29 * 100 is 28.999... in floating point: rounding down would prune 28.
    masks = magnitude_masks({"w": torch.randn(100)}, 0.29)
    assert int((~masks["w"]).sum()) == 29
    # All magnitudes equal: exactly the requested count, the lowest flat positions first.
    masks = magnitude_masks({"a": torch.ones(3, 4), "b": -torch.ones(5)}, 0.5)
    assert masks["a"].reshape(-1).tolist() == [False] * 8 + [True] * 4
    assert masks["b"].tolist() == [True] * 5
    again = magnitude_masks({"a": torch.ones(3, 4), "b": -torch.ones(5)}, 0.5)
    assert all(torch.equal(masks[n], again[n]) for n in masks)


@pytest.mark.parametrize("scope", ["global", "layerwise"])
def test_iterative_pruning_keeps_pruned_entries_pruned(scope):
    net = _net()
    first = magnitude_masks(net, 0.5, scope=scope)
    with torch.no_grad():  # revive the pruned weights with large values: they must stay pruned
        for name, p in prunable_parameters(net):
            p[~first[name]] = 100.0
    second = magnitude_masks(net, 0.5, scope=scope, existing=first)
    for name in first:
        assert not (second[name] & ~first[name]).any()
    kept_before = sum(int(m.sum()) for m in first.values())
    if scope == "global":
        assert sum(int(m.sum()) for m in second.values()) == kept_before - round(0.5 * kept_before)
    else:
        for name in first:
            kept = int(first[name].sum())
            assert int(second[name].sum()) == kept - round(0.5 * kept)


@pytest.mark.parametrize(
    ("sparsity", "message"),
    [
        (-0.1, r"sparsity must be in \[0, 1\) .* got -0.1"),
        (1.0, r"sparsity must be in \[0, 1\) .* got 1.0"),
        (1.5, r"sparsity must be in \[0, 1\) .* got 1.5"),
        ("0.5", r"sparsity must be a real number in \[0, 1\), got '0.5' \(str\)"),
        (True, r"must be a real number .* got True \(bool\)"),
        (math.nan, r"sparsity must be in \[0, 1\) .* got nan"),
    ],
)
def test_bad_sparsity_is_rejected(sparsity, message):
    with pytest.raises(ValueError, match=message):
        magnitude_masks(_net(), sparsity)


def test_bad_scope_and_bad_existing_masks_are_rejected():
    net = _net()
    with pytest.raises(ValueError, match=r"scope must be one of \('global', 'layerwise'\), got 'local'"):
        magnitude_masks(net, 0.5, scope="local")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"existing mask '0.bias' names none of the tensors being pruned"):
        magnitude_masks(net, 0.5, existing={"0.bias": torch.ones(30, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"existing mask '3.weight' must be torch.bool of shape \(7, 30\)"):
        magnitude_masks(net, 0.5, existing={"3.weight": torch.ones(7, 30)})


def test_bad_masks_are_rejected_with_the_parameter_and_shapes():
    net = _net()
    with pytest.raises(
        ValueError, match=r"mask '0.weight' has shape \(20, 30\) but the parameter has shape \(30, 20\)"
    ):
        check_masks(net, {"0.weight": torch.ones(20, 30, dtype=torch.bool)})
    with pytest.raises(
        ValueError, match=r"mask 'fc.weight' names no parameter of Sequential.*0.weight, 0.bias"
    ):
        apply_masks(net, {"fc.weight": torch.ones(30, 20, dtype=torch.bool)})
    with pytest.raises(
        ValueError, match=r"mask '3.weight' has dtype torch.float32; masks must be torch.bool"
    ):
        apply_masks(net, {"3.weight": torch.ones(7, 30)})


def test_apply_masks_zeroes_exactly_the_pruned_entries():
    net = _net()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    masks = magnitude_masks(net, 0.6)
    apply_masks(net, masks)
    for name, p in net.named_parameters():
        if name in masks:
            assert (p[~masks[name]] == 0).all()
            assert torch.equal(p[masks[name]], before[name][masks[name]])
        else:
            assert torch.equal(p, before[name])  # biases and LayerNorm untouched


def _train_by_noise(log):
    """A stand-in for training: moves every weight by a fixed pseudo-random amount, masked."""

    def train_fn(model, masks):
        log.append({n: m.clone() for n, m in masks.items()})
        g = torch.Generator().manual_seed(len(log))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g))
        apply_masks(model, masks)

    return train_fn


@pytest.mark.parametrize("rounds", [1, 3])
def test_lottery_ticket_rewinds_unpruned_weights_to_the_early_state(rounds):
    net = _net()
    with torch.no_grad():  # the "weights after k steps" to rewind to
        for p in net.parameters():
            p.mul_(1.5)
    rewind = {k: v.clone() for k, v in net.state_dict().items()}
    log: list = []
    masks = lottery_ticket(net, _train_by_noise(log), 0.8, rounds, scope="layerwise", rewind_state=rewind)

    assert len(log) == rounds
    assert all(m.all() for m in log[0].values())  # the first round trains dense
    for earlier, later in zip([*log[1:], masks], log, strict=True):
        for name in masks:  # every round's mask inside the previous one
            assert not (earlier[name] & ~later[name]).any()
    state = net.state_dict()
    for name, value in state.items():
        if name in masks:
            assert torch.equal(value[masks[name]], rewind[name][masks[name]])
            assert (value[~masks[name]] == 0).all()
        else:
            assert torch.equal(value, rewind[name])
    for mask in masks.values():  # within rounding (at most one entry per round) of 80 %
        assert abs(int((~mask).sum()) - 0.8 * mask.numel()) <= rounds


def test_one_shot_lottery_ticket_is_magnitude_pruning_of_the_trained_weights():
    net, twin = _net(), _net()
    masks = lottery_ticket(net, _train_by_noise([]), 0.5, 1, scope="global")
    _train_by_noise([])(twin, {n: torch.ones_like(p, dtype=torch.bool) for n, p in prunable_parameters(twin)})
    expected = magnitude_masks(twin, 0.5, scope="global")
    assert all(torch.equal(masks[n], expected[n]) for n in expected)
    assert torch.equal(net[0].bias, _net()[0].bias)  # rewound to the weights on entry (the default)


@pytest.mark.parametrize("rounds", [0, 1.5, True])
def test_lottery_ticket_rejects_bad_rounds(rounds):
    with pytest.raises(ValueError, match=rf"rounds must be an int >= 1 .*got {rounds!r}"):
        lottery_ticket(_net(), lambda m, k: None, 0.5, rounds)


def test_masks_round_trip_through_a_file_with_metadata(tmp_path):
    net = _net()
    masks = magnitude_masks(net, 0.75, scope="layerwise")
    path = tmp_path / "masks.pt"
    save_masks(path, masks, net, scope="layerwise")
    saved = load_masks(path, net)
    assert saved.scope == "layerwise"
    assert saved.sparsity == pytest.approx(0.75, abs=1e-3)
    assert saved.shapes == {"0.weight": (30, 20), "3.weight": (7, 30)}
    assert all(torch.equal(saved.masks[n], masks[n]) for n in masks)

    other = nn.Sequential(nn.Linear(20, 31), nn.LayerNorm(31), nn.ReLU(), nn.Linear(31, 7))
    with pytest.raises(
        ValueError, match=r"mask '0.weight' has shape \(30, 20\) but the parameter has shape \(31, 20\)"
    ):
        load_masks(path, other)

    record = torch.load(path, weights_only=True)
    record["shapes"]["3.weight"] = [7, 31]
    torch.save(record, tmp_path / "tampered.pt")
    with pytest.raises(
        ValueError,
        match=r"mask '3.weight' is torch.bool of shape \(7, 30\), the file records shape \(7, 31\)",
    ):
        load_masks(tmp_path / "tampered.pt")

    torch.save({"0.weight": masks["0.weight"]}, tmp_path / "bare.pt")
    with pytest.raises(ValueError, match=r"is not a mask file of format 'thinwire.pruning_masks/1'"):
        load_masks(tmp_path / "bare.pt")


def test_pruned_nonzero_counts_pruned_entries_that_are_not_zero_and_skips_other_stages():
    model = torch.nn.Linear(4, 3)
    masks = {
        "weight": model.weight.detach().abs() > 0.2,
        "other_stage.weight": torch.ones(2, dtype=torch.bool),
    }
    expected = int((model.weight.detach()[~masks["weight"]] != 0).sum())
    assert expected > 0 and pruned_nonzero(model, masks) == {"weight": expected}
    apply_masks(model, {"weight": masks["weight"]})
    assert pruned_nonzero(model, masks) == {"weight": 0}
