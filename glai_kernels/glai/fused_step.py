"""A sparse GLAIHead's training step without autograd over the estimator or torch.optim's
Python wrapper: the ordinary loop's arithmetic, bit for bit with torch's update
(`kernel_adam=False`), to rounding with the update inside the dvalues kernel (the default).

At the paper's batch size the sparse `cpp` kernels take less time than the machinery around
them: torch's autograd engine over the estimator's autograd.Function, `Adam.step`'s wrapper
(`_init_group`, the step count's bookkeeping), `zero_grad`, `nn.Module.__call__`
(docs/notes/sparse.md, "Training step: the Python around the kernels (third pass)" and "the fused
step (fourth pass)"). `FusedSparseStep` keeps the kernels and drops the machinery:

    stepper = FusedSparseStep(head, optimizer)      # optimizer: torch.optim.Adam/AdamW
    loss = stepper.step(lambda model: F.cross_entropy(model(x), target))

`step(loss_of)` calls `loss_of(stand_in)`; each `stand_in(x)` (x [B, n0]) runs the head's
forward without recording autograd (the frozen selector with its dropout in training mode,
drawing the same random numbers as `head(x)`; the sparse backend's forward; the bias) and
returns y [B, O] as a fresh leaf that requires grad. The loss is built from y with ordinary
torch ops (any loss: cross entropy, InfoNCE over two views of one call, few-shot prototypes),
and autograd runs over the loss alone, to y. Then the backend's backward computes dvalues [K]
only (x is data, the selector is frozen), dbias = dy summed over the batch, and the
optimizer's own update runs on the kept values and the bias: `torch._fused_adam_` /
`torch._fused_adamw_` with the optimizer's hyper-parameters and its state tensors (created
as torch.optim creates them), so the stepper and `optimizer.step()` can take turns. With a
non-fused optimizer the gradients are set and `optimizer.step()` runs.

With the `cpp` backend, float32/float64 values, a fused optimizer and one model call per loss,
the kept values' update runs inside the dvalues kernel instead (`kernel_adam=True`, the
default): `glai_ext::sparse_dvalues_adam` computes dvalues for a chunk of groups and applies
Adam/AdamW to that chunk's values and moments while they are in cache, where `_fused_adam_`
re-read all four [K] arrays in a pass of its own (docs/notes/sparse.md, "Adam inside dvalues"), and
a fused-group bias is updated by `glai_ext::bias_adam` (dbias and its update in one call). It
is torch's formula with torch's scalars; the float operations may be contracted differently
from torch's build, so the values agree with the torch update to within a few units in the
last place per step, not bit for bit. `kernel_adam=False` keeps torch's own update and with
it the bit-for-bit equality with the ordinary loop.

After `step` the parameters' `.grad` are None, as after `zero_grad(set_to_none=True)`.

The engineered protocol's step (`native=True`, the default; issue 41): where the step allows
it (the head's one-layer selector on the extension's GEMM, its dropout in training drawn inside
the call as the Python path draws it; the
`cpp` backend; float32/float64 on CPU), the model call is one extension call,
`glai_ext::sparse_step_forward` (the selector's gates, x with its column of ones, the sparse
forward and the bias), and with the update in the kernel and the bias in the values' fused
group, the update is one more, `glai_ext::sparse_step_update` (both step counts, dvalues with
the values' Adam, the bias's): the same kernels on the same tensors as the Python path, so the
same bits, without the Python and dispatches around them (csrc/cpu/engineered_steps.cpp). With
several model calls per loss the update is one call too, `glai_ext::sparse_step_update_calls`
(each call's dvalues and dbias summed in call order, then torch's `_fused_adam_`: the Python
path's several-call update, its bits). The MLP's engineered step gets the same calls
(glai/mlp_step.py, `HandFusedMLPStep`).

The step follows its head: each step checks (by identity and size) the tensors it reads, so
after `head.load_state_dict(...)`, of the same K or another, it trains what was loaded. A
load of another K keeps the values' Parameter object (SparsePathWeight) but resizes it: the
step then resets the Adam state of every parameter whose size changed (step count 0, zero
moments: the old moments belonged to other entries), and keeps the state of the others, and
of the values when the optimizer's state dict for the new K was loaded too. A head changed
so that the optimizer no longer steps exactly its trainable parameters (a new Parameter put
in place) raises ValueError at the next step, saying so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from glai_kernels import calls as backend_calls
from glai_kernels import fused, registry
from glai_kernels.contract import accumulation_dtype
from glai_kernels.glai.head import GLAIHead
from glai_kernels.glai.selector import PathSelector, _padded_columns
from glai_kernels.sparse import op as sparse_op
from glai_kernels.sparse.layout import KeptIndex

_UNSUPPORTED_OPTIONS = ("amsgrad", "maximize", "capturable", "differentiable")
# the sparse backends whose dvalues has a fused update (glai_kernels/fused.py): `cpp` on the CPU,
# `cuda` on CUDA (csrc/cuda/sparse_step_kernels.cu)
_KERNEL_ADAM_BACKENDS = ("cpp", "cuda")


def _refuse_optimizer(head: GLAIHead, optimizer: torch.optim.Optimizer) -> str | None:
    """Why `optimizer` cannot drive a fused step of `head`, or None."""
    if not isinstance(optimizer, torch.optim.Adam):  # AdamW subclasses Adam
        return f"optimizer must be torch.optim.Adam or AdamW, got {type(optimizer).__name__}"
    trainable = [p for p in head.parameters() if p.requires_grad]
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    if {id(p) for p in stepped} != {id(p) for p in trainable} or len(stepped) != len(trainable):
        return ("optimizer must step exactly the head's trainable parameters (the kept values "
                "and the bias)")
    for group in optimizer.param_groups:
        on = [name for name in _UNSUPPORTED_OPTIONS if group.get(name)]
        if on:
            return f"optimizer options {on} are not implemented by the fused step"
    if getattr(optimizer, "grad_scale", None) is not None:
        return "optimizer has a grad_scale (AMP): not implemented by the fused step"
    return None


def _refuse_head(head: GLAIHead) -> str | None:
    if not isinstance(head, GLAIHead):
        return f"head must be a GLAIHead, got {type(head).__name__}"
    if head.layout != "sparse":
        return "head must have the sparse layout (prune(..., layout='sparse' or 'auto'))"
    if not head.sparse_weight.values.requires_grad:
        return "head's kept values must require grad (they are what the step trains)"
    return None


def supported(head: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether `FusedSparseStep(head, optimizer)` would accept them."""
    return _refuse_head(head) is None and _refuse_optimizer(head, optimizer) is None


