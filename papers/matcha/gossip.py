"""Decentralized SGD by gossip over activated matchings (MATCHA, Wang et al. 2019) as a sync strategy.

Each worker i keeps its own model x_i. After its local optimizer step, at step k, the matchings
active under the flags B^(k) (the same on every rank: drawn from a generator seeded with (seed, k))
are visited in order; in each, a worker with a partner n exchanges its parameters with it by real
point-to-point messages (both post the receive first: no deadlock, and the pairs of one matching
run in parallel: one communication round per active matching). Then, with every received x_n
taken before any mixing::

    x_i <- x_i + alpha sum_{n: active partners of i} (x_n - x_i)        (W = I - alpha L^(k))

Modes (``mode``): ``matcha`` (B_j ~ Bern(p_j), p and alpha from the plan's programs), ``vanilla``
(every matching every step, alpha = 2 / (lambda_2 + lambda_max) of the base Laplacian) and
``periodic`` (every matching every round(1 / C_b) steps, none in between, vanilla's alpha: the
nearest whole period, so C_b = 0.3 communicates every 3 steps, a realised budget of 0.333, which
favours the baseline; the realised rounds per step are logged). Momentum buffers stay local, as in
the authors' code. Evaluation uses the average of the workers' models (and BatchNorm statistics),
an all-reduce that is instrumentation, not counted.

As a run's strategy (``strategy: gossip``), the options (:class:`GossipOptions`) name the base graph
on ``world_size`` nodes, the budget and the mode; rank 0 solves the plan (:func:`build_plan`) and
broadcasts it, so every rank draws its flags from the very same probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import networkx as nx
import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.comm.collectives import exchange, get_rank, get_world_size
from common.comm.stats import CommStats
from common.options import Options
from common.strategies.base import MethodNeeds, SyncStrategy, broadcast_module_state

from .topology import (
    PAPER_GRAPHS,
    MatchaPlan,
    check_budget,
    erdos_renyi,
    paper_graph,
    paper_matchings,
    periodic_period,
    plan,
    random_geometric,
    ring,
    vanilla_weight,
)

if TYPE_CHECKING:
    from common.config import RunConfig

GOSSIP_MODES = ("matcha", "vanilla", "periodic")
GRAPHS = ("paper", "ring", "erdos_renyi", "geometric")
_GOSSIP = "it exchanges whole models with its neighbours, point to point"


def _check_number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        raise ValueError(f"gossip {name} must be a number in ({low:g}, {high:g}], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class GossipOptions(Options):
    """``strategy_options`` of ``strategy: gossip``; :func:`check_gossip_options` also checks them
    against the world size (the graph's node count)."""

    kind: ClassVar[str] = "gossip"
    mode: str = "matcha"  # matcha | vanilla | periodic
    budget: float = 0.5  # C_b in (0, 1]: expected active matchings per step / all matchings
    graph: str = "paper"  # paper (the official code's predefined graphs) | ring | erdos_renyi | geometric
    index: int = 0  # graph: paper: which one (0: the 8-node Erdos-Renyi graph of Fig. 1(a))
    edge_prob: float = 0.4  # graph: erdos_renyi
    radius: float = 0.5  # graph: geometric (nodes uniform in the unit square)
    graph_seed: int = 0  # erdos_renyi, geometric: the graph's own seed (not the run's)

    def __post_init__(self) -> None:
        if self.mode not in GOSSIP_MODES:
            raise ValueError(f"gossip mode must be one of {', '.join(GOSSIP_MODES)}, got {self.mode!r}")
        try:
            check_budget(self.budget)
        except (TypeError, ValueError) as error:
            raise ValueError(f"gossip budget: {error}") from None
        if self.graph not in GRAPHS:
            raise ValueError(f"gossip graph must be one of {', '.join(GRAPHS)}, got {self.graph!r}")
        if self.graph == "paper" and (isinstance(self.index, bool) or self.index not in PAPER_GRAPHS):
            raise ValueError(
                f"gossip index must be one of the paper's graphs {list(PAPER_GRAPHS)}, got {self.index!r}"
            )
        _check_number("edge_prob", self.edge_prob, 0.0, 1.0)
        _check_number("radius", self.radius, 0.0, math.sqrt(2))
        seed = self.graph_seed
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"gossip graph_seed must be an int >= 0, got {seed!r}")


