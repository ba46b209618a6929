"""`glai_ext::sparse_dvalues_adam`: dvalues and Adam/AdamW on the kept values inside the `cpp`
kernel, chunk by chunk of groups (glai_kernels/csrc/cpu/cpu_sparse_binding.cpp), against the `cpp`
backward's dvalues followed by torch's own fused update; `glai_ext::bias_adam` (dbias and its
update in one call) against torch's sum and fused update; and FusedSparseStep on them against
the ordinary autograd + torch.optim step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fused_step_setup import OPTIMIZERS, batches, sparse_head, state_of
from sparse_checker import sparse_problem

from glai_kernels.glai.fused_step import FusedSparseStep

STEPS = 3
HYPER = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.1, "eps": 1e-8}
# after STEPS updates: a few units in the last place per operation, amplified by 1/sqrt(v)
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.float64: {"rtol": 1e-12, "atol": 1e-13}}
pytestmark = pytest.mark.usefixtures("built")  # the extension (correctness/conftest.py)


def _kernel_steps(problem, decoupled, steps=STEPS):
    x, act, values, index, dy = problem
    w, m, v = values.clone(), torch.zeros_like(values), torch.zeros_like(values)
    for t in range(1, steps + 1):
        torch.ops.glai_ext.sparse_dvalues_adam(dy, x, act, w, index, m, v, *HYPER.values(),
                                               float(t), decoupled)
    return w, m, v


def _torch_steps(problem, decoupled, steps=STEPS):
    """The `cpp` backward's dvalues (checked against the float64 oracle by
    correctness/test_sparse.py), then torch's fused update."""
    x, act, values, index, dy = problem
    w, m, v = values.clone(), torch.zeros_like(values), torch.zeros_like(values)
    step = torch.zeros((), dtype=torch.float32)
    update = torch._fused_adamw_ if decoupled else torch._fused_adam_
    for _ in range(steps):
        dv = torch.ops.glai_ext.sparse_backward(dy, x, act, w, index, x.new_empty(0),
                                                [False, False, True])[2]
        step += 1
        update([w], [dv], [m], [v], [], [step], amsgrad=False, lr=HYPER["lr"],
               beta1=HYPER["beta1"], beta2=HYPER["beta2"], weight_decay=HYPER["weight_decay"],
               eps=HYPER["eps"], maximize=False, grad_scale=None, found_inf=None)
    return w, m, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize(("batch", "inputs"), [(5, 300), (16, 300), (50, 600), (100, 300)],
                         ids=["partial-vector", "1-vector", "4-vectors-blocked", "general"])
def test_the_update_in_the_kernel_is_torchs_update(batch, inputs, decoupled, dtype):
    """Groups of ~100 entries over several 4,096-entry chunks; at 50 rows the blocked dvalues,
    at 100 the general form."""
    problem = sparse_problem(batch, inputs, 9, 7, 0.5, dtype=dtype, seed=batch)
    assert problem[2].numel() > 2 * 4096
    for got, want in zip(_kernel_steps(problem, decoupled), _torch_steps(problem, decoupled),
                         strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])


def test_a_group_larger_than_a_chunk_and_an_empty_batch():
    problem = sparse_problem(16, 6000, 2, 1, 0.9, seed=4)  # two groups of ~5,400 entries
    assert problem[2].numel() > 2 * 4096 and len(problem[3][2]) == 2
    for got, want in zip(_kernel_steps(problem, False), _torch_steps(problem, False),
                         strict=True):
        torch.testing.assert_close(got, want, **TOL[torch.float32])
    x, act, values, index, dy = problem
    empty = (x[:0], act[:0], values, index, dy[:0])  # every gradient an empty sum: g = 0
    for got, want in zip(_kernel_steps(empty, True, 2), _torch_steps(empty, True, 2),
                         strict=True):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_the_thread_count_does_not_change_the_bits(parallel_always):
    problem = sparse_problem(50, 600, 9, 7, 0.5, seed=2)
    torch.set_num_threads(1)
    one = _kernel_steps(problem, False)
    torch.set_num_threads(2)
    for a, b in zip(one, _kernel_steps(problem, False), strict=True):
        assert torch.equal(a, b)


