"""Engineered training steps for the MLPs GLAI is compared with (docs/ARCHITECTURE.md §4,
docs/ARCHITECTURE.md §4 "Comparing like with like"): the MLP's counterparts of GLAI's
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

The engineered protocol's step (`native=True`, the default; issue 41), as GLAI's fused step
gets it: for a chain Linear (ReLU Linear)* with biases (a Dropout before the first Linear
and after any ReLU: in training it draws, inside the call, the random numbers the Python path
draws, in its order, family B's two views included), float32/float64 on CPU, one fused SGD
group with momentum 0, each model call is one extension call, `glai_ext::mlp_step_forward`
(the addmm, relu and dropout calls), and with one call per loss the backward and update are
one more, `glai_ext::mlp_step_update` (the gradients' mm and sum into buffers kept by the
step, dropout's and the ReLUs' backward, torch's `_fused_sgd_`; with several calls per loss
`glai_ext::mlp_step_update_calls`, each call's gradients summed in call order): with
`gemm="torch"` the same kernels on the same tensors as the Python path, so the same bits
(csrc/cpu/engineered_steps.cpp). With
`gemm="own"` (the default) each Linear's three products (x W^T, dy^T h, dy W) run on the
register tile GLAI's selector runs on (`glai_ext::linear`'s kernel) instead of torch's MKL
GEMM: the same arithmetic in another summation order, equal to the ordinary step to rounding.
The weights are read in place as nn.Linear stores them (the forward as y^T = W x^T): the
model is left as it was, the same Parameters in the same layout, so the optimizer, a
checkpoint and an ordinary loop over the same model see nothing of the step (a weight that is
not contiguous takes torch's GEMMs; docs/notes/pipeline.md, "The engineered MLP step on the
selector's tile (issue 41, stop 47)").

`compiled_mlp_step(model, task.loss, optimizer)`: `torch.compile` of the forward and the loss
(backward through the compiled graph), torch's fused optimizer step; dropout draws eager's
random numbers (`fallback_random`), so it too equals the ordinary step to rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from glai_kernels import fused


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


# the native calls' relus and noise where no dropout acts (their ops read an empty one as none)
_NO_DROPOUT: tuple = ()


class HandFusedMLPStep:
    """One SGD (or any optimizer's) step of a Linear/ReLU/Dropout chain without autograd
    over the model (module docstring). `step(loss_of)` returns the loss (detached)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 native: bool = True, gemm: str = "own") -> None:
        self.model, self.modules = model, _modules(model)
        stepped = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if stepped != {id(p) for p in model.parameters() if p.requires_grad}:
            raise ValueError("optimizer must step exactly the model's trainable parameters")
        self.optimizer = optimizer
        self.first = next(k for k, m in enumerate(self.modules) if isinstance(m, nn.Linear))
        self.sgd = _is_plain_fused_sgd(optimizer)
        self.native = bool(native)
        if gemm not in ("own", "torch"):
            raise ValueError(f"gemm must be 'own' or 'torch', got {gemm!r}")
        self.gemm = gemm
        self._grads: list[torch.Tensor] = []  # the native update's gradient buffers

    def _native_layers(self, x: torch.Tensor) -> tuple[list, list, bool, list] | None:
        """(weights, biases, own GEMM, dropout rates) of the chain when this call can run
        natively (module docstring), else None. The rates are one per Linear, for its input
        (a Dropout before the first Linear, or after the ReLU before a later one), 0.0 where
        none acts, or [] where none does at all."""
        groups = self.optimizer.param_groups
        if not (self.native and self.sgd and len(groups) == 1
                and not isinstance(groups[0]["lr"], torch.Tensor)
                and x.dim() == 2 and x.device.type == "cpu"
                and x.dtype in (torch.float32, torch.float64) and fused.unavailable() is None):
            return None
        weights, biases, want_linear = [], [], True
        rates, rate = [], 0.0
        for m in self.modules:
            if isinstance(m, nn.Dropout):
                if m.training and m.p > 0:
                    # one acting Dropout per Linear input, and not between a Linear and its
                    # ReLU (the op drops the ReLU's output): else the Python path
                    if rate > 0 or not want_linear:
                        return None
                    rate = float(m.p)
                continue
            if want_linear != isinstance(m, nn.Linear):
                return None
            if want_linear:
                weight, bias = m._parameters["weight"], m._parameters["bias"]
                if (bias is None or not weight.requires_grad or not bias.requires_grad
                        or weight.dtype != x.dtype):
                    return None
                weights.append(weight.detach())
                biases.append(bias.detach())
                rates.append(rate)
                rate = 0.0
            want_linear = not want_linear
        if want_linear or rate > 0:  # the chain must end on a Linear
            return None
        # the tile reads the weights' rows in place: a layout of the user's own (a transposed
        # view) keeps it, on torch's GEMMs, rather than a copy made here every step
        own = self.gemm != "torch" and all(w.is_contiguous() for w in weights)
        return weights, biases, own, rates if any(rates) else []

    def _native_saved(self, x: torch.Tensor, hidden: list, relus: list, noise: list) -> list:
        """What `_forward` saves, from the native forward's outputs: x the first Linear's
        input, hidden the later Linears' inputs, relus the ReLUs' outputs, noise the hidden
        dropouts' noise (None where none acts)."""
        saved, inputs, j, kept = [], iter([x, *hidden]), 0, None
        relus = relus or hidden  # [] where no hidden dropout acts: the ReLUs' outputs
        for m in self.modules:
            if isinstance(m, nn.Linear):
                saved.append(next(inputs))
                kept = None
            elif isinstance(m, nn.ReLU):
                saved.append(relus[j])
                kept = noise[j] if noise else None  # what the call drew after this ReLU
                j += 1
            else:  # a Dropout: the noise the call drew here (by the call's outputs, not the
                saved.append(kept)  # module's mode now: the loss may have changed it), once
                kept = None
        return saved

    def _native_call(self, x: torch.Tensor, layers: tuple) -> tuple:
        """`glai_ext::mlp_step_forward` on x: (y, (x', hidden, relus, noise)), x' the first
        Linear's input (x dropped, where a Dropout precedes it), hidden the later Linears'
        inputs, relus the ReLUs' outputs ([] where no hidden dropout acts: hidden are
        they) and noise each hidden dropout's (None where none; [] where none acts)."""
        weights, biases, own, rates = layers
        if not rates:  # no dropout acts (the common case): y and the hidden inputs alone,
            # without the unpacking below or the rates' argument (≈ 1-2 µs a step, stop 48)
            y, *hidden = torch.ops.glai_ext.mlp_step_forward(x, weights, biases, own)
            return y, (x, hidden, _NO_DROPOUT, _NO_DROPOUT)
        y, *out = torch.ops.glai_ext.mlp_step_forward(x, weights, biases, own, rates)
        depth = len(weights) - 1
        hidden, extra = out[:depth], iter(out[depth:])
        if rates and rates[0] > 0:
            x = next(extra)
        relus, noise = [], []
        if any(rates[1:]):
            for h, rate in zip(hidden, rates[1:], strict=True):
                relu, kept = (next(extra), next(extra)) if rate > 0 else (h, None)
                relus.append(relu)
                noise.append(kept)
        return y, (x, hidden, relus, noise)

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
        native: list = []  # (x, hidden, weights, biases) of each native call

        def stand_in(x: torch.Tensor) -> torch.Tensor:
            layers = self._native_layers(x)
            if layers is not None:
                x = x.contiguous() if layers[2] else x  # the own GEMM reads x's rows
                y, kept = self._native_call(x, layers)
                native.append((*kept, *layers[:3]))
                y.requires_grad_()
                calls.append((y, None))  # saved: from `native` when the Python path needs it
                return y
            saved: list = []
            with torch.no_grad():
                y = self._forward(x, saved)
            y.requires_grad_()
            calls.append((y, saved))
            return y

        loss = loss_of(stand_in)
        dys = torch.autograd.grad(loss, [y for y, _ in calls])
        if len(calls) == 1 and len(native) == 1:
            self._native_update(dys[0], *native[0])
            return loss.detach()
        if len(native) == len(calls) and self._native_update_calls(dys, native):
            return loss.detach()
        grads: dict = {}
        hiddens = iter(native)
        for (_, saved), dy in zip(calls, dys, strict=True):
            if saved is None:
                saved = self._native_saved(*next(hiddens)[:4])
            self._backward(dy, saved, grads)
        self._update(grads)
        return loss.detach()

    def _native_update_calls(self, dys: tuple, native: list) -> bool:
        """Several native calls' backward and update as one call,
        `glai_ext::mlp_step_update_calls` (each call's gradients summed in call order, then
        `_fused_sgd_`: the Python path's sums), when the calls agree on the GEMM and on which
        layers drop; False (nothing done) otherwise."""
        own = native[0][-1]
        if any(call[-1] != own or bool(call[2]) != bool(native[0][2])
               or [n is None for n in call[3]] != [n is None for n in native[0][3]]
               for call in native):
            return False
        grads = self._gradient_buffers(native[0][4], native[0][5])
        group = self.optimizer.param_groups[0]
        torch.ops.glai_ext.mlp_step_update_calls(
            list(dys), [call[0] for call in native],
            [h for call in native for h in call[1]], native[0][4], native[0][5], grads,
            group["lr"], group["weight_decay"], group["dampening"], own,
            [r for call in native for r in call[2]], [n for call in native for n in call[3]])
        return True

    def _gradient_buffers(self, weights: list, biases: list) -> list:
        """The native updates' gradient buffers, kept from step to step (the parameters'
        shapes)."""
        grads = self._grads
        params = [p for pair in zip(weights, biases, strict=True) for p in pair]
        if len(grads) != len(params) or any(
                g.shape != p.shape or g.dtype != p.dtype for g, p in zip(grads, params,
                                                                         strict=True)):
            grads = self._grads = [torch.empty_like(p) for p in params]
        return grads

    def _native_update(self, dy: torch.Tensor, x: torch.Tensor, hidden: list, relus: list,
                       noise: list, weights: list, biases: list, own: bool) -> None:
        """The backward and the fused SGD update as one call, `glai_ext::mlp_step_update`,
        the gradients into buffers kept from step to step (the parameters' shapes)."""
        grads = self._gradient_buffers(weights, biases)
        group = self.optimizer.param_groups[0]
        torch.ops.glai_ext.mlp_step_update(dy, x, hidden, weights, biases, grads,
                                           group["lr"], group["weight_decay"],
                                           group["dampening"], own, relus, noise)

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
