"""The method contract: transports and run validation dispatch on what a compressor or strategy
declares, never on its name or on probing its attributes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest
import torch

from common.comm import GradientSync
from common.compressors import build_compressor
from common.compressors.base import Needs
from common.compressors.terngrad import TernGrad
from common.config import RunConfig
from common.methods import STRATEGIES, check_run, checked_config, effective_config, strategy_class
from common.options import Options
from common.strategies import DataParallel, SyncStrategy
from common.strategies.base import MethodNeeds
from tests.distributed import run_ranks
from tests.helpers.strategies import (
    assert_one_constructor_shape,
    assert_scheduled_lr_survives_a_resume,
    sync_settings_mismatches,
    undeclared_sync_settings,
)
from trainer import default_strategy
from trainer.paths import REPO_ROOT


def test_terngrad_declares_its_rounds_and_the_others_declare_none():
    assert TernGrad().needs == Needs(scaler_round="max", scaled_codes=True)
    assert TernGrad(shared_scaler=False).needs == Needs(scaled_codes=True)
    assert TernGrad(fp32_below=100).needs.dense_tensors
    sparse = {"density": 0.01}
    for name, options in (("identity", {}), ("fp16", {}), ("topk", sparse), ("randomk", sparse),
                          ("random_block", sparse), ("qsgd", {}), ("dgc", sparse), ("signsgd", {})):  # fmt: skip
        assert build_compressor(name, **options).needs == Needs(), name
    assert build_compressor("powersgd").needs == Needs(low_rank=True)


def test_a_declaration_that_no_route_implements_is_refused():
    with pytest.raises(ValueError, match="unknown scaler_round 'mean'"):
        Needs(scaler_round="mean", scaled_codes=True)
    with pytest.raises(ValueError, match="declare scaled_codes=True"):
        Needs(dense_tensors=True)
    with pytest.raises(ValueError, match="two different routes"):
        Needs(low_rank=True, scaled_codes=True)
    with pytest.raises(ValueError, match="unknown update 'adam'; valid: optimizer, own"):
        MethodNeeds(update="adam")
    with pytest.raises(ValueError, match="says what it exchanges"):
        MethodNeeds(compressor=False)


class _Undeclared(TernGrad):
    """TernGrad's attributes (shared_scaler, scaler, codes) but the default declaration: no rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.needs = Needs()


def _route(rank: int, world: int) -> dict[str, Any]:
    out = {}
    for label, compressor in (("declared", TernGrad()), ("undeclared", _Undeclared())):
        sync = GradientSync(compressor, seed=1)
        grad = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
        sync.sync([("w", grad)])
        out[label] = (dict(sync.stats.routes), dict(sync.stats.calls))
    return out


def test_gradient_sync_takes_the_route_the_compressor_declares(tmp_path):
    for declared, undeclared in (r.values() for r in run_ranks(_route, 2, tmp_path=tmp_path)):
        routes, calls = declared
        assert routes == {"terngrad-allgather": 1} and calls["all_reduce"] == 1  # the scaler round (a max)
        routes, calls = undeclared
        assert routes == {} and "all_reduce" not in calls  # attributes alone choose nothing


LIBRARY_STRATEGIES = {name: cls for name, cls in STRATEGIES.items() if not isinstance(cls, str)}


def test_every_strategy_is_registered_under_the_name_it_declares():
    assert list(STRATEGIES) == [
        "data_parallel", "dgc", "def", "sparse", "gossip", "compact", "torch_hook", "pipeline",
    ]  # fmt: skip
    for name, cls in LIBRARY_STRATEGIES.items():
        assert cls.name == name and isinstance(cls.needs, MethodNeeds)
    # a paper's strategy by name only (tests/papers/ import them)
    assert {name: entry for name, entry in STRATEGIES.items() if isinstance(entry, str)} == {
        "gossip": "papers.matcha.gossip:GossipStrategy",
        "compact": "papers.sparse_axonn.strategies.compact:CompactDataParallel",
        "pipeline": "papers.sparse_axonn.strategies.pipeline:PipelineDataParallel",
    }
    with pytest.raises(
        ValueError,
        match="unknown strategy 'ddp'; valid: data_parallel, dgc, def, sparse, gossip, compact, "
        "torch_hook, pipeline$",
    ):
        strategy_class("ddp")