def test_inputs_other_than_the_updated_state_are_unmodified():
    x, act, values, index, dy = sparse_problem(16, 300, 9, 7, 0.5, seed=3)
    before = [t.clone() for t in (x, act, dy, *index)]
    _kernel_steps((x, act, values, index, dy), False, 1)
    for a, b in zip(before, (x, act, dy, *index), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("change", "match"), [
    (lambda a: a.update(values=a["values"].repeat(2)[::2]), "values must be a contiguous"),
    (lambda a: a.update(values=a["values"].half(), x=a["x"].half(), act=a["act"].half(),
                        dy=a["dy"].half(), m=a["m"].half(), v=a["v"].half()),
     "values must be a contiguous float32 or float64"),
    (lambda a: a.update(m=a["m"][1:]), "exp_avg must be a contiguous"),
    (lambda a: a.update(v=a["v"].double()), "exp_avg_sq must be a contiguous"),
    (lambda a: a.update(step=0.0), "step must be >= 1"),
    (lambda a: a.update(lr=-1.0), "need lr, eps, weight_decay >= 0"),
    (lambda a: a.update(beta2=1.0), "betas in"),
    (lambda a: a.update(dy=a["dy"][:, 1:]), "dy must be"),
])
def test_bad_arguments_raise_naming_them_and_change_nothing(change, match):
    x, act, values, index, dy = sparse_problem(16, 30, 9, 7, 0.5, seed=5)
    args = {"x": x, "act": act, "values": values, "dy": dy, "m": torch.zeros_like(values),
            "v": torch.zeros_like(values), "step": 1.0, "lr": 1e-2, "beta2": 0.999}
    change(args)
    kept = args["values"].clone()
    with pytest.raises(RuntimeError, match=match):
        torch.ops.glai_ext.sparse_dvalues_adam(
            args["dy"], args["x"], args["act"], args["values"], index, args["m"], args["v"],
            args["lr"], 0.9, args["beta2"], 0.1, 1e-8, args["step"], False)
    assert torch.equal(args["values"], kept)


def test_a_corrupt_index_raises():
    x, act, values, index, dy = sparse_problem(16, 30, 9, 7, 0.5, seed=6)
    index = [t.clone() for t in index]
    index[0][3] = 10_000  # an input out of range
    with pytest.raises(RuntimeError, match="index is corrupt"):
        torch.ops.glai_ext.sparse_dvalues_adam(dy, x, act, values.clone(), index,
                                               torch.zeros_like(values),
                                               torch.zeros_like(values), 1e-2, 0.9, 0.999, 0.1,
                                               1e-8, 1.0, False)


def test_opcheck():
    x, act, values, index, dy = sparse_problem(13, 30, 9, 7, 0.5, seed=7)
    torch.library.opcheck(torch.ops.glai_ext.sparse_dvalues_adam.default,
                          (dy, x, act, values.clone(), index, torch.zeros_like(values),
                           torch.zeros_like(values), 1e-2, 0.9, 0.999, 0.1, 1e-8, 1.0, False))


def _bias_steps(dy, bias, decoupled, kernel, steps=STEPS):
    w, m, v = bias.clone(), torch.zeros_like(bias), torch.zeros_like(bias)
    step = torch.zeros((), dtype=torch.float32)
    update = torch._fused_adamw_ if decoupled else torch._fused_adam_
    for t in range(1, steps + 1):
        if kernel:
            torch.ops.glai_ext.bias_adam(dy, w, m, v, *HYPER.values(), float(t), decoupled)
        else:
            step += 1
            update([w], [dy.sum(0)], [m], [v], [], [step], amsgrad=False, lr=HYPER["lr"],
                   beta1=HYPER["beta1"], beta2=HYPER["beta2"],
                   weight_decay=HYPER["weight_decay"], eps=HYPER["eps"], maximize=False,
                   grad_scale=None, found_inf=None)
    return w, m, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize(("batch", "outputs"), [(1, 1), (16, 37), (33, 130)])
