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
``periodic`` (every matching every round(1 / C_b) steps, none in between, vanilla's alpha).
Momentum buffers stay local, as in the authors' code. Evaluation uses the average of the workers'
models (and BatchNorm statistics), an all-reduce that is instrumentation, not counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from .comm.collectives import exchange, get_rank, get_world_size
from .comm.stats import CommStats
from .strategies.base import SyncStrategy, _broadcast_module_state
from .topology import MatchaPlan, base_laplacian, periodic_period, vanilla_weight

GOSSIP_MODES = ("matcha", "vanilla", "periodic")


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


def mixing_alpha(plan: MatchaPlan, mode: str, graph_laplacian: np.ndarray) -> float:
    """MATCHA's alpha from the plan; vanilla's for the vanilla and periodic baselines."""
    return plan.alpha if mode == "matcha" else vanilla_weight(graph_laplacian)[0]


class GossipStrategy(SyncStrategy):
    """Decentralized SGD: local steps, then parameter gossip on the active matchings."""

    def __init__(self, plan: MatchaPlan, *, mode: str = "matcha", seed: int = 0) -> None:
        if mode not in GOSSIP_MODES:
            raise ValueError(f"gossip mode must be one of {', '.join(GOSSIP_MODES)}, got {mode!r}")
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
        self.stats = CommStats()
        self.steps = 0
        self.rounds = 0  # active matchings summed over steps: one parallel exchange round each
        self._stash: dict[str, Tensor] = {}

    def setup(self, model: nn.Module) -> None:
        # Same start everywhere (the paper's workers start from one model); then they drift apart.
        _broadcast_module_state(model, "parameters")
        _broadcast_module_state(model, "buffers")

    def partners(self, step: int) -> list[int]:
        """This rank's partner in each active matching at ``step``, in matching order."""
        flags = step_flags(self.plan, self.mode, step, self.seed)
        return self.plan.neighbours(self.rank, flags)

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

    def metrics(self) -> dict[str, float]:
        return {
            "gossip_alpha": self.alpha,
            "gossip_rounds_per_step": self.rounds / self.steps if self.steps else 0.0,
            "gossip_expected_rounds": float(self.plan.p.sum()) if self.mode == "matcha" else float("nan"),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"stats": self.stats.state_dict(), "steps": self.steps, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state["stats"])
        self.steps = int(state["steps"])
        self.rounds = int(state["rounds"])


__all__ = ["GOSSIP_MODES", "GossipStrategy", "base_laplacian", "mixing_alpha", "step_flags"]