def test_the_library_imports_a_papers_strategy_only_when_a_run_names_it():
    code = (
        "import sys\n"
        "from common.methods import checked_config\n"
        "from trainer import default_strategy\n"
        "default_strategy(checked_config({'strategy': 'dgc', 'compressor': 'dgc', "
        "'compressor_options': {'density': 0.01}}))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('papers', 'pipelines')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_a_registered_strategy_that_cannot_be_imported_says_which(monkeypatch):
    monkeypatch.setitem(STRATEGIES, "gone", "papers.no_such_paper:Gone")
    with pytest.raises(ImportError, match="strategy 'gone' is papers.no_such_paper:Gone, which cannot be"):
        strategy_class("gone")
    monkeypatch.setitem(STRATEGIES, "misnamed", "common.strategies:DataParallel")
    with pytest.raises(TypeError, match="not a SyncStrategy named 'misnamed'"):
        strategy_class("misnamed")


@dataclasses.dataclass(frozen=True)
class _OwnOptions(Options):
    k: int = 1


class _OwnUpdate(SyncStrategy):
    """A new strategy: declarations only, no name of it anywhere in config.py or trainer/."""

    name = "own_update"
    needs = MethodNeeds(update="own", memory="own", own_memory="a test's residual")
    ignores = (("bucket_numel", None, "it sends one tensor"),)

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        if set(options) - {"k"}:
            raise ValueError(f"own_update options: k only, got {sorted(options)}")
        return _OwnOptions.from_mapping(options)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> _OwnUpdate:
        strategy = cls()
        strategy.k = options.k if isinstance(options, _OwnOptions) else 1  # type: ignore[attr-defined]
        return strategy


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"strategy_options": {"j": 2}}, r"own_update options: k only, got \['j'\]"),
        ({"optimizer": "adamw"}, "strategy own_update applies momentum SGD itself: optimizer must be sgd"),
        ({"error_feedback": True}, r"keeps its own memory \(a test's residual\): set error_feedback: false"),
        ({"bucket_numel": 64}, "strategy own_update ignores bucket_numel .got 64.: it sends one tensor"),
    ],
)
def test_a_new_strategy_is_validated_and_built_from_its_declarations(monkeypatch, settings, message):
    monkeypatch.setitem(STRATEGIES, "own_update", _OwnUpdate)
    with pytest.raises(ValueError, match=message):
        checked_config({"strategy": "own_update", **settings})
    config = checked_config({"strategy": "own_update", "strategy_options": {"k": 3}})
    strategy = default_strategy(config)
    assert isinstance(strategy, _OwnUpdate) and strategy.k == 3  # type: ignore[attr-defined]


def test_a_strategy_with_its_own_exchange_refuses_a_compressor(monkeypatch):
    class Own(_OwnUpdate):
        name = "own_exchange"
        needs = MethodNeeds(compressor=False, own_exchange="sends its own thing", memory="none")

    monkeypatch.setitem(STRATEGIES, "own_exchange", Own)
    with pytest.raises(
        ValueError, match="strategy own_exchange sends its own thing: set compressor: identity"
    ):
        checked_config({"strategy": "own_exchange", "compressor": "fp16"})


