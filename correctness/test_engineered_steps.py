"""The engineered protocol's native steps (csrc/cpu/engineered_steps.cpp; issue 41): GLAI's
`FusedSparseStep` and the MLP's `HandFusedMLPStep` with `native=True` run the forward and the
update as one extension call each, and must compute the Python path's (`native=False`) values,
optimizer state and loss bit for bit: the same kernels on the same tensors in the same order."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fused_step_setup import BATCH, STEPS, batches, sparse_head, state_of
from glai_models import random_mlp

from glai_kernels import fused
from glai_kernels.glai.fused_step import FusedSparseStep
from glai_kernels.glai.mlp_step import HandFusedMLPStep

pytestmark = pytest.mark.skipif(fused.unavailable() is not None,
                                reason=f"extension: {fused.unavailable()}")

DTYPES = [torch.float32, torch.float64]


def _count(stepper, name: str) -> list[int]:
    """Wrap stepper.<name> to count the calls that returned something true (or None)."""
    calls, real = [0], getattr(stepper, name)

    def spy(*args):
        out = real(*args)
        calls[0] += out is None or bool(out)
        return out
    setattr(stepper, name, spy)
    return calls


def _glai_run(head, make_optimizer, native: bool, views: int = 1, lr_scale: float = 1.0):
    """STEPS fused steps of `head` (cross entropy; `views` model calls per loss); returns
    (losses, state after, (native forwards, native updates) run)."""
    optimizer = make_optimizer([p for p in head.parameters() if p.requires_grad])
    for group in optimizer.param_groups:
        group["lr"] *= lr_scale
    stepper = FusedSparseStep(head, optimizer, native=native)
    forwards, updates = _count(stepper, "_native_forward"), _count(stepper, "_native_update")
    losses = []
    torch.manual_seed(11)  # dropout's random numbers, where the head has dropout
    for x, target in batches(head.sparse_weight.values.dtype):
        losses.append(stepper.step(lambda model, x=x, t=target: sum(
            F.cross_entropy(model(x), t) for _ in range(views))))
    return losses, state_of(head, optimizer), (forwards[0], updates[0])


ADAMS = {"adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, fused=True),
         "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True)}


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


@pytest.mark.parametrize("adam", list(ADAMS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_fused_step_is_the_python_fused_step_bit_for_bit(dtype, adam):
    head = sparse_head(dtype, backend="cpp")
    twin = copy.deepcopy(head)
    losses, state, updates = _glai_run(head, ADAMS[adam], native=True)
    assert updates == (STEPS, STEPS)  # the native forward and update ran every step
    python_losses, python_state, python_updates = _glai_run(twin, ADAMS[adam], native=False)
    assert python_updates == (0, 0)
    assert _equal(losses, python_losses)
    assert _equal(state, python_state)
    assert head.backend_used == twin.backend_used == "sparse:cpp"


def test_the_comparison_sees_a_wrong_native_step():
    """The known-wrong variant: a learning rate one part in 10^6 off changes the bits."""
    head = sparse_head(torch.float32, backend="cpp")
    twin = copy.deepcopy(head)
    _, state, _ = _glai_run(head, ADAMS["adam"], native=True, lr_scale=1 + 1e-6)
    _, python_state, _ = _glai_run(twin, ADAMS["adam"], native=False)
    assert not _equal(state, python_state)


@pytest.mark.parametrize("case", ["two calls", "dropout", "separate bias group"])
def test_native_fused_step_falls_back_where_it_does_not_apply(case):
    """Two model calls per loss (native forwards, the update from Python), selector dropout
    (the Python forward, the native update), the bias in its own group (the native forward,
    the update from Python): still the Python path's bits."""
    head = sparse_head(torch.float64, dropout=0.3 if case == "dropout" else 0.0, backend="cpp")
    twin = copy.deepcopy(head)
    make = ADAMS["adam"]
    if case == "separate bias group":
        def make(params):
            values, bias = params
            return torch.optim.Adam([{"params": [values]}, {"params": [bias], "lr": 3e-2}],
                                    lr=1e-2, fused=True)
    views = 2 if case == "two calls" else 1
    losses, state, updates = _glai_run(head, make, native=True, views=views)
    python_losses, python_state, _ = _glai_run(twin, make, native=False, views=views)
    assert updates == {"two calls": (2 * STEPS, 0), "dropout": (0, STEPS),
                       "separate bias group": (STEPS, 0)}[case]
    assert _equal(losses, python_losses)
    assert _equal(state, python_state)


