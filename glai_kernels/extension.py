"""The glai_ext extension's ops as Python sees them: a wrapper per op (`run_*`), their fakes
(for torch.compile, export and opcheck), and the availability of the backends that run them.
Not a backend: `backends/cpp.py`, `backends/cuda.py` and their sparse twins run these ops.

The library itself (sources, flags, the ahead-of-time and just-in-time builds, the cache) is
`extension_build.py`'s; `load()` gets it loaded, once per process, and registers the fakes.
The dense ops `glai_ext::forward` and `glai_ext::backward` run fused, cache-blocked,
vectorised CPU kernels and, when built with CUDA, tiled GEMMs forming the Khatri-Rao operand
in shared memory (tensor cores for half types); the sparse ones gather over the kept-path
layout.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from glai_kernels import extension_build
from glai_kernels.contract import accumulation_dtype
from glai_kernels.extension_build import EXTENSION_NAME, Build


def load() -> Build:
    """extension_build.build() (once per process), and, once it has loaded the library, the
    fakes of its ops registered: what a caller that runs the ops uses."""
    result = extension_build.build()
    if result.error is None:
        register_fakes()
    return result


# ---- the ops as torch sees them --------------------------------------------------------------

def run_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
                save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """glai_ext::forward: (y [B, O], saved), saved = Z [B, O, P] from the CPU kernels when
    `save` (Z[b, o, s] = sum_i x[b, i] weight[o, i, s], float32 for half inputs), else (and
    on CUDA) empty [0]."""
    return torch.ops.glai_ext.forward(x, act, weight, save)


def run_linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None,
               gates: bool) -> torch.Tensor:
    """glai_ext::linear: a frozen layer on CPU, x [B, I] @ weight_t [I, N] + bias [N] ->
    [B, N] (float32/float64), or its 0/1 gates [> 0] in x's dtype when `gates`."""
    return torch.ops.glai_ext.linear(x, weight_t, bias, gates)


def run_eager(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None, save: bool, backend: str) -> torch.Tensor:
    """glai_ext::estimator_eager: y [B, O] = the forward + bias, recorded by autograd as one
    C++ node whose backward runs glai_ext::backward (the backward op `backend` names when it
    builds a graph); Z kept for it when `save`."""
    return torch.ops.glai_ext.estimator_eager(x, act, weight, bias, save, backend)


def run_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """glai_ext::backward: dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), None for
    a gradient not in `needs`; `saved`, the forward's Z, makes dact cheap."""
    z = saved if saved is not None else dy.new_empty(0)
    grads = torch.ops.glai_ext.backward(dy, x, act, weight, z, *needs)
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))  # type: ignore[return-value]


def _fake_sizes(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor):
    """(B, I, P, O) once the shapes and dtypes agree, as the C++ check_problem demands."""
    torch._check(x.dim() == 2 and act.dim() == 2 and weight.dim() == 3,
                 lambda: "glai_ext: x must be [B, I], act [B, P] and weight [O, I, P]")
    torch._check(act.dtype == x.dtype and weight.dtype == x.dtype,
                 lambda: "glai_ext: x, act and weight must share a dtype")
    batch, inputs = x.shape
    paths, outputs = act.shape[1], weight.shape[0]
    torch._check(act.shape[0] == batch, lambda: "glai_ext: act and x differ in rows")
    torch._check(weight.shape[1] == inputs, lambda: "glai_ext: weight must be [O, I, P]")
    torch._check(weight.shape[2] == paths, lambda: "glai_ext: weight must be [O, I, P]")
    return batch, inputs, paths, outputs


def _forward_fake(x, act, weight, save):
    batch, _, paths, outputs = _fake_sizes(x, act, weight)
    # the CPU kernels return Z [B, O, P] when asked to save it; the CUDA ones keep none
    keeps_z = save and x.device.type == "cpu"
    # Z in the computation type: float32 for half inputs (as cpu/cpu_dense_binding.cpp keeps it)
    z_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    saved = x.new_empty(batch, outputs, paths, dtype=z_dtype) if keeps_z else x.new_empty(0)
    return x.new_empty(batch, outputs), saved


def _linear_fake(x, weight_t, bias, gates):
    torch._check(x.dim() == 2 and weight_t.dim() == 2 and weight_t.shape[0] == x.shape[1],
                 lambda: "glai_ext::linear: x must be [B, I] and weight_t [I, N]")
    return x.new_empty(x.shape[0], weight_t.shape[1])


def _backward_fake(dy, x, act, weight, saved, need_x, need_act, need_weight):
    batch, _, _, outputs = _fake_sizes(x, act, weight)
    torch._check(dy.dim() == 2, lambda: "glai_ext: dy must be [B, O]")
    torch._check(dy.shape[0] == batch, lambda: "glai_ext: dy must be [B, O]")
    torch._check(dy.shape[1] == outputs, lambda: "glai_ext: dy must be [B, O]")
    return tuple(t.new_empty(t.shape) if need else t.new_empty(0)
                 for t, need in zip((x, act, weight), (need_x, need_act, need_weight),
                                    strict=True))


SPARSE_BATCH_PAD = 16
"""The CPU sparse kernels' Zg^T rows are B rounded up to this (glai_cpu::sparse::kBatchPad)."""