def test_every_strategy_has_typed_frozen_options():
    for name, cls in LIBRARY_STRATEGIES.items():
        options = cls.check_options({}, 8)
        assert isinstance(options, Options) and hash(options) == hash(options), name
        with pytest.raises(AttributeError):
            options.anything = 1  # type: ignore[attr-defined]  # frozen: a run cannot change them
    dgc = strategy_class("dgc").check_options({"warmup": [0.25, 0.0625]}, 2)
    assert dgc.warmup == (0.25, 0.0625)  # type: ignore[attr-defined]  # YAML's list, kept as a tuple


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_strategy_reads_the_scheduled_lr_through_its_optimizer_also_after_a_resume():
    """``Optimizer.load_state_dict`` (what a resumed run does) replaces the optimizer's group dicts and
    the scheduler writes into the new ones: a strategy that kept the dicts it returned read the lr of
    its first step for the rest of a resumed run (found with the pipeline's resume test; sparse
    AxoNN's compact strategy: tests/papers/sparse_axonn/test_compact_strategy.py)."""
    from common.strategies import DetachedEFDataParallel

    strategy = DetachedEFDataParallel(
        build_compressor("random_block", density=0.5), momentum=0.9, weight_decay=0.0
    )
    assert_scheduled_lr_survives_a_resume(strategy, torch.optim.SGD)


def test_a_runs_options_are_parsed_once_and_handed_to_its_strategy(monkeypatch):
    """check_run parses strategy_options into the strategy's typed options; the strategy built from
    the run holds that very object (one option system: never parsed again from the dict)."""
    from common.strategies.sparse import SparseOptions

    config = checked_config(
        {"strategy": "sparse", "strategy_options": {"selector": "topk", "density": 0.01}, "world_size": 1}
    )
    method = check_run(config)
    assert isinstance(method.options, SparseOptions) and method.options.density == 0.01
    calls = []
    original = SparseOptions.from_mapping.__func__
    monkeypatch.setattr(
        SparseOptions, "from_mapping", classmethod(lambda cls, v: calls.append(v) or original(cls, v))
    )
    strategy = method.build()
    assert strategy.options is method.options
    assert all(isinstance(v, SparseOptions) for v in calls)  # no dict parsed at build time


def test_run_config_alone_imports_no_registry():
    """RunConfig checks types and ranges only; a bad name is an error of checked_config (a bad
    model's: tests/trainer/test_checks.py)."""
    from common.config import RunConfig

    config = RunConfig.from_dict({"compressor": "no_such_compressor"})
    with pytest.raises(ValueError, match="unknown compressor 'no_such_compressor'"):
        checked_config(config.to_dict())


def test_every_strategy_has_the_one_constructor_shape():
    """``Strategy(compressor=None, *, options=None, seed=0, **parts)`` (SyncStrategy's docstring); the
    papers' strategies: tests/papers/sparse_axonn/test_registered_by_name.py."""
    for cls in LIBRARY_STRATEGIES.values():
        assert_one_constructor_shape(cls)

    class Positional(SyncStrategy):
        def __init__(self, plan: object, *, seed: int = 0) -> None:
            super().__init__()

    with pytest.raises(AssertionError, match="Positional"):
        assert_one_constructor_shape(Positional)


def test_what_a_strategy_without_a_compressor_is_handed_is_refused():
    from common.strategies import SparseDataParallel

    with pytest.raises(
        ValueError, match="strategy sparse selects from the whole gradient .*takes no compressor"
    ):
        SparseDataParallel(build_compressor("topk", density=0.1))
    with pytest.raises(TypeError, match="DataParallel takes a Compressor .* got GradientSync"):
        DataParallel(GradientSync(build_compressor("fp16")))  # type: ignore[arg-type]
    assert DataParallel().sync.compressor.name == "identity"  # none: a plain fp32 all-reduce


_SYNC_RUNS = {
    "data_parallel": {"compressor": "topk", "compressor_options": {"density": 0.1}, "error_feedback": True,
                      "bucket_numel": 4096, "compress_per_tensor": True, "seed": 3},
    "data_parallel_allgather": {"compressor": "qsgd", "transport": "allgather", "seed": 3},
    "dgc": {"strategy": "dgc", "compressor": "dgc", "compressor_options": {"density": 0.1},
            "bucket_numel": 4096, "seed": 3},  # compress_per_tensor at its default: DGC's forces it
    "dgc_per_tensor": {"strategy": "dgc", "compressor": "topk", "compressor_options": {"density": 0.1},
                       "compress_per_tensor": True},
    "def": {"strategy": "def", "compressor": "random_block", "compressor_options": {"density": 0.1},
            "bucket_numel": 4096, "seed": 3},
}  # fmt: skip