def test_the_bias_update_in_one_call_is_torchs_update(batch, outputs, decoupled, dtype):
    """dbias = dy summed over the batch, then torch's formula: against torch's sum and fused
    update, after three steps; a strided dy is read as it is, and left unmodified."""
    gen = torch.Generator().manual_seed(batch)
    dy = torch.randn(outputs, batch, generator=gen, dtype=dtype).t()  # strided
    bias = torch.randn(outputs, generator=gen, dtype=dtype)
    kept = dy.clone()
    for got, want in zip(_bias_steps(dy, bias, decoupled, True),
                         _bias_steps(dy, bias, decoupled, False), strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])
    assert torch.equal(dy, kept)
    assert not torch.equal(_bias_steps(dy, bias, decoupled, True)[0], bias)  # it moved


@pytest.mark.parametrize(("change", "match"), [
    (lambda a: a.update(bias=a["bias"].repeat(2)[::2]), "bias must be a contiguous"),
    (lambda a: a.update(bias=a["bias"].half(), dy=a["dy"].half(), m=a["m"].half(),
                        v=a["v"].half()), "bias must be a contiguous 1-D float32 or float64"),
    (lambda a: a.update(dy=a["dy"][:, 1:]), "dy must be a \\[B, 7\\]"),
    (lambda a: a.update(dy=a["dy"].double()), "dy must be"),
    (lambda a: a.update(m=a["m"][1:]), "exp_avg must be a contiguous CPU tensor of bias's"),
    (lambda a: a.update(v=a["v"].double()), "exp_avg_sq must be"),
    (lambda a: a.update(step=0.0), "step must be >= 1"),
    (lambda a: a.update(lr=-1.0), "need lr, eps, weight_decay >= 0"),
])
def test_bias_adam_rejects_bad_arguments_naming_them_and_changes_nothing(change, match):
    args = {"dy": torch.randn(4, 7), "bias": torch.randn(7), "m": torch.zeros(7),
            "v": torch.zeros(7), "step": 1.0, "lr": 1e-2}
    change(args)
    kept = args["bias"].clone()
    with pytest.raises(RuntimeError, match=match):
        torch.ops.glai_ext.bias_adam(args["dy"], args["bias"], args["m"], args["v"], args["lr"],
                                     0.9, 0.999, 0.1, 1e-8, args["step"], False)
    assert torch.equal(args["bias"], kept)


