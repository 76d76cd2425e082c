"""Checks every SyncStrategy must pass, for the library's tests and the papers' alike."""

from __future__ import annotations

import torch

from common.strategies import SyncStrategy


def assert_scheduled_lr_survives_a_resume(
    strategy: SyncStrategy, optimizer_class: type[torch.optim.Optimizer]
) -> None:
    """``strategy.scheduled_lr()`` follows a LambdaLR through ``Optimizer.load_state_dict`` (a resume),
    which replaces the optimizer's group dicts that the scheduler then writes into."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    optimizer = strategy.optimizer(model, optimizer_class, lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 4)
    assert strategy.scheduled_lr() == 0.125
    optimizer.load_state_dict(optimizer.state_dict())  # resume: new group dicts
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.25
    assert strategy.scheduled_lr() == 0.25