def check_gossip_options(options: Mapping[str, Any] | GossipOptions | None, world_size: int) -> GossipOptions:
    """``options`` over the defaults, validated, and against ``world_size`` (the graph's node count)."""
    merged = GossipOptions.from_mapping(options)
    if merged.graph == "paper":
        nodes = paper_graph(merged.index).number_of_nodes()
        if nodes != world_size:
            raise ValueError(
                f"the paper's graph {merged.index} has {nodes} nodes but world_size is {world_size}: "
                f"set world_size: {nodes} or pick another graph"
            )
    if world_size < 2:
        raise ValueError(f"gossip needs at least 2 workers, got world_size {world_size}")
    if merged.graph == "ring" and world_size < 3:
        # found here, before any rank starts: rank 0 alone building it would leave the others
        # waiting for its plan
        raise ValueError(
            f"gossip graph ring needs world_size >= 3, got {world_size}: pick erdos_renyi or more workers"
        )
    return merged


def base_graph(
    options: Mapping[str, Any] | GossipOptions, world_size: int
) -> tuple[nx.Graph, list[list[tuple[int, int]]] | None]:
    """The base graph the options name, and the official matchings for a paper graph (else None)."""
    merged = check_gossip_options(options, world_size)
    graph = merged.graph
    if graph == "paper":
        return paper_graph(merged.index), paper_matchings(merged.index)
    if graph == "ring":
        return ring(world_size), None
    if graph == "erdos_renyi":
        return erdos_renyi(world_size, merged.edge_prob, merged.graph_seed), None
    return random_geometric(world_size, merged.radius, merged.graph_seed), None


def build_plan(options: Mapping[str, Any] | GossipOptions, world_size: int) -> MatchaPlan:
    """The MATCHA plan (matchings, p, alpha, rho) of the options' graph at their budget."""
    graph, matchings = base_graph(options, world_size)
    return plan(graph, check_gossip_options(options, world_size).budget, matchings)


def step_flags(plan: MatchaPlan, mode: str, step: int, seed: int) -> np.ndarray:
    """The matchings active at ``step`` (bool, one per matching), identical on every rank."""
    if mode not in GOSSIP_MODES:
        raise ValueError(f"gossip mode must be one of {', '.join(GOSSIP_MODES)}, got {mode!r}")
    m = plan.num_matchings
    if mode == "vanilla":
        return np.ones(m, dtype=bool)
    if mode == "periodic":
        return np.full(m, (step + 1) % periodic_period(plan.budget) == 0)
    # counter-based: the flags of step k do not depend on how many steps ran before (resume)
    return np.random.default_rng([seed, step]).random(m) < plan.p


def _shared_plan(options: GossipOptions) -> MatchaPlan:
    """The options' plan, solved by rank 0 and broadcast to every rank (set-up, not training
    traffic: not counted)."""
    world = get_world_size()
    holder: list[MatchaPlan | None] = [build_plan(options, world) if get_rank() == 0 else None]
    if world > 1:
        dist.broadcast_object_list(holder, src=0)
    assert holder[0] is not None
    return holder[0]


def mixing_alpha(plan: MatchaPlan, mode: str, graph_laplacian: np.ndarray) -> float:
    """MATCHA's alpha from the plan; vanilla's for the vanilla and periodic baselines."""
    return plan.alpha if mode == "matcha" else vanilla_weight(graph_laplacian)[0]


