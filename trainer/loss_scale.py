"""fp16 training's dynamic loss scale, decided by every rank together.

fp16 has 5 exponent bits: small gradients underflow to zero unless the loss is multiplied by a
large scale S before ``backward()`` and the gradients divided by S after. S starts at 2^16, halves
(and the step is skipped) whenever a gradient is inf or NaN, and doubles after ``growth_interval``
clean steps: ``torch.amp.GradScaler``'s rule and defaults. Unlike GradScaler, which decides per
process, the check here is all-reduced (max of the per-rank flags), so every rank skips the same
steps and no inf or NaN ever reaches a compressor or an error-feedback residual: the gradients are
unscaled *before* the data-parallel sync, so compression always sees true gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


class LossScaler:
    """Dynamic loss scale (``torch.amp.GradScaler``'s rule, one decision for all ranks)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if not init_scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError(
                f"loss scale: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval "
                f">= 1; got {init_scale}, {growth_factor}, {backoff_factor}, {growth_interval}"
            )
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.skipped = 0

    def scaled(self, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        """``loss_fn`` whose loss is multiplied by the current scale (what ``backward()`` sees)."""
        scale = self.scale
        return lambda output, target: loss_fn(output, target) * scale

    def unscale_(self, params: Sequence[Tensor], device: torch.device | None = None) -> bool:
        """Divide every gradient by the scale, in place; True when every gradient on every rank is
        finite (then the step may go on), False when any is not (every rank skips it).

        ``device``: where the process group's collectives run (the gradients' device: CUDA with
        NCCL, the CPU with gloo); default the first gradient's, else the CPU."""
        grads = [p.grad for p in params if p.grad is not None]
        if device is None:
            device = grads[0].device if grads else torch.device("cpu")
        found_inf = torch.zeros((), dtype=torch.float32, device=device)
        if grads:  # GradScaler's fused kernel: multiply by 1/scale and flag any inf or NaN, one pass
            inv_scale = torch.full((), 1.0 / self.scale, dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)  # instrumentation-sized: not counted as traffic
        # The step's one host read of a device value (a device sync on CUDA): the loop must know
        # now whether to send the gradients and step the optimizer. torch.amp.GradScaler reads its
        # found_inf here too for optimizers without a fused inf check (GradScaler._maybe_opt_step).
        return not bool(found_inf)

    def update(self, finite: bool) -> None:
        """Back off (and count a skipped step) after a non-finite step; grow after enough clean ones."""
        if not finite:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped += 1
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.clean_steps, self.skipped = state["scale"], state["clean_steps"], state["skipped"]