class FusedSparseStep:
    """One training step of a sparse-layout GLAIHead with Adam/AdamW (module docstring).

    Args:
        head: a GLAIHead in the sparse layout whose kept values require grad.
        optimizer: torch.optim.Adam or AdamW over exactly the head's trainable parameters,
            without amsgrad, maximize, capturable, differentiable or a grad scaler.
        kernel_adam: update the kept values inside the `cpp` dvalues kernel where the step
            allows it (module docstring); False: always torch's `_fused_adam_`.
        native: run the forward and the update as one extension call each where the step
            allows it (module docstring); False: the Python path (the same bits).
    Raises:
        ValueError naming the argument when either is not supported.
    """

    def __init__(self, head: GLAIHead, optimizer: torch.optim.Optimizer,
                 kernel_adam: bool = True, native: bool = True) -> None:
        why = _refuse_head(head)
        if why is not None:
            raise ValueError(f"FusedSparseStep: {why}")
        why = _refuse_optimizer(head, optimizer)
        if why is not None:
            raise ValueError(f"FusedSparseStep: {why}")
        self.head, self.optimizer = head, optimizer
        self.kernel_adam, self.native = bool(kernel_adam), bool(native)
        # (plan, (batch, request, $GLAI_BACKEND, grad mode), the backend's name)
        self._native_resolved = None
        self._resolved = None  # ((request, $GLAI_BACKEND, device, dtype, call), backend)
        self._cached_plan: _Plan | None = None

    def _forward(self, x: torch.Tensor, calls: list, plan: _Plan) -> torch.Tensor:
        values = plan.values
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"FusedSparseStep: the model's input x must be a tensor, got "
                            f"{type(x).__name__}")
        if x.requires_grad:
            raise ValueError("FusedSparseStep: x must not require grad (the fused step "
                             "computes no gradient for the head's input); train with "
                             "autograd instead")
        if x.dtype != values.dtype or x.device != values.device:
            raise ValueError(f"FusedSparseStep: x must be {values.dtype} on {values.device} "
                             f"like the head, got {x.dtype} on {x.device}")
        # the selector checks x's shape; what the estimator's checks (`check_inputs`) would
        # add here is fixed for the head and was checked when its weight was built
        batch = x.shape[0]
        if self.native and self._native_forward(x, plan):
            weight_t, sel_bias = plan.selector._derived(
                "columns", (plan.sel_buffers["weight0"], plan.sel_buffers["bias0"],
                            plan.sel_buffers["units"]), _selector_columns)
            selector = plan.selector
            rate = selector.dropout[0] if selector.training else 0.0
            y, x_aug, act = torch.ops.glai_ext.sparse_step_forward(
                x, weight_t, sel_bias, plan.paths, values.detach(), plan.index_list,
                None if plan.bias is None else plan.bias.detach(), rate,
                plan.sel_buffers["units"][0] if rate > 0 else None, selector.widths[1])
            y.requires_grad_(True)
            calls.append((x_aug, act, self._resolved[1], y))
            return y
        with torch.no_grad():
            act = plan.selector(x).contiguous()
            x_aug = F.pad(x, (0, 1), value=1.0).contiguous()
        # outside no_grad: "auto" is told the call's mode as the ordinary step's ("train")
        impl = self._backend(x_aug, act, plan)
        with torch.no_grad():
            if plan.nnz == 0 or batch == 0:
                y = x.new_zeros(batch, plan.outputs)  # an empty sum is zero
            else:
                # the forward body's call and result check (glai_kernels/calls.py, run_forward)
                y = backend_calls.checked(impl, "y", impl.forward(x_aug, act, values, plan.index),
                                          (batch, plan.outputs), x.dtype)
            if plan.bias is not None:
                y = y + plan.bias
        y.requires_grad_(True)
        calls.append((x_aug, act, impl, y))
        return y

    def _native_forward(self, x: torch.Tensor, plan: _Plan) -> bool:
        """Whether this model call can be `glai_ext::sparse_step_forward`: one frozen layer
        on the selector's extension GEMM (PathSelector.forward's condition; its dropout in
        training runs inside the op, drawing F.dropout's random numbers over the hidden
        units' gates, as the Python path does), a non-empty call, and the `cpp` backend
        resolved for it (`_backend`'s resolution, kept per batch size: the call's shape is
        fixed by the plan but for the batch)."""
        selector = plan.selector
        if not (plan.native and x.dim() == 2 and x.shape[0] > 0
                and x.shape[1] == selector.widths[0] and selector._use_extension(x)):
            return False
        key = (x.shape[0], self.head.backend, os.environ.get(registry.ENV_VAR),
               torch.is_grad_enabled())
        known = self._native_resolved
        if known is None or known[0] is not plan or known[1] != key:
            # the backend `_backend` picks for x_aug [B, n0 + 1] and act [B, P]: resolved on
            # stand-ins of their shapes (what auto is told: the shapes, device, dtype, mode)
            shape_of = x.new_empty(())
            self._backend(shape_of.expand(x.shape[0], x.shape[1] + 1),
                          shape_of.expand(x.shape[0], plan.paths), plan)
            self._native_resolved = (plan, key, self._resolved[1].name)
        elif self._resolved is None:
            return False
        else:  # the resolution `_backend` keeps: the head's backend_used, as it sets it
            self._backend_used(self._resolved[1])
        return self._native_resolved[2] == "cpp" and self._resolved[1].name == "cpp"

    def _backend_used(self, impl) -> None:
        used = f"sparse:{impl.name}"
        if self.head.__dict__.get("backend_used") != used:  # nn.Module's __setattr__ ≈ 1 µs
            self.head.backend_used = used

    def _backend(self, x_aug: torch.Tensor, act: torch.Tensor, plan: _Plan):
        """The sparse backend the head's forward would run (GLAIHead.forward's resolve)."""
        head = self.head
        call = sparse_op.auto_call(x_aug, act, plan.parts[1], head.backend)  # parts[1]: sw
        key = (head.backend, os.environ.get(registry.ENV_VAR), x_aug.device, x_aug.dtype, call)
        if self._resolved is None or self._resolved[0] != key:
            self._resolved = (key, sparse_op.resolve(head.backend, x_aug.device, x_aug.dtype,
                                                     call))
        used = f"sparse:{self._resolved[1].name}"
        if head.__dict__.get("backend_used") != used:  # nn.Module's __setattr__ costs ≈ 1 µs
            head.backend_used = used
        return self._resolved[1]

    def _plan(self) -> _Plan:
        # read from the module dicts (GLAIHead's and nn.Module's __getattr__ cost ≈ 1 µs a
        # read) and checked anew each step, rebuilt when anything it holds was replaced or
        # resized (load_state_dict replaces the weight's buffers, resizes its values)
        head = self.head
        sw = head._modules.get("sparse_weight")
        if sw is None:
            raise ValueError("FusedSparseStep: the head no longer has the sparse layout (its "
                             "sparse_weight was removed); build a new step for it")
        parts = (head._modules["selector"], sw, head._parameters.get("bias"),
                 sw._parameters["values"], *sw._buffers.values())
        plan = self._cached_plan
        if plan is None or len(plan.parts) != len(parts) or any(
                a is not b for a, b in zip(plan.parts, parts, strict=True)) or (
                plan.nnz != parts[3].numel()):
            if plan is not None:
                self._rebind()
            selector, _, bias, values = parts[:4]
            index = sparse_op.contiguous_index(sw.index)
            buffers = selector._buffers
            native = (isinstance(selector, PathSelector) and selector.hidden_layers == 1
                      and values.device.type == "cpu"
                      and values.dtype in (torch.float32, torch.float64) and values.numel() > 0)
            plan = _Plan(parts, selector, bias, values, index, sw.shape[0], values.numel(),
                         native, buffers, buffers["units"].shape[1] if native else 0,
                         list(index))
            self._cached_plan = plan
        return plan

    def _rebind(self) -> None:
        """Follow a head whose tensors changed under the step (a load_state_dict): refuse
        what the step could not have been built for, and reset the Adam state of each
        parameter whose size changed (its moments were the old entries'; torch.optim.Adam
        would refuse to step them)."""
        why = _refuse_head(self.head) or _refuse_optimizer(self.head, self.optimizer)
        if why is not None:
            raise ValueError(f"FusedSparseStep: the head changed since the step was built "
                             f"and {why}; build a new optimizer and step for it")
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if state and state["exp_avg"].shape != p.shape:
                    state.clear()  # `_state` creates it anew: step 0, zero moments

    def step(self, loss_of: Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]
             ) -> torch.Tensor:
        """Run `loss_of(model)` with a stand-in for the head, then backward and the
        optimizer's update; returns the loss, detached."""
        calls: list = []
        plan = self._plan()
        loss = loss_of(lambda x: self._forward(x, calls, plan))
        if not calls:
            raise ValueError("FusedSparseStep: loss_of never called the model")
        grads = torch.autograd.grad(loss, [y for *_, y in calls], allow_unused=True)
        bias, values = plan.bias, plan.values
        train_bias = bias is not None and bias.requires_grad
        group = self._kernel_adam_group(calls, grads, plan)
        if group is not None and self.native and self._native_update(group, calls, grads, plan):
            return loss.detach()
        if group is not None:
            (x_aug, act, _, _), dy = calls[0], grads[0].contiguous()
            self._adam_in_kernel(group, dy, x_aug, act, plan)
            if train_bias:
                bias_group = self._fused_group(bias)
                if bias_group is not None:
                    self._bias_adam_in_kernel(bias_group, dy, bias)
                else:
                    self._update([(bias, _bias_grad(dy))])
            return loss.detach()
        if self.native and len(calls) > 1 and self._native_update_calls(calls, grads, plan):
            return loss.detach()
        needs = (False, False, True)
        dvalues = dbias = None
        for (x_aug, act, impl, _), dy in zip(calls, grads, strict=True):
            if dy is None:  # this call's output did not reach the loss
                continue
            dy = dy.contiguous()
            if plan.nnz == 0 or x_aug.shape[0] == 0:
                dv = torch.zeros_like(values)
            else:  # the plain backward's call and check (glai_kernels/calls.py, gradients)
                dv = backend_calls.checked(
                    impl, "dvalues", impl.backward(dy, x_aug, act, values, plan.index, needs)[2],
                    values.shape, values.dtype)
            dvalues = dv if dvalues is None else dvalues + dv
            if train_bias:
                db = _bias_grad(dy)
                dbias = db if dbias is None else dbias + db
        if dvalues is None:
            raise ValueError("FusedSparseStep: the loss does not depend on the model's output")
        pairs = [(values, dvalues)] + ([(bias, dbias)] if dbias is not None else [])
        self._update(pairs)
        return loss.detach()

    def _kernel_adam_group(self, calls: list, grads: tuple, plan: _Plan) -> dict | None:
        """The values' param group when their update can run inside the dvalues kernel."""
        if not (self.kernel_adam and len(calls) == 1 and grads[0] is not None
                and calls[0][2].name in _KERNEL_ADAM_BACKENDS and plan.nnz > 0
                and plan.values.dtype in (torch.float32, torch.float64)):
            return None
        return self._fused_group(plan.values)

    def _native_update(self, group: dict, calls: list, grads: tuple, plan: _Plan) -> bool:
        """The kernel-Adam update as one call, `glai_ext::sparse_step_update`, when the
        bias (if trained) is in the values' group; False (nothing done) otherwise."""
        if calls[0][2].name != "cpp":  # the op has a CPU kernel alone (a GPU lease's pipeline
            return False  # failed on it, stop 48): the `cuda` backend's update is the Python's
        bias_args = self._bias_args(group, plan.bias)
        if bias_args is None:
            return False
        state = self._state(plan.values)
        beta1, beta2 = group["betas"]
        x_aug, act, _, _ = calls[0]
        torch.ops.glai_ext.sparse_step_update(
            grads[0], x_aug, act, plan.values.detach(), plan.index_list, state["exp_avg"],
            state["exp_avg_sq"], state["step"], *bias_args, float(group["lr"]), beta1, beta2,
            group["weight_decay"], group["eps"], bool(group.get("decoupled_weight_decay")))
        return True

    def _native_update_calls(self, calls: list, grads: tuple, plan: _Plan) -> bool:
        """Several model calls' update as one call, `glai_ext::sparse_step_update_calls`
        (each call's dvalues and dbias summed in call order, then torch's `_fused_adam_`: the
        Python path below, its bits), when every call ran the `cpp` backend on a non-empty
        batch and reached the loss, and the values (and a trained bias) are in one fused
        group with a float lr; False (nothing done) otherwise."""
        values, bias = plan.values, plan.bias
        if not (plan.nnz > 0 and values.device.type == "cpu"
                and values.dtype in (torch.float32, torch.float64)
                and all(dy is not None for dy in grads)
                and all(impl.name == "cpp" and x_aug.shape[0] > 0
                        for x_aug, _, impl, _ in calls)):
            return False
        group = self._fused_group(values)
        if group is None or isinstance(group["lr"], torch.Tensor):
            return False
        bias_args = self._bias_args(group, bias)
        if bias_args is None:
            return False
        state = self._state(values)
        beta1, beta2 = group["betas"]
        torch.ops.glai_ext.sparse_step_update_calls(
            list(grads), [c[0] for c in calls], [c[1] for c in calls], values.detach(),
            plan.index_list, state["exp_avg"], state["exp_avg_sq"], state["step"], *bias_args,
            float(group["lr"]), beta1, beta2, group["weight_decay"], group["eps"],
            bool(group.get("decoupled_weight_decay")))
        return True

    def _bias_args(self, group: dict, bias: torch.Tensor | None) -> tuple | None:
        """The native updates' bias operands (bias, its exp_avg, exp_avg_sq, step), four Nones
        when no bias is trained, None when a trained bias is not in the values' `group` (its
        update is then the Python path's)."""
        if bias is None or not bias.requires_grad:
            return (None, None, None, None)
        if not any(p is bias for p in group["params"]):
            return None
        state = self._state(bias)
        return bias.detach(), state["exp_avg"], state["exp_avg_sq"], state["step"]

    def _fused_group(self, param: torch.Tensor) -> dict | None:
        """`param`'s param group when it is a fused one, else None."""
        for group in self.optimizer.param_groups:
            if any(p is param for p in group["params"]):
                return group if group.get("fused") else None
        return None

    def _adam_in_kernel(self, group: dict, dy: torch.Tensor, x_aug: torch.Tensor,
                        act: torch.Tensor, plan: _Plan) -> None:
        fused.sparse_dvalues_adam(dy, x_aug, act, plan.values.detach(), plan.index,
                                  *self._kernel_update_args(group, plan.values))

    def _bias_adam_in_kernel(self, group: dict, dy: torch.Tensor, bias: torch.Tensor) -> None:
        # dbias = dy summed over the batch and the bias's update in one call: torch's sum, step
        # count and _fused_adam_ cost ≈ 17 µs inside a B1 step (docs/notes/sparse.md, "The bias's
        # update in one call, and the selector's tiles")
        fused.bias_adam(dy, bias.detach(), *self._kernel_update_args(group, bias))

    def _kernel_update_args(self, group: dict, param: torch.Tensor) -> tuple:
        """(exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps, step, decoupled) of
        `param` for an update in a glai_ext kernel, its step count advanced as torch's."""
        state = self._state(param)
        state["step"].add_(1)
        beta1, beta2 = group["betas"]
        return (state["exp_avg"], state["exp_avg_sq"], float(group["lr"]), beta1, beta2,
                group["weight_decay"], group["eps"],
                # on CUDA the kernel reads the count on the device: float() would wait for it
                state["step"] if param.device.type == "cuda" else float(state["step"]),
                bool(group.get("decoupled_weight_decay")))

    def _update(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        optimizer = self.optimizer
        unfused = False
        for group in optimizer.param_groups:
            in_group = group["params"]
            mine = [(p, g) for p, g in pairs if any(p is q for q in in_group)]
            if not mine:
                continue
            if not group.get("fused"):
                for p, g in mine:
                    p.grad = g
                unfused = True
                continue
            params = [p for p, _ in mine]
            states = [self._state(p) for p in params]
            steps = [st["step"] for st in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            update = (torch._fused_adamw_ if group.get("decoupled_weight_decay")
                      else torch._fused_adam_)
            # the parameters are leaves that require grad: torch.optim's own update runs
            # under no_grad too; detach() is cheaper than entering the mode
            update([p.detach() for p in params], [g for _, g in mine],
                   [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states], [],
                   steps, amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                   weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                   grad_scale=None, found_inf=None)
        if unfused:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def _state(self, p: torch.Tensor) -> dict:
        # created as torch.optim.Adam's _init_group creates a fused group's state
        state = self.optimizer.state[p]
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


def _bias_grad(dy: torch.Tensor) -> torch.Tensor:
    """dbias [O] = dy [B, O] summed over the batch in the accumulation dtype."""
    acc = accumulation_dtype(dy.dtype)
    db = dy.sum(0, dtype=acc)
    return db.to(dy.dtype) if acc != dy.dtype else db


class _Plan(NamedTuple):
    """What a step reads of the head, kept while the same objects are in place."""

    parts: tuple  # the objects it was built from, compared by identity each step
    selector: torch.nn.Module
    bias: torch.Tensor | None
    values: torch.Tensor
    index: KeptIndex  # contiguous
    outputs: int
    nnz: int
    native: bool  # the selector and the values allow the native forward (`_native_forward`)
    sel_buffers: dict  # the selector's buffers (its module dict: read without __getattr__)
    paths: int  # P, the selector's path columns (0 where not native)
    index_list: list  # `index` as the list the extension's ops take


def _selector_columns(weight: torch.Tensor, bias: torch.Tensor | None, units: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The selected units' columns, zero padded to whole tiles: PathSelector.forward's own
    derivation for its one-layer extension path (the same cache entry, "columns")."""
    return _padded_columns(weight.index_select(0, units[0]).t(),
                           None if bias is None else bias.index_select(0, units[0]))


def fused_step_for(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                   ) -> FusedSparseStep | None:
    """A FusedSparseStep when `model` and `optimizer` support one, else None (train the
    ordinary way)."""
    return FusedSparseStep(model, optimizer) if supported(model, optimizer) else None
