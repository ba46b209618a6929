"""The fused sparse training step (glai_kernels/glai/fused_step.py) with torch's update
(`kernel_adam=False`) is the ordinary autograd + torch.optim step, bit for bit: the same kept
values, bias, optimizer state and step count after several steps, for Adam and AdamW, with and
without the selector's dropout, for a cross-entropy loss, a two-view InfoNCE loss and a loss
over two calls; it shares the optimizer's state with `optimizer.step()`; and it refuses what it
does not implement. With the update inside the dvalues kernel (the default) it is the same
step to rounding (correctness/test_kernel_adam.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fused_step_setup import OPTIMIZERS, batches, sparse_head, state_of
from glai_models import random_mlp

from glai_kernels import registry
from glai_kernels.glai import from_mlp, info_nce, prune, two_views
from glai_kernels.glai.fused_step import FusedSparseStep, fused_step_for
from glai_kernels.sparse import SPARSE_ESTIMATOR


@pytest.fixture(autouse=True)
def _no_backend_request(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)


LOSSES = {
    "cross_entropy": lambda model, x, t: F.cross_entropy(model(x), t),
    "info_nce": lambda model, x, t: info_nce(*two_views(model, x), 0.07),
    "two_calls": lambda model, x, t: (model(x).square().mean()
                                      + F.cross_entropy(model(x.flip(0)), t)),
}
def backends():
    return [b.name for b in SPARSE_ESTIMATOR.backends()
            if b.unsupported_reason("cpu", torch.float32) is None]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_fused_step_is_the_ordinary_step_bit_for_bit(backend, loss, kind, dropout):
    dtype = torch.float32
    ordinary = sparse_head(dtype, dropout, backend)
    fused = copy.deepcopy(ordinary)
    opt_o = OPTIMIZERS[kind](ordinary.parameters())
    opt_f = OPTIMIZERS[kind](fused.parameters())
    stepper = FusedSparseStep(fused, opt_f, kernel_adam=False)
    for step, (x, t) in enumerate(batches(dtype)):
        torch.manual_seed(100 + step)  # the same dropout draws in both
        opt_o.zero_grad(set_to_none=True)
        expected = LOSSES[loss](ordinary, x, t)
        expected.backward()
        opt_o.step()
        torch.manual_seed(100 + step)
        got = stepper.step(lambda model, x=x, t=t: LOSSES[loss](model, x, t))
        assert torch.equal(got, expected.detach())
    for a, b in zip(state_of(fused, opt_f), state_of(ordinary, opt_o), strict=True):
        assert torch.equal(a, b)
    assert fused.backend_used == ordinary.backend_used == f"sparse:{backend}"
    assert fused.sparse_weight.values.grad is None and not got.requires_grad


def test_the_optimizer_state_is_shared_with_optimizer_step():
    dtype = torch.float64
    ordinary = sparse_head(dtype)
    mixed = copy.deepcopy(ordinary)
    opt_o = OPTIMIZERS["adamw"](ordinary.parameters())
    opt_m = OPTIMIZERS["adamw"](mixed.parameters())
    stepper = FusedSparseStep(mixed, opt_m, kernel_adam=False)
    for step, (x, t) in enumerate(batches(dtype)):
        opt_o.zero_grad(set_to_none=True)
        F.cross_entropy(ordinary(x), t).backward()
        opt_o.step()
        if step == 1:  # the middle step the ordinary way, on the stepper's state
            opt_m.zero_grad(set_to_none=True)
            F.cross_entropy(mixed(x), t).backward()
            opt_m.step()
            opt_m.zero_grad(set_to_none=True)
        else:
            stepper.step(lambda model, x=x, t=t: F.cross_entropy(model(x), t))
    for a, b in zip(state_of(mixed, opt_m), state_of(ordinary, opt_o), strict=True):
        assert torch.equal(a, b)


def test_the_step_follows_an_index_replaced_under_it():
    """The stepper reads the head through a plan it keeps between steps: a weight loaded with
    another index (the same K, other groups, so new index tensors) must be the one it trains."""
    dtype = torch.float64
    ordinary = sparse_head(dtype)
    mlp = random_mlp((11, 14, 5), seed=4, dtype=dtype)
    omega = torch.randn(64, 11, dtype=dtype, generator=torch.Generator().manual_seed(2))
    other = prune(from_mlp(mlp), omega, keep=ordinary.path_count(), layout="sparse").head
    assert [len(t) for t in other.sparse_weight.index] != \
        [len(t) for t in ordinary.sparse_weight.index]  # the load must replace tensors
    fused = copy.deepcopy(ordinary)
    opt_o = OPTIMIZERS["adam"](ordinary.parameters())
    opt_f = OPTIMIZERS["adam"](fused.parameters())
    stepper = FusedSparseStep(fused, opt_f, kernel_adam=False)
    for step, (x, t) in enumerate(batches(dtype)):
        if step == 1:
            for head in (ordinary, fused):
                head.load_state_dict(other.state_dict())
        opt_o.zero_grad(set_to_none=True)
        F.cross_entropy(ordinary(x), t).backward()
        opt_o.step()
        stepper.step(lambda model, x=x, t=t: F.cross_entropy(model(x), t))
    for a, b in zip(state_of(fused, opt_f), state_of(ordinary, opt_o), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(fused.sparse_weight.index.inputs, other.sparse_weight.index.inputs)


def test_inputs_are_not_modified_and_the_loss_decreases():
    head = sparse_head(torch.float32)
    stepper = FusedSparseStep(head, OPTIMIZERS["adam"](head.parameters()))
    x, t = batches(torch.float32)[0]
    x_before = x.clone()
    losses = [float(stepper.step(lambda model: F.cross_entropy(model(x), t)))
              for _ in range(20)]
    assert torch.equal(x, x_before)
    assert losses[-1] < 0.9 * losses[0]


def test_refusals_name_the_argument():
    head = sparse_head(torch.float32)
    dense = prune(from_mlp(random_mlp((11, 14, 5), seed=3, dtype=torch.float32)),
                  torch.randn(64, 11), mu=0.3, layout="dense").head
    with pytest.raises(ValueError, match="head must have the sparse layout"):
        FusedSparseStep(dense, OPTIMIZERS["adam"](dense.parameters()))
    with pytest.raises(ValueError, match=r"optimizer must be torch\.optim\.Adam or AdamW"):
        FusedSparseStep(head, torch.optim.SGD(head.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="exactly the head's trainable parameters"):
        FusedSparseStep(head, torch.optim.Adam([head.sparse_weight.values], lr=0.1))
    with pytest.raises(ValueError, match=r"options \['amsgrad'\]"):
        FusedSparseStep(head, torch.optim.Adam(head.parameters(), lr=0.1, amsgrad=True))
    assert fused_step_for(dense, OPTIMIZERS["adam"](dense.parameters())) is None
    assert isinstance(fused_step_for(head, OPTIMIZERS["adam"](head.parameters())),
                      FusedSparseStep)
    stepper = FusedSparseStep(head, OPTIMIZERS["adam"](head.parameters()))
    x, _ = batches(torch.float32)[0]
    with pytest.raises(ValueError, match="x must not require grad"):
        stepper.step(lambda model: model(x.clone().requires_grad_()).sum())
    with pytest.raises(ValueError, match="never called the model"):
        stepper.step(lambda model: torch.ones((), requires_grad=True).sum())
    before = head.sparse_weight.values.detach().clone()
    with pytest.raises(ValueError, match="does not depend on the model's output"):
        stepper.step(lambda model: model(x).detach().sum() + torch.ones((), requires_grad=True))
    assert torch.equal(head.sparse_weight.values.detach(), before)  # nothing was stepped


def test_fit_takes_the_fused_step_and_trains_the_same():
    from glai_kernels.glai import Classification, EarlyStopping, fit, make_optimizer

    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(80, 11, generator=gen), torch.randint(0, 5, (80,), generator=gen)
    task = Classification(x[:64], y[:64], x[64:], y[64:], batch_size=16)
    results, heads = {}, {}
    for fused in (True, False):
        head = heads[fused] = sparse_head(torch.float32, dropout=0.2)
        optimizer = make_optimizer("adam", head.parameters(), lr=1e-2, weight_decay=0.1)
        torch.manual_seed(9)
        results[fused] = fit(head, task, optimizer, max_epochs=4,
                             early=EarlyStopping(2, 0.1), seed=3, fused_step=fused)
    assert results[True].fused_step and not results[False].fused_step
    # the fused step updates the values inside the dvalues kernel: the same Adam to rounding
    assert results[True].scores == pytest.approx(results[False].scores, rel=1e-4)
    torch.testing.assert_close(heads[True].sparse_weight.values,
                               heads[False].sparse_weight.values, rtol=1e-4, atol=1e-6)
