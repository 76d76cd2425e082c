"""Sparse AxoNN's compact state (papers/sparse_axonn/compact.py) and the sparse-compute baseline
(papers/sparse_axonn/sparse_compute.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from common.comm import CommStats
from papers.sparse_axonn.compact import CompactAdamW, MaskLayout, compact_all_reduce_, model_state_bytes
from papers.sparse_axonn.pruning import apply_masks, magnitude_masks
from papers.sparse_axonn.sparse_compute import SparseLinear, to_sparse_compute
from tests.distributed import run_ranks
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
    return nn.Sequential(nn.Linear(13, 21), nn.LayerNorm(21), nn.Tanh(), nn.Linear(21, 5))


def _pruned_net(sparsity: float = 0.7, seed: int = 0):
    net = _net(seed)
    masks = magnitude_masks(net, sparsity)
    apply_masks(net, masks)
    return net, masks


def _loss(model: nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    if isinstance(model, nn.Sequential):
        return model(torch.randn(8, 13, generator=g)).square().mean()
    ids = torch.randint(0, 64, (2, 12), generator=g)
    return model(ids, labels=ids).loss


def test_layout_packs_in_parameter_order_and_unpacks_back():
    net, masks = _pruned_net()
    layout = MaskLayout(net, masks)
    params = dict(net.named_parameters())
    expected = torch.cat([params[n][masks[n]] if n in masks else params[n].reshape(-1) for n in params])
    assert layout.names == tuple(params)
    assert layout.num_kept == expected.numel() == sum(int(m.sum()) for m in masks.values()) + 21 + 42 + 5
    assert layout.numel == sum(p.numel() for p in params.values())
    assert torch.equal(layout.pack_params(net), expected.detach())

    clone = _net(seed=1)
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    layout.unpack_(layout.pack_params(net), clone, into="params")
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), clone.parameters(), strict=True))

    for p in net.parameters():
        p.grad = torch.full_like(p, 7.0)
    compact = layout.pack_grads(net)
    layout.unpack_(compact * 2, net, into="grads")
    for name, p in net.named_parameters():  # reduced entries written, pruned gradient entries zeroed
        assert torch.equal(
            p.grad, torch.where(masks[name], 14.0, 0.0) if name in masks else torch.full_like(p, 14.0)
        )
    with pytest.raises(ValueError, match=r"compact must be 1-D with \d+ entries, got shape \(3,\)"):
        layout.unpack_(torch.zeros(3), net)


def test_layout_fingerprint_depends_on_the_masks_only():
    net, masks = _pruned_net()
    assert MaskLayout(net, masks).fingerprint == MaskLayout(_net(seed=5), masks).fingerprint
    MaskLayout(net, masks).verify_across_ranks()  # world size 1: nothing to disagree with
    moved = {n: m.clone() for n, m in masks.items()}
    flat = moved["0.weight"].view(-1)
    kept, pruned = int(torch.nonzero(flat)[0]), int(torch.nonzero(~flat)[0])
    flat[kept], flat[pruned] = False, True  # same count, one entry moved
    assert MaskLayout(net, moved).fingerprint != MaskLayout(net, masks).fingerprint


def _step_both(dense, compact, dense_opt, compact_opt, layout, masks, step):
    for model in (dense, compact):
        _loss(model, step).backward()
    with torch.no_grad():
        for name, p in dense.named_parameters():
            if name in masks:
                p.grad.mul_(masks[name])
    dense_opt.step()
    dense_opt.zero_grad()
    compact_opt.step(layout.pack_grads(compact))
    compact_opt.zero_grad()


@pytest.mark.parametrize(
    ("make", "steps"), [(lambda: _pruned_net(0.7), 200), (None, 10)], ids=["mlp", "gpt2"]
)
def test_compact_adamw_equals_torch_adamw_on_the_masked_model_bit_for_bit(make, steps):
    if make is None:  # tiny GPT-2: Conv1D layers, tied embeddings, LayerNorms (dense in the layout)
        dense = tiny_gpt2()
        masks = magnitude_masks(dense, 0.8)
        apply_masks(dense, masks)
    else:
        dense, masks = make()
    compact = copy.deepcopy(dense)
    hparams = {"lr": 1e-2, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1}
    # foreach=False: the single-tensor path (the CPU default), whose op order CompactAdamW follows.
    dense_opt = torch.optim.AdamW(dense.parameters(), foreach=False, **hparams)
    layout = MaskLayout(compact, masks)
    compact_opt = CompactAdamW(compact, layout, **hparams)
    start = {n: p.detach().clone() for n, p in dense.named_parameters()}
    for step in range(steps):
        _step_both(dense, compact, dense_opt, compact_opt, layout, masks, step)
        for (name, a), b in zip(dense.named_parameters(), compact.parameters(), strict=True):
            assert torch.equal(a, b), f"{name} differs at step {step}"
    for name, p in compact.named_parameters():
        if name in masks:
            assert (p[~masks[name]] == 0).all()
            assert not torch.equal(p[masks[name]], start[name][masks[name]])  # it did train
    assert compact_opt.exp_avg.shape == (layout.num_kept,) and layout.num_kept < layout.numel


def test_compact_adamw_state_dict_resumes_exactly():
    net, masks = _pruned_net()
    layout = MaskLayout(net, masks)
    opt = CompactAdamW(net, layout, lr=1e-2)
    for step in range(3):
        _loss(net, step).backward()
        opt.step(layout.pack_grads(net))
        opt.zero_grad()
    state, params = opt.state_dict(), copy.deepcopy(net)
    for step in range(3, 5):
        _loss(net, step).backward()
        opt.step(layout.pack_grads(net))
        opt.zero_grad()

    resumed = CompactAdamW(params, MaskLayout(params, masks), lr=0.5)
    resumed.load_state_dict(state)
    assert resumed.lr == 1e-2 and resumed.num_steps == 3
    for step in range(3, 5):
        _loss(params, step).backward()
        resumed.step(resumed.layout.pack_grads(params))
        resumed.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), params.parameters(), strict=True))

    other = magnitude_masks(net, 0.5)
    with pytest.raises(ValueError, match="optimizer state was saved with another mask layout"):
        CompactAdamW(net, MaskLayout(net, other)).load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": -1.0}, r"lr must be in \[0.0, inf\], got -1.0"),
        ({"betas": (1.0, 0.999)}, r"beta1 must be in \[0.0, 1.0\), got 1.0"),
        ({"betas": (0.9,)}, r"betas must be a pair \(beta1, beta2\), got \(0.9,\)"),
        ({"eps": -1e-8}, r"eps must be in \[0.0, inf\], got -1e-08"),
        ({"weight_decay": "0.1"}, r"weight_decay must be a real number, got '0.1'"),
    ],
)
def test_compact_adamw_rejects_bad_hyperparameters(kwargs, message):
    net, masks = _pruned_net()
    with pytest.raises(ValueError, match=message):
        CompactAdamW(net, MaskLayout(net, masks), **kwargs)


def test_compact_adamw_rejects_unmasked_weights_and_wrong_gradients():
    net = _net()
    masks = magnitude_masks(net, 0.5)
    pruned = int((~masks["0.weight"]).sum())  # every pruned entry of a random init is nonzero
    with pytest.raises(
        ValueError, match=rf"parameter '0.weight' has {pruned} nonzero entries at pruned positions"
    ):
        CompactAdamW(net, MaskLayout(net, masks))
    apply_masks(net, masks)
    opt = CompactAdamW(net, MaskLayout(net, masks))
    with pytest.raises(
        ValueError,
        match=r"compact_grad must be a float tensor of shape \(\d+,\), got torch.float32 of shape \(4,\)",
    ):
        opt.step(torch.zeros(4))


# Distributed: 4 gloo ranks, one spawn for every scenario (rank start-up is the cost).
def _ranks_scenarios(rank: int, world: int) -> dict:
    out: dict = {}
    net, masks = _pruned_net(0.75)  # same seed on every rank: the same masks, computed once each
    layout = MaskLayout(net, masks)
    layout.verify_across_ranks()
    out["fingerprint"] = layout.fingerprint
    out["num_kept"] = layout.num_kept
    # Which (parameter, flat position) sits at each compact slot, packed on this rank.
    positions = copy.deepcopy(net)
    with torch.no_grad():
        for i, p in enumerate(positions.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 1000 * i)
    out["order"] = layout.pack_params(positions)

    # Compact all-reduce == dense all-reduce restricted to the kept entries. Integer-valued
    # gradients make every summation order exact, so the comparison can be torch.equal.
    g = torch.Generator().manual_seed(rank)
    for p in net.parameters():
        p.grad = torch.randint(-50, 50, p.shape, generator=g).float()
    dense = copy.deepcopy(net)
    for p, local in zip(dense.parameters(), net.parameters(), strict=True):
        p.grad = local.grad.clone()
        dist.all_reduce(p.grad)
        p.grad.div_(world)
    stats = CommStats()
    compact = compact_all_reduce_(layout.pack_grads(net), stats=stats)
    out["compact_equals_dense"] = torch.equal(compact, layout.pack_grads(dense))
    compact_all_reduce_(layout.pack_grads(net, torch.float16), stats=stats)
    out["bits"], out["calls"] = stats.bits_sent, stats.calls["all_reduce"]

    # One training step on rank-local data: every rank ends with the same parameters.
    opt = CompactAdamW(net, layout, lr=1e-2)
    opt.zero_grad()
    _loss(net, 100 + rank).backward()
    opt.step(compact_all_reduce_(layout.pack_grads(net)))
    out["params"] = layout.pack_params(net)

    # A rank with other masks is caught on every rank.
    mine = magnitude_masks(net, 0.5 if rank == 3 else 0.75)
    try:
        MaskLayout(net, mine).verify_across_ranks()
        out["mismatch"] = None
    except ValueError as error:
        out["mismatch"] = str(error)
    return out


def test_compact_all_reduce_on_four_gloo_ranks(tmp_path):
    results = run_ranks(_ranks_scenarios, 4, tmp_path=tmp_path, timeout=90)
    net, masks = _pruned_net(0.75)
    layout = MaskLayout(net, masks)
    k = layout.num_kept
    assert {r["fingerprint"] for r in results} == {layout.fingerprint}
    assert all(r["num_kept"] == k for r in results)
    for r in results:  # the same slot holds the same (parameter, position) on every rank
        assert torch.equal(r["order"], results[0]["order"])
    params = list(net.parameters())
    expected = torch.cat(
        [
            (torch.nonzero(masks[n].reshape(-1)).view(-1) if n in masks else torch.arange(p.numel())).float()
            + 1000 * i
            for i, (n, p) in enumerate(zip(layout.names, params, strict=True))
        ]
    )
    assert torch.equal(results[0]["order"], expected)
    assert all(r["compact_equals_dense"] for r in results)
    assert all(r["bits"] == k * 32 + k * 16 and r["calls"] == 2 for r in results)  # fp32 call + fp16 call
    for r in results:
        assert torch.equal(r["params"], results[0]["params"])
    assert all("mask layouts differ across ranks (ranks [3] disagree" in r["mismatch"] for r in results[:3])
    assert "ranks [0, 1, 2] disagree" in results[3]["mismatch"]


def test_compact_all_reduce_at_world_size_one_is_a_no_op():
    stats = CommStats()
    x = torch.arange(5.0)
    assert torch.equal(compact_all_reduce_(x, stats=stats), torch.arange(5.0))
    assert stats.bits_sent == 0
    with pytest.raises(ValueError, match=r"compact must be a contiguous 1-D tensor, got shape \(2, 2\)"):
        compact_all_reduce_(torch.zeros(2, 2))


# model_state_bytes on Linear(100, 50) + Linear(50, 10): N = 5560 trainable entries, of which the
# 5500 weight entries are masked layerwise and the 60 bias entries stay dense.
#   dense AdamW, fp32:  params 4N + grads 4N + exp_avg 4N + exp_avg_sq 4N = 16 N = 88960 B
#   compact, fp32:      8 N (dense params + grads) + 16 K (master, m, v, compact grad; 4 B each)
#   K = 60 + kept weights = 60 + (5000 + 500) - round(s 5000) - round(s 500), s = 1 - density
@pytest.mark.parametrize(
    ("density", "num_kept", "compact_total"),
    [(1.0, 5560, 133440), (0.5, 2810, 89440), (0.2, 1160, 63040), (0.1, 610, 54240)],
)
def test_model_state_bytes_matches_the_arithmetic(density, num_kept, compact_total):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 10))
    masks = magnitude_masks(net, 1 - density, scope="layerwise")
    apply_masks(net, masks)
    assert MaskLayout(net, masks).num_kept == num_kept
    assert compact_total == 8 * 5560 + 16 * num_kept
    dense = model_state_bytes(net, masks, "dense")
    assert dense == {
        "params": 22240, "grads": 22240, "master": 0, "exp_avg": 22240, "exp_avg_sq": 22240,
        "compact_grad": 0, "layout_indices": 0, "total": 88960,
    }  # fmt: skip
    compact = model_state_bytes(net, masks, "compact")
    assert compact["total"] == compact_total
    assert (
        compact["master"]
        == compact["exp_avg"]
        == compact["exp_avg_sq"]
        == compact["compact_grad"]
        == 4 * num_kept
    )
    assert compact["layout_indices"] == 4 * (num_kept - 60)

    # Counted from the optimizers' real tensors after a step: the same numbers.
    twin = copy.deepcopy(net)
    dense_opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, 100)).sum().backward()
    dense_opt.step()
    assert model_state_bytes(net, masks, "dense", optimizer=dense_opt) == dense
    layout = MaskLayout(twin, masks)
    compact_opt = CompactAdamW(twin, layout)
    twin(torch.randn(2, 100)).sum().backward()
    compact_opt.step(layout.pack_grads(twin))
    assert model_state_bytes(net, masks, "compact", optimizer=compact_opt) == compact


def test_model_state_bytes_counts_the_model_dtype():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 10)).to(torch.bfloat16)
    masks = magnitude_masks(net, 0.9, scope="layerwise")
    assert model_state_bytes(net, masks, "dense")["total"] == 8 * 5560  # bf16 params, grads, m, v
    assert model_state_bytes(net, masks, "compact")["total"] == 4 * 5560 + 16 * 610  # 2 + 2 B dense
    with pytest.raises(ValueError, match="optimizer_kind must be 'dense' or 'compact', got 'sparse'"):
        model_state_bytes(net, masks, "sparse")  # type: ignore[arg-type]


def test_sparse_linear_matches_the_masked_dense_layer_and_trains_only_kept_weights():
    net, masks = _pruned_net(0.8)
    sparse = copy.deepcopy(net)
    assert to_sparse_compute(sparse, masks) == ["0", "3"]
    assert isinstance(sparse[0], SparseLinear) and sparse[0].values.numel() == int(masks["0.weight"].sum())
    assert torch.equal(sparse[0].dense_weight(), net[0].weight.detach())
    x = torch.randn(4, 3, 13, requires_grad=True)
    x_dense = x.detach().clone().requires_grad_()
    y, y_dense = sparse(x), net(x_dense)
    torch.testing.assert_close(y, y_dense, rtol=0, atol=1e-5)
    y.square().sum().backward()
    y_dense.square().sum().backward()
    torch.testing.assert_close(x.grad, x_dense.grad, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        sparse[0].values.grad, net[0].weight.grad[masks["0.weight"]], rtol=0, atol=1e-5
    )

    opt = torch.optim.AdamW(sparse.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(20):
        opt.zero_grad()
        _loss(sparse, step).backward()
        opt.step()
    for i, name in [(0, "0.weight"), (3, "3.weight")]:
        weight = sparse[i].dense_weight()
        assert (weight[~masks[name]] == 0).all()
        assert (weight[masks[name]] != net[i].weight.detach()[masks[name]]).all()


def test_sparse_compute_on_gpt2_matches_the_masked_dense_model():
    dense = tiny_gpt2()
    masks = magnitude_masks(dense, 0.8)
    apply_masks(dense, masks)
    sparse = copy.deepcopy(dense)
    replaced = to_sparse_compute(sparse, masks)
    assert len(replaced) == 8  # the Conv1D layers; the embeddings stay dense (masked)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sparse(ids).logits, dense(ids).logits, rtol=0, atol=1e-5)
    loss = sparse(ids, labels=ids).loss
    loss.backward()
    dense(ids, labels=ids).loss.backward()
    layer, name = sparse.transformer.h[0].mlp.c_fc, "transformer.h.0.mlp.c_fc.weight"
    reference = dense.transformer.h[0].mlp.c_fc.weight.grad[masks[name]]
    torch.testing.assert_close(layer.values.grad, reference, rtol=0, atol=1e-5)


def test_sparse_compute_refuses_what_it_cannot_do():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    net[1].weight = net[0].weight
    masks = {"0.weight": torch.ones(4, 4, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"'0.weight' is tied to \['1.weight'\]"):
        to_sparse_compute(net, masks)
    with pytest.raises(ValueError, match="CSR matmul on CPU supports .* got weight dtype torch.float16"):
        SparseLinear(torch.zeros(3, 2, dtype=torch.float16), torch.ones(3, 2, dtype=torch.bool))