@pytest.mark.parametrize("run", sorted(_SYNC_RUNS))
def test_a_strategy_builds_its_syncs_with_the_runs_settings_after_its_declared_overrides(run):
    config = checked_config({**_SYNC_RUNS[run], "world_size": 1})
    count, mismatches = sync_settings_mismatches(default_strategy(config), config)
    assert count >= 1 and mismatches == []


def test_a_strategy_without_the_runs_compressor_declares_every_sync_setting_of_the_run():
    for name, cls in LIBRARY_STRATEGIES.items():
        assert undeclared_sync_settings(cls) == [], name
    from common.strategies import SparseDataParallel

    class Careless(SparseDataParallel):
        ignores = (("transport", "auto", "its own exchange"),)

    assert undeclared_sync_settings(Careless) == ["bucket_numel", "compress_per_tensor"]


class _SilentlyPerTensor(DataParallel):
    """Plain data parallelism that compresses per tensor whatever the run says, and says nothing."""

    name = "silently_per_tensor"

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> DataParallel:
        compressor = build_compressor(config.compressor, **config.compressor_options)
        return cls(compressor, seed=config.seed, bucket_numel=config.bucket_numel, compress_per_tensor=True)


class _DeclaredPerTensor(_SilentlyPerTensor):
    name = "declared_per_tensor"
    forces = (("compress_per_tensor", True, "it compresses per tensor"),)


def test_an_undeclared_override_is_found_and_a_declared_one_is_the_effective_config(monkeypatch):
    for cls in (_SilentlyPerTensor, _DeclaredPerTensor):
        monkeypatch.setitem(STRATEGIES, cls.name, cls)
    values = {
        "compressor": "topk",
        "compressor_options": {"density": 0.1},
        "bucket_numel": 64,
        "world_size": 1,
    }
    silent = checked_config({**values, "strategy": "silently_per_tensor"})
    _, mismatches = sync_settings_mismatches(default_strategy(silent), silent)
    assert mismatches == ["_SilentlyPerTensor.sync.compress_per_tensor is True, the run's False"]
    declared = checked_config({**values, "strategy": "declared_per_tensor"})
    assert sync_settings_mismatches(default_strategy(declared), declared) == (1, [])
    assert not declared.compress_per_tensor and check_run(declared).config.compress_per_tensor  # logged so
    assert effective_config(declared) == check_run(declared).config


def test_dgc_and_def_declare_that_they_compress_per_tensor():
    for name in ("dgc", "def"):
        assert strategy_class(name).forced("compress_per_tensor") is True
    config = checked_config({"strategy": "dgc", "compressor": "dgc", "compressor_options": {"density": 0.1}})
    assert config.compress_per_tensor is False  # the RunConfig default, which DGC overrides ...
    assert effective_config(config).to_dict() == {**config.to_dict(), "compress_per_tensor": True}
    assert effective_config(effective_config(config)) == effective_config(config)  # ... once


def test_a_forced_setting_at_another_value_than_its_default_or_the_forced_one_is_an_error(monkeypatch):
    class Bucketed(_SilentlyPerTensor):
        name = "bucketed"
        forces = (("bucket_numel", 4096, "it sends 4096 entries at a time"),)

    monkeypatch.setitem(STRATEGIES, "bucketed", Bucketed)
    for bucket_numel in (None, 4096):  # the default (overridden) or the forced value
        config = checked_config({"strategy": "bucketed", "bucket_numel": bucket_numel})
        assert check_run(config).config.bucket_numel == 4096
    with pytest.raises(
        ValueError,
        match=r"strategy bucketed sets bucket_numel to 4096 \(got 100\): it sends 4096 entries at a time; "
        "remove it or set bucket_numel: 4096",
    ):
        checked_config({"strategy": "bucketed", "bucket_numel": 100})
