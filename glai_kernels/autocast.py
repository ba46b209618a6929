"""Both ops under `torch.autocast`, stated once: they run the way aten's matmul does.

Inside an autocast region the ops' floating inputs other than float64 (x, act, the weight or
the sparse op's values, bias) are cast to the region's dtype, and the backend then runs in
that dtype, with float32 accumulation, under no autocast of its own. `estimator()` casts
before its checks (`autocast_dtype`, `autocast_inputs`), so the checks and the backend see the
dtype it runs in; `register` does the same for a direct call of the custom op, at the
Autocast<Device> dispatch key of each device type in `AUTOCAST_DEVICES`, as
torch.library.register_autocast does but casting to the region's own dtype (that function
takes one fixed dtype). The kernels run with the key excluded, so no matmul or einsum inside a
backend is autocast again: every backend sees one dtype and computes the same thing. A
backward op's inputs already share the dtype its forward ran in: no cast, only no autocast.
"""

from __future__ import annotations

import torch

# Device types whose autocast the ops follow (each has an Autocast<Device> dispatch key).
AUTOCAST_DEVICES: tuple[str, ...] = ("cpu", "cuda")

_LIBRARY = torch.library.Library("glai", "IMPL")


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype an enclosing torch.autocast region runs the ops in on `device_type`, or
    None outside one."""
    if device_type in AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast_inputs(tensors: tuple, device_type: str, dtype: torch.dtype) -> tuple:
    """`tensors` as autocast casts them: floating tensors on `device_type` other than float64
    to `dtype` (as aten's autocast does); anything else (a backend's name, a flag, the sparse
    op's list of index tensors) unchanged."""
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point()
                 and t.device.type == device_type and t.dtype != torch.float64 else t
                 for t in tensors)


def register(forward_name: str, forward_op, backward_name: str, backward_op) -> None:
    """Register the custom ops `glai::<forward_name>` (`forward_op`) and its backward op at
    every Autocast<Device> key of `AUTOCAST_DEVICES`: the forward's inputs cast, both run with
    the key excluded."""
    for device_type in AUTOCAST_DEVICES:
        _register(device_type, forward_name, forward_op, backward_name, backward_op)


def _register(device_type: str, forward_name: str, forward_op, backward_name: str,
              backward_op) -> None:
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def forward(_keyset, *args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type)
        args = autocast_inputs(args, device_type, dtype)
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return forward_op._opoverload(*args, **kwargs)

    def backward(_keyset, *args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return backward_op._opoverload(*args, **kwargs)

    _LIBRARY.impl(forward_name, forward, key, with_keyset=True)
    _LIBRARY.impl(backward_name, backward, key, with_keyset=True)
