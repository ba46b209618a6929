"""The four timed passes, their costs from the contract, and the calls that run them.

Every call goes through the public op (`glai_kernels.estimator` and its two custom ops), so a
measurement includes what a user pays: the op's checks, its dispatch and autograd.

    forward   y = estimator(x, act, weight) under no_grad
    backward  (dx, dact, dweight) = glai::estimator_backward(dy, ...) from the forward's
              saved state, exactly what autograd calls
    both      forward + all three gradients, one torch.autograd.grad call
    train     forward + dweight only: GLAI's training step (frozen selector and backbone)

Costs are the contract's minimum counts (docs/ARCHITECTURE.md §2): `Shape.flops` (forward,
dx and dweight 2·B·I·P·O each, dact 2·B·O·P from the kept Z) and `Shape.min_bytes`, so a
share of the roofline above 100% means the model is wrong (bench/harness/shares.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from glai_kernels.contract import GRADIENTS, SUPPORTED_DTYPES, Pass, Shape
from glai_kernels.op import estimator, estimator_backward_op, estimator_op

# the contract's dtypes by the names presets, results and the command line use ("float32")
DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in SUPPORTED_DTYPES}


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype called `name` ("float32", ...); an unknown name lists the known ones."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


@dataclass(frozen=True)
class PassSpec:
    """A timed pass: which contract pass it is and which gradients its backward computes."""

    name: str
    contract_pass: Pass
    grads: tuple[str, ...]

    def flops(self, shape: Shape) -> int:
        return shape.flops(self.contract_pass, self.grads)

    def min_bytes(self, shape: Shape, itemsize: int) -> int:
        return shape.min_bytes(itemsize, self.contract_pass, self.grads)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names of what the call returns, each checked against the oracle."""
        y = ("y",) if self.contract_pass != "backward" else ()
        return y + tuple(f"d{g}" for g in self.grads)


PASSES: dict[str, PassSpec] = {p.name: p for p in (
    PassSpec("forward", "forward", ()),
    PassSpec("backward", "backward", GRADIENTS),
    PassSpec("both", "both", GRADIENTS),
    PassSpec("train", "both", ("weight",)),
)}


@dataclass(frozen=True)
class Tensors:
    """One call's inputs: x [B, I], act [B, P], weight [O, I, P] and upstream dy [B, O]."""

    x: torch.Tensor
    act: torch.Tensor
    weight: torch.Tensor
    dy: torch.Tensor


Outputs = dict[str, torch.Tensor]


def outputs_of(spec: PassSpec, result: object) -> Outputs:
    """The named outputs the oracle judges, from what one timed call returned: y (forward);
    the gradients in `spec.grads` order (backward); (y, gradients) (both, train)."""
    if spec.name == "forward":
        return {"y": result}  # type: ignore[dict-item]
    if spec.name == "backward":
        return {f"d{g}": d for g, d in zip(spec.grads, result, strict=True)}  # type: ignore[call-overload]
    y, computed = result  # type: ignore[misc]
    return {"y": y.detach(), **{f"d{g}": d for g, d in zip(spec.grads, computed, strict=True)}}


@dataclass(frozen=True)
class Call:
    """One pass on one backend or peer. `timed()` is the code a user writes for that pass and
    nothing more (no result dict, no detach, no grad-mode guard: at B = 16 those cost 3-6 µs a
    call, docs/notes/benchmarks.md, "What the suite times at the paper's batch"); it is what the
    suite warms, times and measures the memory of. Calling the Call returns its named outputs, for
    the oracle."""

    spec: PassSpec
    timed: Callable[[], object]

    def __call__(self) -> Outputs:
        return outputs_of(self.spec, self.timed())


def _forward(backend: str, t: Tensors) -> Callable[[], object]:
    def call() -> torch.Tensor:
        with torch.no_grad():
            return estimator(t.x, t.act, t.weight, backend=backend)
    return call


def _backward(backend: str, t: Tensors) -> Callable[[], object]:
    # the forward's saved state, as autograd keeps it when act needs a gradient
    _, saved = estimator_op(t.x, t.act, t.weight, None, backend, True)
    needs = [True, True, True]

    def call() -> object:
        return estimator_backward_op(t.dy, t.x, t.act, t.weight, saved, needs, backend)
    return call


def _autograd(backend: str, t: Tensors, grads: tuple[str, ...]) -> Callable[[], object]:
    leaves = {name: getattr(t, name).detach().requires_grad_(name in grads)
              for name in GRADIENTS}
    x, act, weight = leaves["x"], leaves["act"], leaves["weight"]
    wanted = [leaves[g] for g in grads]

    def call() -> object:
        y = estimator(x, act, weight, backend=backend)
        return y, torch.autograd.grad(y, wanted, t.dy)
    return call


def rotating(spec: PassSpec, timed: Sequence[Callable[[], object]]) -> Call:
    """A Call running `timed` in turn (more than one input set rotates inputs so a GPU's L2
    does not keep the last call's operands)."""
    if len(timed) == 1:
        return Call(spec, timed[0])
    rotation = itertools.cycle(timed)
    return Call(spec, lambda: next(rotation)())


def make_call(backend: str, spec: PassSpec, sets: Sequence[Tensors]) -> Call:
    """`spec` on `backend`, cycling through the input sets."""
    if spec.name == "forward":
        return rotating(spec, [_forward(backend, t) for t in sets])
    if spec.name == "backward":
        return rotating(spec, [_backward(backend, t) for t in sets])
    return rotating(spec, [_autograd(backend, t, spec.grads) for t in sets])


def split_available(names: Sequence[str], reason_of: Callable[[str], str | None],
                    label: Callable[[str], str] = str) -> tuple[list[str], dict[str, str]]:
    """(the names whose `reason_of` is None, in order; {label(name): reason} for the rest):
    what a run times and what its meta reports as unavailable, for backends, sparse backends
    and peers alike."""
    run, unavailable = [], {}
    for name in names:
        reason = reason_of(name)
        if reason is None:
            run.append(name)
        else:
            unavailable[label(name)] = reason
    return run, unavailable
