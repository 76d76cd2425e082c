"""Sparse AxoNN's strategies are the paper's code, known to the library by name only: a run naming
``compact`` or ``pipeline`` validates and builds through ``common.methods``, which imports the
paper's module only then, and every list of strategies still names them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from common.config import RunConfig
from common.methods import STRATEGIES, checked_config, strategy_class
from common.options import Options
from common.strategies.base import MethodNeeds
from papers.sparse_axonn.pruning import load_masks, magnitude_masks, save_masks
from papers.sparse_axonn.strategies import CompactDataParallel, PipelineDataParallel
from tests.helpers.strategies import assert_one_constructor_shape, undeclared_sync_settings
from trainer import default_strategy
from trainer.models import build_model
from trainer.paths import REPO_ROOT

PAPER_STRATEGIES = {"compact": CompactDataParallel, "pipeline": PipelineDataParallel}


def test_the_library_names_the_papers_strategies_and_imports_them_when_asked():
    for name, cls in PAPER_STRATEGIES.items():
        assert isinstance(STRATEGIES[name], str)  # a name, not an import of the paper
        assert strategy_class(name) is cls and cls.name == name and isinstance(cls.needs, MethodNeeds)
    with pytest.raises(ValueError, match=r"unknown strategy 'axonn'; valid: .*\bcompact\b.*\bpipeline\b"):
        checked_config({"strategy": "axonn"})


def test_the_papers_strategies_have_typed_frozen_options_and_neutral_ignores():
    for name, cls in PAPER_STRATEGIES.items():
        options = cls.check_options({"masks": "m.pt"} if name == "compact" else {}, 8)
        assert isinstance(options, Options) and hash(options) == hash(options), name
        with pytest.raises(AttributeError):
            options.anything = 1  # type: ignore[attr-defined]  # frozen: a run cannot change them
        neutral = {setting: value for setting, value, _ in cls.ignores}
        assert neutral == {setting: getattr(RunConfig(), setting) for setting in neutral}, name


def _masks_file(tmp_path) -> str:
    model = build_model("mlp", num_classes=10, in_channels=1, image_size=28, hidden_sizes=[8])
    weights = {n: p for n, p in model.named_parameters() if n.endswith("weight")}
    path = tmp_path / "masks.pt"
    save_masks(path, magnitude_masks(weights, 0.5), model, "global")
    return str(path)


def test_a_compact_run_validates_and_builds_through_the_library(tmp_path):
    masks = _masks_file(tmp_path)
    config = checked_config(
        {
            "model_options": {"hidden_sizes": [8]},
            "optimizer": "adamw",
            "strategy": "compact",
            "strategy_options": {"masks": masks},
        }
    )
    strategy = default_strategy(config)
    assert isinstance(strategy, CompactDataParallel)
    saved = load_masks(masks).masks
    assert strategy.masks.keys() == saved.keys()
    assert all(torch.equal(strategy.masks[name], mask) for name, mask in saved.items())


def test_the_papers_module_is_imported_only_once_a_run_names_it(tmp_path):
    masks = _masks_file(tmp_path)
    code = (
        "import sys\n"
        "from common.methods import checked_config\n"
        "from trainer import default_strategy\n"
        "loaded = lambda: 'papers.sparse_axonn.strategies.compact' in sys.modules\n"
        "checked_config({'strategy': 'data_parallel'})\n"
        "before = loaded()\n"
        "config = checked_config({'model_options': {'hidden_sizes': [8]}, 'optimizer': 'adamw',\n"
        f"    'strategy': 'compact', 'strategy_options': {{'masks': {masks!r}}}}})\n"
        "default_strategy(config)\n"
        "print(before, loaded())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "True"]


def test_every_registered_strategy_has_the_one_constructor_shape_and_declares_its_sync_settings():
    """Every name in common.methods.STRATEGIES, the papers' imported as a run would import them:
    ``Strategy(compressor=None, *, options=None, seed=0, **parts)``, and a strategy without the run's
    compressor declares every GradientSync setting of a run it does not read."""
    for name in STRATEGIES:
        cls = strategy_class(name)
        assert_one_constructor_shape(cls)
        assert undeclared_sync_settings(cls) == [], name


def test_the_papers_strategies_take_their_masks_once(tmp_path):
    masks = _masks_file(tmp_path)
    tensors = load_masks(masks).masks
    from_file = CompactDataParallel(options={"masks": masks}, weight_decay=0.0)
    given = CompactDataParallel(masks=tensors, weight_decay=0.0)
    assert from_file.masks.keys() == given.masks.keys() == tensors.keys()
    with pytest.raises(ValueError, match="compact needs its masks once: .* got both"):
        CompactDataParallel(options={"masks": masks}, masks=tensors)
    with pytest.raises(ValueError, match="compact needs its masks once: .* got neither"):
        CompactDataParallel()
    with pytest.raises(TypeError, match=r"takes its masks by keyword: CompactDataParallel\(masks=...\)"):
        CompactDataParallel(tensors)  # type: ignore[arg-type]  # the old positional form
    with pytest.raises(ValueError, match="compact masks must name the prune stage's mask file .* got None"):
        checked_config({"strategy": "compact", "optimizer": "adamw"})  # a run names the file
    with pytest.raises(ValueError, match="pipeline takes its masks once: .* got both"):
        PipelineDataParallel(options={"masks": masks}, masks=tensors)
    assert PipelineDataParallel(options={"masks": masks}).masks.keys() == tensors.keys()
    assert PipelineDataParallel().masks is None  # dense AxoNN