def _mlp_run(model, native: bool, views: int = 1, x_dtype=None):
    """STEPS hand-fused SGD steps (fused, weight decay) of `model` on a seeded [BATCH, n0]
    squared error; returns (losses, parameters after, native updates run)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-2, fused=True)
    stepper = HandFusedMLPStep(model, optimizer, native=native)
    updates = _count(stepper, "_native_update")
    first = next(m for m in model if isinstance(m, torch.nn.Linear))
    last = [m for m in model if isinstance(m, torch.nn.Linear)][-1]
    gen = torch.Generator().manual_seed(4)
    dtype = first.weight.dtype
    losses = []
    torch.manual_seed(11)
    for _ in range(STEPS):
        x = torch.randn(BATCH, first.in_features, generator=gen, dtype=dtype)
        target = torch.randn(BATCH, last.out_features, generator=gen, dtype=dtype)
        losses.append(stepper.step(lambda m, x=x, t=target: sum(
            (m(x) - t).square().mean() for _ in range(views))))
    return losses, [p.detach().clone() for p in model.parameters()], updates[0]


@pytest.mark.parametrize("widths", [(11, 14, 5), (13, 17, 9, 3), (7, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_mlp_step_is_the_python_hand_fused_step_bit_for_bit(widths, dtype):
    """Two and three Linears, and the linear baseline (one Linear)."""
    if len(widths) == 2:
        torch.manual_seed(2)
        model = torch.nn.Sequential(torch.nn.Linear(*widths, dtype=dtype))
    else:
        model = random_mlp(widths, seed=2, dtype=dtype)
    twin = copy.deepcopy(model)
    losses, params, updates = _mlp_run(model, native=True)
    assert updates == STEPS
    python_losses, python_params, python_updates = _mlp_run(twin, native=False)
    assert python_updates == 0
    assert _equal(losses, python_losses)
    assert _equal(params, python_params)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("case", ["two calls", "dropout", "dropout in eval mode"])
def test_native_mlp_step_falls_back_where_it_does_not_apply(case):
    model = random_mlp((11, 14, 5), seed=2, dropout=0.0 if case == "two calls" else 0.3)
    if case == "dropout in eval mode":
        model.eval()  # dropout does nothing: the native path applies
    twin = copy.deepcopy(model)
    views = 2 if case == "two calls" else 1
    losses, params, updates = _mlp_run(model, native=True, views=views)
    python_losses, python_params, _ = _mlp_run(twin, native=False, views=views)
    assert updates == (STEPS if case == "dropout in eval mode" else 0)
    assert _equal(losses, python_losses)
    assert _equal(params, python_params)


def test_native_mlp_step_ops_name_bad_arguments():
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(RuntimeError, match="weights and biases must be one per Linear"):
        torch.ops.glai_ext.mlp_step_forward(x, [w], [])
    with pytest.raises(RuntimeError, match=r"weights\[1\] must be \[n, 5\]"):
        torch.ops.glai_ext.mlp_step_forward(x, [w, torch.randn(2, 4)],
                                            [torch.zeros(5), torch.zeros(2)])
    with pytest.raises(RuntimeError, match="grads 2"):
        torch.ops.glai_ext.mlp_step_update(torch.randn(4, 5), x, [], [w], [torch.zeros(5)],
                                           [], 0.1, 0.0, 0.0)
