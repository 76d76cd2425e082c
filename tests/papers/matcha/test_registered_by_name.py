"""MATCHA's gossip strategy is the paper's code, known to the library by name only: a run naming
``gossip`` validates and builds through ``common.methods``, which imports ``papers.matcha.gossip``
only then."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from common.config import RunConfig
from common.methods import STRATEGIES, checked_config, strategy_class
from common.strategies.base import MethodNeeds
from papers.matcha.gossip import GossipOptions, GossipStrategy
from tests.helpers.strategies import assert_one_constructor_shape, undeclared_sync_settings
from trainer.paths import REPO_ROOT


def test_the_library_names_gossip_and_imports_it_when_asked():
    assert STRATEGIES["gossip"] == "papers.matcha.gossip:GossipStrategy"  # a name, not an import
    assert strategy_class("gossip") is GossipStrategy and GossipStrategy.name == "gossip"
    assert isinstance(GossipStrategy.needs, MethodNeeds)
    with pytest.raises(ValueError, match=r"unknown strategy 'matcha'; valid: .*\bgossip\b"):
        checked_config({"strategy": "matcha"})


def test_gossip_has_typed_frozen_options_neutral_ignores_and_the_one_constructor_shape():
    options = GossipStrategy.check_options({}, 8)  # the paper's graph 0: 8 nodes
    assert isinstance(options, GossipOptions) and hash(options) == hash(options)
    with pytest.raises(AttributeError):
        options.anything = 1  # type: ignore[attr-defined]  # frozen: a run cannot change them
    neutral = {setting: value for setting, value, _ in GossipStrategy.ignores}
    assert neutral == {setting: getattr(RunConfig(), setting) for setting in neutral}
    assert_one_constructor_shape(GossipStrategy)
    assert undeclared_sync_settings(GossipStrategy) == []


def test_a_setting_gossip_ignores_is_an_error_naming_it():
    values = {"strategy": "gossip", "world_size": 8, "strategy_options": {"graph": "paper", "budget": 0.3}}
    assert checked_config(values).strategy == "gossip"
    message = "strategy gossip ignores bucket_numel (got 100): it exchanges whole models"
    with pytest.raises(ValueError, match=re.escape(message)):
        checked_config({**values, "bucket_numel": 100})


def test_the_papers_module_is_imported_only_once_a_run_names_it():
    code = (
        "import sys\n"
        "from common.methods import checked_config\n"
        "loaded = lambda: 'papers.matcha.gossip' in sys.modules\n"
        "checked_config({'strategy': 'data_parallel'})\n"
        "before = loaded()\n"
        "checked_config({'strategy': 'gossip', 'world_size': 8})\n"
        "print(before, loaded())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "True"]