def test_bias_adam_opcheck():
    torch.library.opcheck(torch.ops.glai_ext.bias_adam.default,
                          (torch.randn(5, 7), torch.randn(7), torch.zeros(7), torch.zeros(7),
                           1e-2, 0.9, 0.999, 0.1, 1e-8, 1.0, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_fused_step_with_the_kernel_update_is_the_ordinary_step(dtype, kind, dropout,
                                                                    monkeypatch):
    ordinary = sparse_head(dtype, dropout, "cpp")
    fused = copy.deepcopy(ordinary)
    opt_o = OPTIMIZERS[kind](ordinary.parameters())
    opt_f = OPTIMIZERS[kind](fused.parameters())
    # the Python path, whose kernel calls are counted below (the native path's two calls run
    # the same kernels to the same bits: test_engineered_steps.py)
    stepper = FusedSparseStep(fused, opt_f, native=False)
    used, bias_used = [], []
    inner, bias_inner = FusedSparseStep._adam_in_kernel, FusedSparseStep._bias_adam_in_kernel
    monkeypatch.setattr(FusedSparseStep, "_adam_in_kernel",
                        lambda self, *a: (used.append(1), inner(self, *a))[1])
    monkeypatch.setattr(FusedSparseStep, "_bias_adam_in_kernel",
                        lambda self, *a: (bias_used.append(1), bias_inner(self, *a))[1])
    for step, (x, t) in enumerate(batches(dtype)):
        torch.manual_seed(100 + step)
        opt_o.zero_grad(set_to_none=True)
        expected = F.cross_entropy(ordinary(x), t)
        expected.backward()
        opt_o.step()
        torch.manual_seed(100 + step)
        got = stepper.step(lambda model, x=x, t=t: F.cross_entropy(model(x), t))
        torch.testing.assert_close(got, expected.detach(), **TOL[dtype])
    assert len(used) == len(bias_used) == len(batches(dtype))
    for a, b in zip(state_of(fused, opt_f), state_of(ordinary, opt_o), strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "torch"])
def test_the_default_fused_step_on_cuda_is_the_ordinary_step(backend):
    """The step as the pipeline builds it (native=True, the default) on a GPU head: the update
    runs in the `cuda` kernel or torch's, never the CPU-only `glai_ext::sparse_step_update`
    (an H200 lease's pipeline failed on that call, stop 48)."""
    cuda = torch.device("cuda")
    ordinary = sparse_head(torch.float32, 0.0, backend).to(cuda)
    fused = copy.deepcopy(ordinary)
    opt_o, opt_f = OPTIMIZERS["adam"](ordinary.parameters()), OPTIMIZERS["adam"](fused.parameters())
    stepper = FusedSparseStep(fused, opt_f)
    for x, t in batches(torch.float32):
        x, t = x.to(cuda), t.to(cuda)
        opt_o.zero_grad(set_to_none=True)
        expected = F.cross_entropy(ordinary(x), t)
        expected.backward()
        opt_o.step()
        got = stepper.step(lambda model, x=x, t=t: F.cross_entropy(model(x), t))
        torch.testing.assert_close(got, expected.detach(), **TOL[torch.float32])
    for a, b in zip(state_of(fused, opt_f), state_of(ordinary, opt_o), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_the_bias_updates_with_its_own_param_groups_hyper_parameters():
    """Values and bias in two fused groups (the bias with another lr and no weight decay):
    each kernel update takes its own group's settings, as optimizer.step() does."""
    ordinary = sparse_head(torch.float32, 0.0, "cpp")
    fused = copy.deepcopy(ordinary)

    def adam(head):
        return torch.optim.Adam([{"params": [head.sparse_weight.values]},
                                 {"params": [head.bias], "lr": 3e-2, "weight_decay": 0.0}],
                                lr=1e-2, weight_decay=0.1, fused=True)
    opt_o, opt_f = adam(ordinary), adam(fused)
    stepper = FusedSparseStep(fused, opt_f)
    for x, t in batches(torch.float32):
        opt_o.zero_grad(set_to_none=True)
        F.cross_entropy(ordinary(x), t).backward()
        opt_o.step()
        stepper.step(lambda model, x=x, t=t: F.cross_entropy(model(x), t))
    for a, b in zip(state_of(fused, opt_f), state_of(ordinary, opt_o), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_the_cuda_steps_have_fakes():
    """The CUDA fused step's ops (step a device tensor) trace under fake tensors, as the CPU
    ones do, so torch.compile can hold them: their kernels need a GPU, their schemas do not
    (ops that only mutate and return nothing need no fake of their own)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, act, values, index, dy = sparse_problem(13, 30, 9, 7, 0.5, seed=8)
    bias = torch.zeros(dy.shape[1])
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in (dy, x, act, values, bias)]
        fdy, fx, fact, fvalues, fbias = fake
        findex = [mode.from_tensor(t) for t in index]
        step = mode.from_tensor(torch.ones(()))
        torch.ops.glai_ext.sparse_dvalues_adam_t(
            fdy, fx, fact, fvalues, findex, torch.zeros_like(fvalues), torch.zeros_like(fvalues),
            step, 1e-2, 0.9, 0.999, 0.1, 1e-8, False)
        torch.ops.glai_ext.bias_adam_t(fdy, fbias, torch.zeros_like(fbias),
                                       torch.zeros_like(fbias), step, 1e-2, 0.9, 0.999, 0.0,
                                       1e-8, True)
