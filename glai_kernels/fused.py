"""The extension's fused training kernels, behind the op layer: the one place that calls them.

Three `glai_ext` kernels serve training beyond the two ops (glai_kernels/op.py,
glai_kernels/sparse/op.py):

    linear               the path selector's frozen layers: x [B, I] @ weight_t [I, N] + bias,
                         or its 0/1 gates, on CPU in float32/float64 (glai/selector.py)
    sparse_dvalues_adam  the sparse `cpp` backward's dvalues [K] and an Adam/AdamW update of
                         the kept values in place, chunk by chunk (glai/fused_step.py); on CUDA
                         `glai_ext::sparse_dvalues_adam_t`, one kernel that sums each entry's
                         gradient and updates it (csrc/cuda/sparse_step_kernels.cu)
    bias_adam            dbias = dy summed over the batch and its Adam/AdamW update in one call
                         (on CUDA `glai_ext::bias_adam_t`)

`unavailable()` says whether they can run on the CPU (the extension's CPU build; it builds on
first call), `cuda_unavailable()` on CUDA (its CUDA part). Where they cannot, each function
here runs the plain PyTorch path instead: the same meaning, another summation order
(`torch.addmm`; the sparse `torch` backend's dvalues, then torch's own `_fused_adam_` /
`_fused_adamw_`, as `torch.optim.Adam(fused=True)` steps). The callers choose when a kernel
pays (the selector's `gemm`, the fused step's `kernel_adam`).

The update arguments `update` are (exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps,
step, decoupled): the parameter's moments (updated in place), torch's hyper-parameters, the
step count already advanced, and AdamW (True) or Adam. `step` is a float, or the optimizer's
0-d float32 state["step"] itself: on CUDA the kernels read it on the device (no wait for the
device, and a CUDA graph of the step replays with each replay's count).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from glai_kernels import extension
from glai_kernels.contract import accumulation_dtype
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR


def unavailable() -> str | None:
    """Why the fused kernels cannot run in this process (the extension's CPU kernels), or None
    when they can. Builds the extension on the first call."""
    return extension.cpu_availability("cpu")


def linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None,
           gates: bool) -> torch.Tensor:
    """A frozen layer: x [B, I] @ weight_t [I, N] + bias [N] -> [B, N], or, with `gates`, its
    0/1 gates [> 0] in x's dtype (the compare fused into the GEMM's store)."""
    if unavailable() is None:
        return extension.run_linear(x, weight_t, bias, gates)
    pre = x @ weight_t if bias is None else torch.addmm(bias, x, weight_t)
    return (pre > 0).to(x.dtype) if gates else pre


def cuda_unavailable() -> str | None:
    """Why the fused kernels cannot run on CUDA in this process (the extension's CUDA part, a
    device), or None when they can."""
    return extension.cuda_availability("cuda")


def _step_tensor(step: float | torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The step count as the 0-d float32 tensor on `param`'s device that the update reads."""
    if isinstance(step, torch.Tensor):
        return step
    return torch.full((), step, dtype=torch.float32, device=param.device)


def _on_cuda_kernel(param: torch.Tensor) -> bool:
    """Whether `param`'s update runs in the CUDA kernels (float32/float64 on a CUDA device that
    the extension's CUDA part serves)."""
    return (param.device.type == "cuda" and param.dtype in (torch.float32, torch.float64)
            and cuda_unavailable() is None)


def _adam_fallback(param: torch.Tensor, grad: torch.Tensor, update: Sequence) -> None:
    """torch's own fused Adam/AdamW step of `param` with `grad` (what the callers ran before a
    kernel did it)."""
    exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps, step, decoupled = update
    step_t = _step_tensor(step, param)
    adam = torch._fused_adamw_ if decoupled else torch._fused_adam_
    adam([param], [grad], [exp_avg], [exp_avg_sq], [], [step_t], amsgrad=False, lr=lr,
         beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, maximize=False,
         grad_scale=None, found_inf=None)


def sparse_dvalues_adam(dy: torch.Tensor, x: torch.Tensor, act: torch.Tensor,
                        values: torch.Tensor, index: Sequence[torch.Tensor],
                        *update) -> None:
    """dvalues [K] of the sparse op for dy [B, O] at (x [B, I], act [B, P], values [K],
    index: the ten KeptIndex tensors, contiguous), and the Adam/AdamW update of `values` (a
    detached view of the parameter), both in place (module docstring for `update`)."""
    if values.device.type == "cuda":
        if _on_cuda_kernel(values):
            exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps, step, decoupled = update
            torch.ops.glai_ext.sparse_dvalues_adam_t(
                dy, x, act, values, list(index), exp_avg, exp_avg_sq,
                _step_tensor(step, values), lr, beta1, beta2, weight_decay, eps, decoupled)
            return
    elif unavailable() is None:
        torch.ops.glai_ext.sparse_dvalues_adam(dy, x, act, values, list(index), *update)
        return
    plain = SPARSE_ESTIMATOR.get("torch")
    dvalues = plain.backward(dy, x, act, values, KeptIndex(*index), (False, False, True))[2]
    _adam_fallback(values, dvalues, update)


def bias_adam(dy: torch.Tensor, bias: torch.Tensor, *update) -> None:
    """dbias [O] = dy [B, O] summed over the batch and the Adam/AdamW update of `bias` (a
    detached view of the parameter), in place (module docstring for `update`)."""
    if bias.device.type == "cuda":
        if _on_cuda_kernel(bias):
            exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps, step, decoupled = update
            torch.ops.glai_ext.bias_adam_t(dy, bias, exp_avg, exp_avg_sq,
                                           _step_tensor(step, bias), lr, beta1, beta2,
                                           weight_decay, eps, decoupled)
            return
    elif unavailable() is None:
        torch.ops.glai_ext.bias_adam(dy, bias, *update)
        return
    dbias = dy.sum(0, dtype=accumulation_dtype(dy.dtype)).to(dy.dtype)
    _adam_fallback(bias, dbias, update)