class GossipStrategy(SyncStrategy):
    """Decentralized SGD: local steps, then parameter gossip on the active matchings."""

    name = "gossip"
    needs = MethodNeeds(
        exchange="parameters",
        compressor=False,
        own_exchange="exchanges whole models between neighbours, uncompressed",
        memory="none",
    )
    ignores = (
        ("transport", "auto", _GOSSIP),
        ("bucket_numel", None, _GOSSIP),
        ("compress_per_tensor", False, _GOSSIP),
    )

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_gossip_options(options, world_size)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> GossipStrategy:
        return cls(
            options=GossipOptions.from_mapping(config.strategy_options if options is None else options),
            seed=config.seed,
        )

    def __init__(
        self,
        compressor: None = None,
        *,
        options: Mapping[str, Any] | GossipOptions | None = None,
        seed: int = 0,
        plan: MatchaPlan | None = None,
    ) -> None:
        """``compressor``: none (whole models cross the wire). ``options``: the graph, budget and
        mode (:class:`GossipOptions`); rank 0 solves their plan and broadcasts it, so every rank
        draws its flags from the very same probabilities. ``seed``: the flags' draws. ``plan``: a
        plan solved already (:func:`build_plan`, the same on every rank): then only the options'
        mode is read, not their graph or budget."""
        self.check_compressor(compressor)
        if plan is None:
            self.options = check_gossip_options(options, get_world_size())
            plan = _shared_plan(self.options)
        else:
            self.options = GossipOptions.from_mapping(options)
        mode = self.options.mode
        world, rank = get_world_size(), get_rank()
        if plan.num_nodes != world:
            raise ValueError(
                f"the gossip graph has {plan.num_nodes} nodes but there are {world} ranks: "
                f"set world_size to {plan.num_nodes} or pick a graph of {world} nodes"
            )
        self.plan = plan
        self.mode = mode
        self.seed = seed
        self.rank = rank
        laplacian = sum(plan.laplacians, np.zeros((plan.num_nodes, plan.num_nodes)))
        self.alpha = float(mixing_alpha(plan, mode, laplacian))
        # rho = ||E[W^T W] - J||: the plan's for MATCHA, the base graph's W for vanilla (periodic
        # alternates W and I, no single rho)
        self.rho = {"matcha": plan.rho, "vanilla": vanilla_weight(laplacian)[1]}.get(mode, float("nan"))
        self.stats = CommStats()
        self.steps = 0
        self.rounds = 0  # active matchings summed over steps: one parallel exchange round each
        self._stash: dict[str, Tensor] = {}

    def setup(self, model: nn.Module) -> None:
        # Same start everywhere (the paper's workers start from one model); then they drift apart.
        broadcast_module_state(model, "parameters")
        broadcast_module_state(model, "buffers")

    def after_step(self, model: nn.Module) -> None:
        flags = step_flags(self.plan, self.mode, self.steps, self.seed)
        self.rounds += int(flags.sum())
        partners = self.plan.neighbours(self.rank, flags)
        params = [p for p in model.parameters() if p.requires_grad]
        if partners:
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in params])
                pull = torch.zeros_like(flat)
                received = torch.empty_like(flat)
                with self.stats.phase("communicate", flat.device):
                    for partner in partners:  # one matching at a time, in the same order everywhere
                        exchange({partner: flat}, {partner: received}, stats=self.stats)
                        pull.add_(received).sub_(flat)
                flat.add_(pull, alpha=self.alpha)
                for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
                    p.copy_(part.view_as(p))
        # dense equivalent: one all-reduce of the model per step (centralized SGD's traffic)
        if get_world_size() > 1:
            self.stats.dense_bits += sum(p.numel() for p in params) * 32
        self.stats.steps += 1
        self.steps += 1

    def before_eval(self, model: nn.Module) -> None:
        """Evaluate the average of the workers' models (instrumentation: not counted)."""
        world = get_world_size()
        with torch.no_grad():
            for name, t in [*model.named_parameters(), *model.named_buffers()]:
                if not t.is_floating_point():
                    continue
                self._stash[name] = t.detach().clone()
                if world > 1:
                    dist.all_reduce(t.data)
                    t.data.div_(world)

    def after_eval(self, model: nn.Module) -> None:
        with torch.no_grad():
            for name, t in [*model.named_parameters(), *model.named_buffers()]:
                if name in self._stash:
                    t.copy_(self._stash.pop(name))

    def log_values(self) -> dict[str, float]:
        """Parallel exchange rounds so far (the cost model's time units), with every logged step."""
        return {"gossip_rounds": float(self.rounds)}

    def metrics(self) -> dict[str, float]:
        return {
            "gossip_alpha": self.alpha,
            "gossip_rho": float(self.rho),
            "gossip_matchings": float(self.plan.num_matchings),
            "gossip_rounds_per_step": self.rounds / self.steps if self.steps else 0.0,
            "gossip_expected_rounds": float(self.plan.p.sum()) if self.mode == "matcha" else float("nan"),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"stats": self.stats.state_dict(), "steps": self.steps, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state["stats"])
        self.steps = int(state["steps"])
        self.rounds = int(state["rounds"])


__all__ = [
    "GOSSIP_MODES",
    "GRAPHS",
    "GossipOptions",
    "GossipStrategy",
    "base_graph",
    "build_plan",
    "check_gossip_options",
    "mixing_alpha",
    "step_flags",
]