def sparse_saved_shape(groups, batch, device_type: str) -> tuple:
    """Zg^T as the sparse glai_ext kernels keep it: [G, B] on CUDA, [G, B rounded up to
    SPARSE_BATCH_PAD] on the CPU (SymInts work too)."""
    if device_type == "cuda":
        return (groups, batch)
    return (groups, (batch + SPARSE_BATCH_PAD - 1) // SPARSE_BATCH_PAD * SPARSE_BATCH_PAD)


_NOTHING_SAVED = torch.empty(0)  # "recompute the group sums"


def run_sparse_forward(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                       index: Sequence[torch.Tensor]) -> torch.Tensor:
    """glai_ext::sparse_forward (CPU and CUDA): x [B, I], act [B, P], values [K] over the
    kept-path layout `index` (a KeptIndex) -> y [B, O]."""
    return torch.ops.glai_ext.sparse_forward(x, act, values, list(index), False)[0]


def run_sparse_forward_saving(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                              index: Sequence[torch.Tensor]
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """As run_sparse_forward, also returning the group sums Zg^T in the accumulation dtype,
    shaped as sparse_saved_shape says, for dact."""
    y, zg = torch.ops.glai_ext.sparse_forward(x, act, values, list(index), True)
    return y, zg


def run_sparse_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    values: torch.Tensor,
    index: Sequence[torch.Tensor],
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """glai_ext::sparse_backward: dy [B, O] -> (dx [B, I], dact [B, P], dvalues [K]), None for
    a gradient not in `needs`; `saved`, run_sparse_forward's Zg^T, spares dact recomputing
    the group sums."""
    if saved is not None:
        zg = saved
    else:  # one empty tensor for every CPU call: a step at the paper's batch is tens of µs
        zg = _NOTHING_SAVED if dy.device.type == "cpu" else dy.new_empty(0)
    grads = torch.ops.glai_ext.sparse_backward(dy, x, act, values, list(index), zg, list(needs))
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))  # type: ignore[return-value]


def run_sparse_eager(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                     bias: torch.Tensor | None, save: bool, index: Sequence[torch.Tensor],
                     backend: str, ones: bool = False) -> torch.Tensor:
    """glai_ext::sparse_estimator_eager (csrc/cpu/sparse_eager_autograd.cpp): y [B, O] = the
    sparse forward over `index` (a KeptIndex) + bias, recorded by autograd as one C++ node whose
    backward runs glai_ext::sparse_backward (the backward op of the sparse op, on `backend`,
    when it builds a graph); the group sums Zg^T kept for it when `save`. `ones`: x [B, I - 1]
    lacks the index's last input, the constant 1, which the call supplies."""
    return torch.ops.glai_ext.sparse_estimator_eager(x, act, values, list(index), bias, save,
                                                     backend, ones)


def _sparse_forward_fake(x, act, values, index, save):
    groups = index[2].shape[0]  # KeptIndex.group_outputs [G]
    outputs = index[4].shape[0] - 1  # KeptIndex.output_ptr [O + 1]
    acc = accumulation_dtype(x.dtype)
    saved = (x.new_empty(sparse_saved_shape(groups, x.shape[0], x.device.type), dtype=acc)
             if save else x.new_empty(0, 0, dtype=acc))
    return x.new_empty(x.shape[0], outputs), saved


def _sparse_backward_fake(dy, x, act, values, index, saved, needs):
    return tuple(t.new_empty(t.shape) if need else t.new_empty(0)
                 for t, need in zip((x, act, values), needs, strict=True))


def _sparse_dvalues_adam_fake(dy, x, act, values, index, exp_avg, exp_avg_sq, lr, beta1, beta2,
                              weight_decay, eps, step, decoupled):
    return None  # updates values, exp_avg and exp_avg_sq in place


def _bias_adam_fake(dy, bias, exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps, step,
                    decoupled):
    return None  # updates bias, exp_avg and exp_avg_sq in place


@functools.cache
def register_fakes() -> None:
    """Register the fakes of the glai_ext ops that take tensors (dense and sparse), once,
    after the library is loaded (its TORCH_LIBRARY blocks define their schemas)."""
    torch.library.register_fake(f"{EXTENSION_NAME}::forward")(_forward_fake)
    torch.library.register_fake(f"{EXTENSION_NAME}::backward")(_backward_fake)
    torch.library.register_fake(f"{EXTENSION_NAME}::linear")(_linear_fake)
    torch.library.register_fake(f"{EXTENSION_NAME}::sparse_forward")(_sparse_forward_fake)
    torch.library.register_fake(f"{EXTENSION_NAME}::sparse_backward")(_sparse_backward_fake)
    torch.library.register_fake(f"{EXTENSION_NAME}::sparse_dvalues_adam")(
        _sparse_dvalues_adam_fake)
    torch.library.register_fake(f"{EXTENSION_NAME}::bias_adam")(_bias_adam_fake)


def cpu_availability(device_type: str) -> str | None:
    """Why the extension's CPU kernels cannot run here, or None (builds on first call); the
    availability of every backend that runs on them, dense or sparse."""
    return load().error


def cuda_availability(device_type: str) -> str | None:
    """Why the extension's CUDA kernels cannot run here, or None (builds on first call); the
    availability of every backend that runs on them, dense or sparse."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    result = load()
    if result.error is not None:
        return result.error
    return None if result.with_cuda else result.cuda_reason
