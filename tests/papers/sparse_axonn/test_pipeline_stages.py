"""Pipeline x data parallelism (papers/sparse_axonn/pipeline_stages.py): equal to single-process
training, exact p2p bytes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from papers.sparse_axonn.pipeline_stages import (
    GPT2Stage,
    PipelineTrainer,
    ProcessGrid,
    grid_shape,
    split_blocks,
)
from tests.distributed import run_ranks

N_LAYER, N_EMBD, VOCAB, SEQ, BATCH, STEPS, LR = 4, 32, 64, 16, 8, 3, 0.1


def _gpt2(tied: bool = False):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=N_EMBD,
        n_layer=N_LAYER,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=tied,
    )
    return GPT2LMHeadModel(config)


def _optimizer(module):
    # SGD with momentum, not Adam: GPT-2's key biases get an exactly-zero gradient (softmax is
    # invariant to them), so their float noise, which differs with the summation order, would be
    # normalised by Adam into updates of size lr and the comparison would test noise.
    return torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)


def _batches():
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1), generator=g)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def _train(num_stages: int, schedule: str, num_microbatches: int) -> dict:
    """Train this rank's stage for STEPS optimizer steps; what a rank reports back."""
    model = _gpt2()
    grid = ProcessGrid.create(num_stages, num_blocks=N_LAYER)
    stage = GPT2Stage(model, grid.stage, grid.num_stages)
    optimizer = _optimizer(stage)
    trainer = PipelineTrainer(stage, grid, optimizer, num_microbatches=num_microbatches, schedule=schedule)
    steps = [trainer.train_step(x, y) for x, y in _batches()]
    return {
        "grid": (grid.stage, grid.replica, grid.prev_rank, grid.next_rank),
        "dp_ranks": dist.get_process_group_ranks(grid.data_parallel_group) if dist.is_initialized() else [0],
        "pp_ranks": dist.get_process_group_ranks(grid.pipeline_group) if dist.is_initialized() else [0],
        "params": {n: p.detach().clone() for n, p in stage.named_parameters()},
        "steps": steps,
        "memory": trainer.model_state_bytes(),
        "num_params": sum(p.numel() for p in stage.parameters()),
        "p2p_ops": dict(trainer.p2p_stats.calls),
    }


SCENARIOS = {  # name -> (num_stages, schedule, num_microbatches) on 4 ranks
    "2x2_gpipe": (2, "gpipe", 2),
    "2x2_1f1b": (2, "1f1b", 2),
    "4x1_gpipe": (4, "gpipe", 2),
    "1x4": (1, "gpipe", 2),
}


def _scenarios(rank: int, world: int) -> dict:
    return {name: _train(*args) for name, args in SCENARIOS.items()}


