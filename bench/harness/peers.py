"""Peers: what a user would write instead of this package, timed in the same run.

A peer is bench-only: it is not registered with `glai_kernels.registry`, so `auto` can never
return it and `estimator(..., backend=...)` does not know it. Each is a plain differentiable
function (x [B, I], act [B, P], weight [O, I, P]) -> y [B, O] that autograd differentiates;
the runner times it beside the backends, checks it against the same float64 oracle, and
reports every backend's ratio to the best peer (`results.PEER_COLUMN`).

    peer:einsum        torch.einsum("bi,bs,ois->bo", x, act, weight), one line, with
                       opt_einsum installed (torch then picks the contraction order)
    peer:max-autotune  torch.compile(mode="max-autotune") of the `torch` backend's
                       formulation, one graph per shape, dtype and grad mode (cached by
                       torch.compile's guards); only in the sweeps a preset names for it,
                       since each graph autotunes for seconds
    torch              the `torch` backend itself (a registered backend, always timed)
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bench.harness.passes import Call, PassSpec, Tensors, rotating, split_available
from glai_kernels.backends.torch import torch_forward
from glai_kernels.contract import GRADIENTS, Shape

PREFIX = "peer:"
# the registered backend that is also a peer: plain PyTorch GEMMs
BACKEND_PEERS: tuple[str, ...] = ("torch",)
# one graph per (shape, dtype, grad mode): more than dynamo's default 8 per function
_RECOMPILE_LIMIT = 1024

PeerFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Peer:
    """A bench-only formulation. `sweeps`: the sweeps it runs in (None: every sweep)."""

    name: str
    forward: PeerFn
    description: str
    availability: Callable[[str], str | None]
    sweeps: tuple[str, ...] | None = None


def einsum_one_line(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O], as a user would write it."""
    return torch.einsum("bi,bs,ois->bo", x, act, weight)


def _einsum_availability(device_type: str) -> str | None:
    if not torch.backends.opt_einsum.is_available():
        return "opt_einsum is not installed (pip install opt-einsum): torch.einsum would " \
               "contract left to right, which no user tuning for speed would accept"
    if not torch.backends.opt_einsum.enabled:
        return "torch.backends.opt_einsum.enabled is False"
    return _device(device_type)


def _device(device_type: str) -> str | None:
    if device_type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    return None


def _torch_formulation(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # its own function, so its own code object: dynamo keeps graphs per code object, and
    # compiling `torch_forward` itself shared one graph budget with the `compile` backend;
    # a default run then hit the limit mid-run (one graph per shape and dtype here)
    return torch_forward(x, act, weight)


@functools.cache
def _max_autotune() -> PeerFn:
    compiled = torch.compile(_torch_formulation, mode="max-autotune", dynamic=False,
                             fullgraph=True)

    def run(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # fullgraph: running out of graphs is an error, never a silent eager fallback; the
        # autotuner's per-GEMM tables would bury the run's log, so they are not printed
        with (torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT,
                                         accumulated_recompile_limit=_RECOMPILE_LIMIT),
              torch._inductor.config.patch(autotune_num_choices_displayed=0)):
            return compiled(x, act, weight)

    return run


def max_autotune(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]: the `torch` backend's forward
    compiled with mode="max-autotune" (autograd differentiates the compiled graph)."""
    return _max_autotune()(x, act, weight)


def _compile_availability(device_type: str) -> str | None:
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton"
    if device_type == "cpu" and shutil.which("c++") is None and shutil.which("g++") is None:
        return "torch.compile on CPU needs a C++ compiler"
    return _device(device_type)


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer(PREFIX + "einsum", einsum_one_line,
         'torch.einsum("bi,bs,ois->bo", x, act, weight) with opt_einsum',
         _einsum_availability),
    Peer(PREFIX + "max-autotune", max_autotune,
         'torch.compile(mode="max-autotune") of the torch backend\'s formulation',
         _compile_availability, sweeps=("heads",)),
)}


def estimate_bytes(shape: Shape, spec: PassSpec, itemsize: int) -> int:
    """Bytes a peer's call keeps alive at its peak, erring on the safe side: the larger of
    the `torch` formulation's intermediates and the outer product [B, I, P] (twice in a
    backward) that a contraction order may build, as the `einsum` backend does."""
    from bench.harness import memory

    return max(memory.estimate_bytes(b, shape, spec, itemsize) for b in ("einsum", "torch"))


def is_peer(name: str) -> bool:
    """True for a bench-only peer ("peer:...")."""
    return name.startswith(PREFIX)


def is_peer_or_backend_peer(name: str) -> bool:
    """True for the names the best-peer ratio is over: the peers and the `torch` backend."""
    return is_peer(name) or name in BACKEND_PEERS


def get(name: str) -> Peer:
    try:
        return PEERS[name if is_peer(name) else PREFIX + name]
    except KeyError:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}") from None


def select(requested: Sequence[str] | None, device: torch.device,
           log: Callable[[str], None] = print) -> tuple[list[str], dict[str, str]]:
    """(peers to run, {unavailable peer: reason}); `requested` names them with or without
    the prefix (None: every peer)."""
    names = [get(n).name for n in requested] if requested is not None else list(PEERS)
    run, unavailable = split_available(names,
                                       lambda name: PEERS[name].availability(device.type))
    for name, reason in unavailable.items():
        log(f"peer {name!r} is unavailable on {device.type}: {reason}")
    return run, unavailable


def for_sweeps(peers: Sequence[str], sweeps: Sequence[str]) -> list[str]:
    """The peers that run for a shape measured for `sweeps`."""
    return [p for p in peers if PEERS[p].sweeps is None or set(PEERS[p].sweeps) & set(sweeps)]


def _call(fn: PeerFn, spec: PassSpec, t: Tensors) -> Callable[[], object]:
    """One pass of a peer, timed as bench.harness.passes times a backend's (`Call.timed`): forward
    under no_grad; backward from a forward kept with its graph (autograd's saved state); both
    and train as one forward and one torch.autograd.grad call."""
    if spec.name == "forward":
        def forward() -> torch.Tensor:
            with torch.no_grad():
                return fn(t.x, t.act, t.weight)
        return forward
    leaves = {name: getattr(t, name).detach().requires_grad_(name in spec.grads)
              for name in GRADIENTS}
    x, act, weight = leaves["x"], leaves["act"], leaves["weight"]
    wanted = [leaves[g] for g in spec.grads]
    if spec.name == "backward":
        with torch.enable_grad():
            kept = fn(x, act, weight)

        def backward() -> object:
            return torch.autograd.grad(kept, wanted, t.dy, retain_graph=True)
        return backward

    def autograd() -> object:
        y = fn(x, act, weight)
        return y, torch.autograd.grad(y, wanted, t.dy)
    return autograd


def make_call(name: str, spec: PassSpec, sets: Sequence[Tensors]) -> Call:
    """As bench.harness.passes.make_call, for the peer `name`, cycling through the input sets."""
    return rotating(spec, [_call(PEERS[name].forward, spec, t) for t in sets])
