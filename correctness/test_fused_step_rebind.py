"""A sparse head loaded with another K under a running optimizer (issue 40, item 3): the
optimizer built before the load keeps stepping the head's values Parameter (its data resized),
FusedSparseStep follows the head and resets the moments whose size changed, and a head whose
Parameter was replaced is refused loudly, never trained silently without its values.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fused_step_setup import OPTIMIZERS, batches, sparse_head, state_of
from glai_models import random_mlp

from glai_kernels.glai import from_mlp, prune
from glai_kernels.glai.fused_step import FusedSparseStep
from glai_kernels.sparse import SparsePathWeight

DTYPE = torch.float64


def other_k_head(head):
    """A sparse head of the same shape as `head` with fewer kept values (another K)."""
    mlp = random_mlp((11, 14, 5), seed=4, dtype=DTYPE)
    omega = torch.randn(64, 11, dtype=DTYPE, generator=torch.Generator().manual_seed(2))
    other = prune(from_mlp(mlp), omega, keep=head.path_count() - 17, layout="sparse").head
    assert other.sparse_weight.nnz != head.sparse_weight.nnz
    assert other.sparse_weight.shape == head.sparse_weight.shape
    return other.train()


def loss_of(x, t):
    return lambda model: F.cross_entropy(model(x), t)


@pytest.mark.parametrize("kernel_adam", [True, False], ids=["kernel-adam", "torch-adam"])
@pytest.mark.parametrize("kind", ["adam", "adam_unfused"])
def test_the_step_trains_the_values_loaded_with_another_k(kind, kernel_adam):
    """After a load of another K the fused step trains the loaded values with fresh moments
    (step 0) and the bias with its running ones: what the ordinary loop does once the
    values' state is cleared, the rule the step's docstring states."""
    fused = sparse_head(DTYPE, backend="cpp")
    ordinary = copy.deepcopy(fused)
    other = other_k_head(fused)
    opt_f = OPTIMIZERS[kind](fused.parameters())
    opt_o = OPTIMIZERS[kind](ordinary.parameters())
    stepper = FusedSparseStep(fused, opt_f, kernel_adam=kernel_adam)
    values = fused.sparse_weight.values
    for step, (x, t) in enumerate(batches(DTYPE)):
        if step == 1:
            for head in (ordinary, fused):
                head.load_state_dict(other.state_dict())
            opt_o.state[ordinary.sparse_weight.values].clear()  # the stated rule, by hand
            loaded = fused.sparse_weight.values.detach().clone()
        opt_o.zero_grad(set_to_none=True)
        loss_of(x, t)(ordinary).backward()
        opt_o.step()
        stepper.step(loss_of(x, t))
    assert fused.sparse_weight.values is values  # the optimizer's own Parameter
    assert fused.sparse_weight.nnz == other.sparse_weight.nnz
    assert not torch.equal(fused.sparse_weight.values.detach(), loaded)  # the values trained
    assert opt_f.state[values]["step"].item() == 2  # reset at the load, then two steps
    exact = not kernel_adam or kind == "adam_unfused"  # the kernel's update: to rounding
    for a, b in zip(state_of(fused, opt_f), state_of(ordinary, opt_o), strict=True):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_a_same_k_load_keeps_the_moments():
    """A load of the same K copies into the same tensors: nothing is reset (as for a dense
    model loaded under its optimizer)."""
    head = sparse_head(DTYPE, backend="cpp")
    opt = OPTIMIZERS["adam"](head.parameters())
    stepper = FusedSparseStep(head, opt, kernel_adam=False)
    (x, t), *_ = batches(DTYPE)
    stepper.step(loss_of(x, t))
    moments = opt.state[head.sparse_weight.values]["exp_avg"].clone()
    head.load_state_dict(copy.deepcopy(head).state_dict())
    stepper.step(loss_of(x, t))
    state = opt.state[head.sparse_weight.values]
    assert state["step"].item() == 2
    assert not torch.equal(state["exp_avg"], torch.zeros_like(moments))


def test_a_plain_adam_built_before_the_load_keeps_its_parameter():
    """The usual resume (model and optimizer state dicts, optimizer built first) continues
    the saved run exactly; without the optimizer's state the old moments are refused loudly
    by torch.optim.Adam, never applied to other entries or silently orphaned."""
    saved = other_k_head(sparse_head(DTYPE))
    opt_saved = OPTIMIZERS["adam_unfused"](saved.parameters())
    data = batches(DTYPE)
    x, t = data[0]
    opt_saved.zero_grad(set_to_none=True)
    loss_of(x, t)(saved).backward()
    opt_saved.step()
    model_state = copy.deepcopy(saved.state_dict())
    optimizer_state = copy.deepcopy(opt_saved.state_dict())

    resumed = sparse_head(DTYPE)
    opt = OPTIMIZERS["adam_unfused"](resumed.parameters())
    opt.zero_grad(set_to_none=True)
    loss_of(x, t)(resumed).backward()
    opt.step()  # moments of the head's own K
    values = resumed.sparse_weight.values
    resumed.load_state_dict(model_state)
    assert resumed.sparse_weight.values is values and values.grad is None
    opt.load_state_dict(optimizer_state)
    for x, t in data[1:]:
        for model, optimizer in ((saved, opt_saved), (resumed, opt)):
            optimizer.zero_grad(set_to_none=True)
            loss_of(x, t)(model).backward()
            optimizer.step()
    for a, b in zip(state_of(resumed, opt), state_of(saved, opt_saved), strict=True):
        assert torch.equal(a, b)

    stale = sparse_head(DTYPE)
    opt_stale = OPTIMIZERS["adam_unfused"](stale.parameters())
    loss_of(x, t)(stale).backward()
    opt_stale.step()
    stale.load_state_dict(model_state)
    opt_stale.zero_grad(set_to_none=True)
    loss_of(x, t)(stale).backward()
    with pytest.raises(RuntimeError, match="size"):
        opt_stale.step()


def test_the_step_refuses_a_head_whose_values_parameter_was_replaced():
    """A new Parameter put in place of the values is one the optimizer does not step: the
    step says so instead of training the bias alone."""
    head = sparse_head(DTYPE, backend="cpp")
    opt = OPTIMIZERS["adam"](head.parameters())
    stepper = FusedSparseStep(head, opt)
    (x, t), *_ = batches(DTYPE)
    stepper.step(loss_of(x, t))
    sw = head.sparse_weight
    head.sparse_weight = SparsePathWeight(sw.values.detach(), sw.index)
    with pytest.raises(ValueError, match=r"head changed.*optimizer must step exactly"):
        stepper.step(loss_of(x, t))