@pytest.fixture(scope="module")
def reference():
    """Single-process training of the whole model on the whole global batch."""
    model = _gpt2()
    optimizer = _optimizer(model)
    losses = []
    for x, y in _batches():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(_scenarios, 4, tmp_path=tmp_path_factory.mktemp("pipeline"), timeout=240)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_pipeline_equals_single_process_training(ranks, reference, name):
    ref_params, ref_losses = reference
    outs = [r[name] for r in ranks]
    for out in outs:  # every rank returns the global mean loss
        assert [s.loss for s in out["steps"]] == pytest.approx(ref_losses, abs=1e-5)
    seen: set[str] = set()
    for out in outs:
        for n, p in out["params"].items():
            torch.testing.assert_close(p, ref_params[n], atol=1e-5, rtol=0, msg=f"{name}: {n}")
            seen.add(n)
    assert seen == set(ref_params)  # the stages cover the whole (untied) model


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_grid_layout_and_bytes_on_the_wire(ranks, name):
    num_stages, _, num_microbatches = SCENARIOS[name]
    replicas = 4 // num_stages
    # Per micro-batch one [mb, T, n_embd] fp32 tensor crosses each boundary forward (activations)
    # and one backward (their gradients): per step B/R x T x n_embd x 32 bits in each direction.
    boundary_bits = BATCH // replicas * SEQ * N_EMBD * 32
    for rank, out in enumerate(r[name] for r in ranks):
        stage, replica, prev_rank, next_rank = out["grid"]
        assert (stage, replica) == (rank % num_stages, rank // num_stages)
        assert prev_rank == (rank - 1 if stage > 0 else None)
        assert next_rank == (rank + 1 if stage < num_stages - 1 else None)
        assert out["dp_ranks"] == [r * num_stages + stage for r in range(replicas)]
        assert out["pp_ranks"] == [replica * num_stages + s for s in range(num_stages)]
        sends = (stage < num_stages - 1) + (stage > 0)  # activations forward, gradients backward
        expected_ops = {}
        if stage < num_stages - 1:
            expected_ops["send_activation"] = STEPS * num_microbatches
        if stage > 0:
            expected_ops["send_activation_grad"] = STEPS * num_microbatches
        assert out["p2p_ops"] == expected_ops
        param_bits = out["num_params"] * 32
        for s in out["steps"]:
            assert s.p2p_bits == sends * boundary_bits
            assert s.allreduce_bits == (param_bits if replicas > 1 else 0)
            assert s.loss_bits == 32
            assert 0 <= s.compute_seconds <= s.step_seconds
            assert s.p2p_seconds >= 0 and s.allreduce_seconds >= 0
            if num_stages == 1:
                assert s.p2p_seconds == 0
        assert out["memory"] == {"param_bytes": param_bits // 8, "grad_bytes": param_bits // 8}


def test_single_process_trainer_equals_reference(reference):
    ref_params, ref_losses = reference
    out = _train(1, "gpipe", 4)
    assert [s.loss for s in out["steps"]] == pytest.approx(ref_losses, abs=1e-5)
    assert all(s.p2p_bits == s.allreduce_bits == s.loss_bits == 0 for s in out["steps"])
    for n, p in out["params"].items():
        torch.testing.assert_close(p, ref_params[n], atol=1e-5, rtol=0)


def test_stages_compose_to_the_model():
    model = _gpt2()
    x = _batches()[0][0]
    stages = [GPT2Stage(model, s, 3) for s in range(3)]
    assert [list(s.block_range) for s in stages] == [[0, 1], [2], [3]]
    hidden = x
    for stage in stages:
        hidden = stage(hidden)
    torch.testing.assert_close(hidden, model(input_ids=x).logits, atol=0, rtol=0)
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())


def test_block_split_is_as_even_as_possible():
    assert split_blocks(5, 2) == [range(0, 3), range(3, 5)]
    assert split_blocks(4, 4) == [range(i, i + 1) for i in range(4)]
    assert [len(r) for r in split_blocks(10, 4)] == [3, 3, 2, 2]


def test_bad_grids_are_rejected():
    assert grid_shape(8, 2, 4) == (2, 4)
    with pytest.raises(ValueError, match="world size 6 is not divisible by num_stages=4"):
        grid_shape(6, 4)
    with pytest.raises(ValueError, match="num_stages=5 exceeds the model's 4 transformer blocks"):
        grid_shape(5, 5, 4)
    with pytest.raises(ValueError, match="num_stages=5 exceeds the model's 4 transformer blocks"):
        GPT2Stage(_gpt2(), 0, 5)
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        GPT2Stage(_gpt2(tied=True), 0, 2)


def test_bad_trainer_settings_are_rejected():
    model = _gpt2()
    grid = ProcessGrid(num_stages=2, num_replicas=1, rank=0, pipeline_group=None, data_parallel_group=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="unknown schedule 'zb'; valid schedules: gpipe, 1f1b"):
        PipelineTrainer(model, grid, optimizer, num_microbatches=2, schedule="zb")
    with pytest.raises(ValueError, match=r"1f1b schedule needs num_microbatches \(1\) >= num_stages \(2\)"):
        PipelineTrainer(model, grid, optimizer, num_microbatches=1, schedule="1f1b")
    single = ProcessGrid.create(1)
    trainer = PipelineTrainer(GPT2Stage(model, 0, 1), single, optimizer, num_microbatches=3)
    x, y = _batches()[0]
    with pytest.raises(ValueError, match="global batch 8 must divide by num_replicas x num_microbatches = 3"):
        trainer.train_step(x, y)
