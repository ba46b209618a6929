"""The checker: run an estimator implementation forward and backward, compare with the oracle.

`check` takes any callable with the op's signature, so the same code judges every registered
backend and the deliberately wrong implementations it must reject. `check(..., memo=True)`
keeps the last seeded draw and its float64 oracle for the next call with the same draw: the
paper heads' checks judge five backends on one draw each, and at B1's 52 M weights the draw
and the oracle are 80% of a check (docs/notes/ci.md, "bench/tests beside the correctness suite
(stop 54)").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from reference import Inputs, abs_forward64, abs_grads64, forward64, grads64, make_inputs, tolerance
from reference.inputs import Gates
from reference.verdict import judge

EstimatorFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Mismatch:
    """One quantity (y, dx, dact, dweight, dbias, or an input) that failed its check."""

    quantity: str
    error: float
    tolerance: float

    def __str__(self) -> str:
        return f"{self.quantity}: error {self.error:.3g} > tolerance {self.tolerance:.3g}"


@dataclass(frozen=True)
class Layout:
    """How the inputs are laid out in memory: contiguous, or strided views of bigger buffers."""

    contiguous: bool = True

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        if self.contiguous or t.dim() == 1:
            return t
        # the same values, reached through transposed or sliced views
        if t.dim() == 2:
            spread = torch.empty(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=t.device)
            spread[:, ::2] = t
            return spread[:, ::2]
        return t.permute(1, 0, 2).contiguous().permute(1, 0, 2)


@dataclass
class _Drawn:
    """One seeded draw, kept as drawn (every check gets clones), and its float64 oracle."""

    key: tuple
    data: Inputs
    forward: tuple[torch.Tensor, torch.Tensor]  # forward64 and its error scale
    grads: dict[tuple, tuple[dict, dict]] = field(default_factory=dict)  # by dy's shape


# the last memoised draw: one, so a worker holds at most one head's tensors (B1's: about 1 GB)
_last_draw: list[_Drawn] = []


def _draw(key: tuple, memo: bool, make: Callable[[], Inputs]) -> _Drawn:
    if memo and _last_draw and _last_draw[0].key == key:
        return _last_draw[0]
    data = make()
    drawn = _Drawn(key, data, (forward64(data.x, data.act, data.weight, data.bias),
                               abs_forward64(data.x, data.act, data.weight, data.bias)))
    _last_draw[:] = [drawn] if memo else []
    return drawn


def check(
    fn: EstimatorFn,
    batch: int,
    inputs: int,
    paths: int,
    outputs: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    gates: Gates = "binary",
    bias: bool = True,
    grads: tuple[str, ...] = ("x", "act", "weight", "bias"),
    layout: Layout = Layout(),
    tf32: bool = False,
    positive: bool = False,
    given: Inputs | None = None,
    dy: torch.Tensor | None = None,
    memo: bool = False,
) -> list[Mismatch]:
    """Every quantity of fn(x, act, weight, bias) that misses the float64 oracle.

    `grads` names the inputs that require a gradient (any subset of x, act, weight, bias);
    the others do not, so the backward computes only what is needed. An input that fn
    modifies, and an exception fn raises, are reported too.

    `given` inputs (x, act, weight, bias, already in `dtype` and on `device`, in any layout)
    replace the seeded draw of that shape, and `dy` [B, O] the seeded upstream gradient.
    `memo`: reuse the previous memoised call's draw and oracle when this call draws the same
    inputs (the same shape, dtype, device, seed and options; never with `given`); fn gets
    clones, so whatever it does to its inputs cannot reach the next check.
    """
    memo = memo and given is None and dy is None
    key = (batch, inputs, paths, outputs, dtype, str(device), seed, gates, bias, positive)
    drawn = None if given is not None else _draw(key, memo, lambda: make_inputs(
        batch, inputs, paths, outputs, dtype=dtype, device=device, seed=seed, gates=gates,
        bias=bias, positive=positive))
    data = given if drawn is None else drawn.data
    tensors = {name: layout.apply(t.clone() if memo else t)
               for name, t in data._asdict().items() if t is not None}
    before = {name: t.clone() for name, t in tensors.items()}
    for name, t in tensors.items():
        t.requires_grad_(name in grads)

    tol = tolerance(dtype, tf32)
    failures: list[Mismatch] = []

    def compare(quantity: str, actual: torch.Tensor | None, expected, scale) -> None:
        verdict = judge(actual, expected, scale, dtype, tf32)
        if not verdict.ok:
            name = f"{quantity} ({verdict.reason})" if verdict.reason else quantity
            failures.append(Mismatch(name, verdict.error, verdict.tolerance))

    x, act, weight = tensors["x"], tensors["act"], tensors["weight"]
    b = tensors.get("bias")
    # the oracle sees the values as they were before the call, whatever fn does to them
    x0, act0, weight0, b0 = before["x"], before["act"], before["weight"], before.get("bias")
    try:
        y = fn(x, act, weight, b)
    except Exception as error:
        return [Mismatch(f"forward raised {type(error).__name__}: {error}", float("inf"), tol)]
    # a memoised draw's oracle was computed from the same values as x0, act0, weight0, b0
    expected_y = drawn.forward if drawn is not None else (
        forward64(x0, act0, weight0, b0), abs_forward64(x0, act0, weight0, b0))
    compare("y", y, *expected_y)

    wanted = [name for name in ("x", "act", "weight", "bias") if name in grads and name in tensors]
    if wanted and y.requires_grad:
        if dy is None:
            gen = torch.Generator().manual_seed(seed + 1)
            dy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.device, dtype)
        try:
            got = torch.autograd.grad(y, [tensors[n] for n in wanted], dy, allow_unused=True)
        except Exception as error:
            raised = f"backward raised {type(error).__name__}: {error}"
            return [*failures, Mismatch(raised, float("inf"), tol)]
        kept = drawn.grads if memo else {}  # memo: a draw was kept, so drawn is not None
        if tuple(y.shape) not in kept:
            kept[tuple(y.shape)] = (grads64(dy, x0, act0, weight0)._asdict(),
                                    abs_grads64(dy, x0, act0, weight0)._asdict())
        expected, scale = kept[tuple(y.shape)]
        for name, g in zip(wanted, got, strict=True):
            compare(f"d{name}", g, expected[name], scale[name])
    elif wanted:
        failures.append(Mismatch("y does not require grad", float("inf"), tol))

    for name, t in tensors.items():
        if not torch.equal(t.detach(), before[name]):
            failures.append(Mismatch(f"input {name} was modified", float("inf"), 0.0))
    return failures
