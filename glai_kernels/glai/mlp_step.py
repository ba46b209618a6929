"""Engineered training steps for the MLPs GLAI is compared with (docs/ARCHITECTURE.md §4,
/work/shared/SPEC.md §6 "Comparing like with like"): the MLP's counterparts of GLAI's
`FusedSparseStep`, so that the engineered protocol gives both sides the same treatment.

`HandFusedMLPStep(model, optimizer)`: the ordinary step's arithmetic without autograd over the
model or torch.optim's Python wrapper, as `FusedSparseStep` does for a sparse GLAI head:

    stepper = HandFusedMLPStep(mlp, optimizer)   # optimizer: torch.optim.SGD over mlp
    loss = stepper.step(lambda model: F.cross_entropy(model(x), target))

Each `stand_in(x)` (x [B, n0]) runs the model's modules without recording autograd (Linear,
ReLU and Dropout in any order: the MLPs, the reduced MLPs and the linear head with its input
dropout; dropout draws the random numbers `nn.Dropout` draws) and returns y [B, n_out] as a
fresh leaf. Autograd runs over the loss alone, to y; then the layers' backward is a few
matrix products per Linear (dW = dy^T h, db = sum dy, dh = dy W; none to the data), ReLU's
and dropout's backward as autograd computes them, and the update is torch's own
`_fused_sgd_` on the optimizer's hyper-parameters (momentum 0, the paper's SGD), or
`optimizer.step()` on the gradients for any other optimizer. The values equal the ordinary
step's to rounding (the weight gradient's product is taken in another order).

`compiled_mlp_step(model, task.loss, optimizer)`: `torch.compile` of the forward and the loss
(backward through the compiled graph), torch's fused optimizer step; dropout draws eager's
random numbers (`fallback_random`), so it too equals the ordinary step to rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _modules(model: nn.Module) -> list[nn.Module]:
    """The model's modules if it is a chain of Linear/ReLU/Dropout layers, else ValueError."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"model must be an nn.Sequential of Linear/ReLU/Dropout layers, got "
                         f"{type(model).__name__}")
    modules = list(model)
    bad = [f"[{k}] {type(m).__name__}" for k, m in enumerate(modules)
           if not isinstance(m, (nn.Linear, nn.ReLU, nn.Dropout))]
    if bad or not any(isinstance(m, nn.Linear) for m in modules):
        raise ValueError(f"model must be a chain of Linear/ReLU/Dropout layers with a Linear; "
                         f"found {', '.join(bad) or 'no Linear'}")
    return modules


def _is_plain_fused_sgd(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, torch.optim.SGD) and all(
        g.get("fused") and not g["momentum"] and not g.get("maximize")
        for g in optimizer.param_groups)


class HandFusedMLPStep:
    """One SGD (or any optimizer's) step of a Linear/ReLU/Dropout chain without autograd
    over the model (module docstring). `step(loss_of)` returns the loss (detached)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.modules = model, _modules(model)
        stepped = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if stepped != {id(p) for p in model.parameters() if p.requires_grad}:
            raise ValueError("optimizer must step exactly the model's trainable parameters")
        self.optimizer = optimizer
        self.first = next(k for k, m in enumerate(self.modules) if isinstance(m, nn.Linear))
        self.sgd = _is_plain_fused_sgd(optimizer)

    def _forward(self, x: torch.Tensor, saved: list) -> torch.Tensor:
        h = x
        for k, m in enumerate(self.modules):
            if isinstance(m, nn.Linear):
                saved.append(h)
                h = F.linear(h, m.weight, m.bias)
            elif isinstance(m, nn.ReLU):
                h = torch.relu(h)
                saved.append(h)
            elif m.training and m.p > 0:
                if k < self.first:  # before the first Linear: no gradient flows through it
                    h = F.dropout(h, m.p, True)
                    saved.append(None)
                elif h.device.type == "cpu":  # at::dropout on CPU: input * bernoulli / (1-p)
                    noise = torch.empty_like(h).bernoulli_(1 - m.p).div_(1 - m.p)
                    h = h * noise
                    saved.append(noise)
                else:  # elsewhere at::dropout is native_dropout: keep its mask
                    h, mask = torch.native_dropout(h, m.p, True)
                    saved.append((mask, 1.0 / (1.0 - m.p)))
            else:
                saved.append(None)
        return h

    def _backward(self, dy: torch.Tensor, saved: list, grads: dict) -> None:
        for k in range(len(self.modules) - 1, self.first - 1, -1):
            m, kept = self.modules[k], saved.pop()
            if isinstance(m, nn.Linear):
                for p, g in ((m.weight, dy.t().mm(kept)), (m.bias, dy.sum(0))):
                    if p is not None and p.requires_grad:
                        grads[p] = g if p not in grads else grads[p] + g
                if k > self.first:
                    dy = dy.mm(m.weight)
            elif isinstance(m, nn.ReLU):
                dy = torch.ops.aten.threshold_backward(dy, kept, 0)
            elif isinstance(kept, tuple):
                dy = torch.ops.aten.native_dropout_backward(dy, kept[0], kept[1])
            elif kept is not None:
                dy = dy * kept

    def step(self, loss_of: Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]
             ) -> torch.Tensor:
        calls: list[tuple[torch.Tensor, list]] = []

        def stand_in(x: torch.Tensor) -> torch.Tensor:
            saved: list = []
            with torch.no_grad():
                y = self._forward(x, saved)
            y.requires_grad_()
            calls.append((y, saved))
            return y

        loss = loss_of(stand_in)
        dys = torch.autograd.grad(loss, [y for y, _ in calls])
        grads: dict = {}
        for (_, saved), dy in zip(calls, dys, strict=True):
            self._backward(dy, saved, grads)
        self._update(grads)
        return loss.detach()

    def _update(self, grads: dict) -> None:
        if not self.sgd:
            for p, g in grads.items():
                p.grad = g
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return
        with torch.no_grad():
            for group in self.optimizer.param_groups:
                params = [p for p in group["params"] if p in grads]
                if params:
                    torch._fused_sgd_(params, [grads[p] for p in params], [],
                                      weight_decay=group["weight_decay"], momentum=0.0,
                                      lr=group["lr"], dampening=group["dampening"],
                                      nesterov=False, maximize=False, is_first_step=False)


def compiled_mlp_step(model: nn.Module, loss: Callable[[nn.Module, object], torch.Tensor],
                      optimizer: torch.optim.Optimizer) -> Callable[[object], None]:
    """step(batch): loss(model, batch) (a task's `loss`) through `torch.compile` (forward
    and loss; backward through the compiled graph; eager's random numbers for dropout), then
    the optimizer's own (fused) step. The first calls compile (seconds): warm it up untimed."""
    loss_of = torch.compile(lambda batch: loss(model, batch), options={"fallback_random": True})

    def step(batch) -> None:
        loss_of(batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step
