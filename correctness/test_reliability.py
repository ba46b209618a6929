"""The op as a hostile user meets it (issue 16): autocast, half-precision overflow,
torch.compile of the default path, double backward, meta tensors, and argument errors.

Each test runs every CPU backend (the `backend_device` fixture; a CUDA case runs unchanged on
a GPU machine). The exact-value tests use float16 inputs chosen so that every result and
gradient is exactly representable while a float16 intermediate would overflow: the answer
must then be exact, not merely close.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from glai_models import random_mlp
from torch import nn

import glai_kernels
from glai_kernels import registry
from glai_kernels.glai import from_mlp, prune
from glai_kernels.op import estimator_backward_op, estimator_op
from reference import forward64, grads64, listing1_backward, listing1_forward


def _cpu(backend_device: tuple[str, str]) -> str:
    name, device = backend_device
    if device != "cpu":
        pytest.skip("a CPU test")
    return name


# ---- 1. autocast ---------------------------------------------------------------------------


def _amp_model(device: str) -> nn.Sequential:
    """nn.Linear -> GLAIHead: under autocast the head gets x in the autocast dtype while its
    own parameters are float32 (the dtype mix an AMP user meets)."""
    torch.manual_seed(0)
    head = from_mlp(random_mlp((6, 16, 3), seed=3, dtype=torch.float32))
    return nn.Sequential(nn.Linear(5, 6), head).to(device)


def _step(model: nn.Sequential, backend: str, x, target, autocast_dtype=None, scaler=None):
    """One SGD step; returns the updated parameters (float32) and the loss."""
    model = copy.deepcopy(model)
    model[1].backend = backend
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    device = x.device.type
    with torch.autocast(device, dtype=autocast_dtype or torch.float32,
                        enabled=autocast_dtype is not None):
        y = model(x)
        loss = F.mse_loss(y.float(), target)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return [p.detach().clone() for p in model.parameters()], y


def _check_amp_step(backend: str, device: str, dtype: torch.dtype, scaler=None) -> None:
    model = _amp_model(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 5, generator=gen).to(device)
    target = torch.randn(32, 3, generator=gen).to(device)
    ref, _ = _step(model, backend, x, target)
    got, y = _step(model, backend, x, target, dtype, scaler)
    assert y.dtype == dtype  # the head ran in the autocast dtype
    for before, want, have in zip(model.parameters(), ref, got, strict=True):
        assert have.dtype == torch.float32 and torch.isfinite(have).all()
        change, error = (want - before.detach()).norm(), (have - want).norm()
        # the step is the float32 step to the half type's precision (bf16: 2**-8 per rounding)
        assert error <= 0.05 * change + 1e-6, f"{error:.3g} against a step of {change:.3g}"


def test_amp_training_step_bfloat16_cpu(backend_device):
    _check_amp_step(_cpu(backend_device), "cpu", torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_amp_training_step_float16_cuda_gradscaler(backend_device):
    name, device = backend_device
    if device != "cuda":
        pytest.skip("a CUDA test")
    _check_amp_step(name, "cuda", torch.float16, torch.amp.GradScaler("cuda"))


def test_autocast_runs_in_the_region_dtype_without_inner_autocast(backend_device):
    """y is the autocast dtype and equals the op on pre-cast inputs outside autocast: the
    backend's own matmuls are not autocast again (their result would then differ or fail)."""
    name = _cpu(backend_device)
    gen = torch.Generator().manual_seed(2)
    x, act = torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)
    weight = torch.randn(2, 6, 3, generator=gen, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = glai_kernels.estimator(x, act, weight, backend=name)
        # the op called directly is autocast-aware too
        y_op, _ = estimator_op(x, act, weight, None, name, False)
    expected = glai_kernels.estimator(x.bfloat16(), act.bfloat16(), weight.bfloat16(),
                                      backend=name)
    assert y.dtype == y_op.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    torch.testing.assert_close(y_op, expected, rtol=0, atol=0)
    y.float().sum().backward()  # outside the region: float32 weight gets a float32 gradient
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    first = weight.grad.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = glai_kernels.estimator(x, act, weight, backend=name)
        again.float().sum().backward()  # inside the region: the same gradient
    torch.testing.assert_close(weight.grad, 2 * first, rtol=0, atol=0)


# ---- 2. no half-precision intermediate ---------------------------------------------------


def _exact_answers(x, act, weight, dy) -> dict[str, torch.Tensor]:
    """The float64 oracle's y and gradients, each checked to be exactly a float16 value."""
    grads = grads64(dy, x, act, weight)
    answers = {"y": forward64(x, act, weight), "x": grads.x, "act": grads.act,
               "weight": grads.weight}
    for key, value in answers.items():
        assert torch.equal(value.half().double(), value), f"{key} is not a float16 value"
        assert value.abs().max() < 65504
    return answers


def _partial_sums_case():
    """Z[s] = sum_i x[i] w[i, s] = 80000 > 65504 (float16's largest); y = 10000 exactly."""
    h = torch.float16
    x = torch.tensor([[200.0, 200.0]], dtype=h)
    act = torch.tensor([[1.125, -1.0]], dtype=h)
    weight = torch.full((1, 2, 2), 200.0, dtype=h)
    dy = torch.tensor([[0.125]], dtype=h)
    return x, act, weight, dy, _exact_answers(x, act, weight, dy)


def _soft_gate_case():
    """x * act = 320 * 320 = 102400 > 65504; y = 400 exactly."""
    h = torch.float16
    x, act = torch.tensor([[320.0]], dtype=h), torch.tensor([[320.0]], dtype=h)
    weight = torch.tensor([[[2.0 ** -8]]], dtype=h)
    dy = torch.tensor([[2.0 ** -4]], dtype=h)
    return x, act, weight, dy, _exact_answers(x, act, weight, dy)


CASES = {"partial-sums": _partial_sums_case, "soft-gates": _soft_gate_case}


def _exact(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == torch.float16
    assert torch.equal(got.double().cpu(), expected), \
        f"got {got.tolist()}, exact {expected.tolist()}"


@pytest.mark.parametrize("case", CASES)
def test_half_intermediates_do_not_overflow(backend_device, case):
    name, device = backend_device
    x, act, weight, dy, expected = (t.to(device) if isinstance(t, torch.Tensor) else t
                                    for t in CASES[case]())
    x, act, weight = (t.clone().requires_grad_() for t in (x, act, weight))
    y = glai_kernels.estimator(x, act, weight, backend=name)  # act needs a gradient: Z is kept
    y.backward(dy)
    _exact(y, expected["y"])
    for key, t in (("x", x), ("act", act), ("weight", weight)):
        _exact(t.grad, expected[key])


@pytest.mark.parametrize("case", CASES)
def test_listing1_oracle_does_not_overflow(case):
    """The oracle itself (glai_kernels/backends/einsum.py, re-exported by reference/)."""
    x, act, weight, dy, expected = CASES[case]()
    _exact(listing1_forward(x, act, weight), expected["y"])
    for key, g in zip(("x", "act", "weight"), listing1_backward(dy, x, act, weight),
                      strict=True):
        _exact(g, expected[key])


def test_kept_z_is_float32_for_half_inputs(backend_device):
    name = _cpu(backend_device)
    backend = registry.get(name)
    if backend.forward_saving is None:
        pytest.skip(f"{name} keeps nothing")
    x, act, weight, _, _ = _partial_sums_case()
    _, saved = backend.forward_saving(x, act, weight)
    assert saved.dtype == torch.float32 and torch.isfinite(saved).all()
    # the fake (torch.compile, meta) says the same
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = estimator_op(torch.empty(1, 2, dtype=torch.float16),
                            torch.empty(1, 2, dtype=torch.float16),
                            torch.empty(1, 2, 2, dtype=torch.float16), None, name, True)[1]
    assert fake.dtype == torch.float32 and tuple(fake.shape) == tuple(saved.shape)


# ---- 3. torch.compile(fullgraph=True) of the default path ----------------------------------


@pytest.mark.parametrize("how", ["None", "auto", "env"])
def test_compile_fullgraph_default_path(how, monkeypatch):
    torch._dynamo.reset()  # a graph traced earlier keeps the backend it resolved
    if how == "env":
        monkeypatch.setenv(registry.ENV_VAR, "torch")
    else:
        monkeypatch.delenv(registry.ENV_VAR, raising=False)
    backend = {"None": None, "auto": "auto", "env": None}[how]
    gen = torch.Generator().manual_seed(4)
    x, act = torch.randn(5, 4, generator=gen), torch.randn(5, 3, generator=gen)
    weight = torch.randn(2, 4, 3, generator=gen, requires_grad=True)

    def f(x, act, weight):
        return glai_kernels.estimator(x, act, weight, backend=backend)

    y = torch.compile(f, fullgraph=True)(x, act, weight)
    torch.testing.assert_close(y, f(x, act, weight))
    y.sum().backward()
    assert weight.grad is not None


def test_compile_fullgraph_modules():
    torch._dynamo.reset()
    torch.manual_seed(5)
    module = glai_kernels.GLAIEstimator(4, 3, 2)
    x, act = torch.randn(5, 4), torch.randn(5, 3)
    torch.testing.assert_close(torch.compile(module, fullgraph=True)(x, act), module(x, act))
    head = from_mlp(random_mlp((4, 8, 2), seed=6, dtype=torch.float32))
    torch.testing.assert_close(torch.compile(head, fullgraph=True)(x), head(x))


# ---- 6. double backward -------------------------------------------------------------------


def test_gradgradcheck_float64(backend_device):
    name = _cpu(backend_device)
    gen = torch.Generator().manual_seed(7)
    # tiny: triton runs in the interpreter here, and gradgradcheck calls the op many times
    x = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    act = torch.randn(2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, generator=gen, dtype=torch.float64, requires_grad=True)

    def f(x, act, weight, bias):
        return glai_kernels.estimator(x, act, weight, bias, backend=name)

    # the interpreter pays ~10 ms per program: triton takes gradgradcheck's fast mode (a
    # random projection of the Jacobian, not every column)
    fast = name == "triton"
    assert torch.autograd.gradgradcheck(f, (x, act, weight, bias), fast_mode=fast)
    # and through the backward op alone, with some gradients not asked for
    dy = torch.randn(2, 2, generator=gen, dtype=torch.float64, requires_grad=True)

    def g(dy, x, weight):
        return estimator_backward_op(dy, x, act.detach(), weight, x.new_empty(0),
                                     [True, False, True], name)[::2]

    assert torch.autograd.gradcheck(g, (dy, x, weight), fast_mode=fast)


# ---- 7. meta tensors, and errors that name their argument --------------------------------


@pytest.mark.parametrize("backend", [None, "auto", "cpp", "torch"])
def test_meta_modules(backend):
    module = glai_kernels.GLAIEstimator(4, 3, 2, device="meta", backend=backend)
    x = torch.empty(5, 4, device="meta")
    act = torch.empty(5, 3, device="meta", requires_grad=True)
    y = module(x, act)
    assert y.device.type == "meta" and tuple(y.shape) == (5, 2)
    y.sum().backward()
    assert act.grad.shape == act.shape and module.weight.grad.device.type == "meta"
    head = from_mlp(random_mlp((4, 8, 2), seed=8, dtype=torch.float32)).to("meta")
    assert head(torch.empty(3, 4, device="meta")).shape == (3, 2)


def test_bad_environment_variable_is_named(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "garbage")
    x, act, weight = torch.randn(2, 3), torch.randn(2, 2), torch.randn(1, 3, 2)
    with pytest.raises(ValueError, match=r"\$GLAI_BACKEND='garbage'"):
        glai_kernels.estimator(x, act, weight)


def test_estimator_module_rejects_an_unknown_backend_at_construction():
    with pytest.raises(ValueError, match=r"GLAIEstimator: backend='nope'"):
        glai_kernels.GLAIEstimator(3, 2, 1, backend="nope")


@pytest.fixture(scope="module")
def small_head():
    return from_mlp(random_mlp((4, 6, 2), seed=9, dtype=torch.float32))


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"mu": float("inf")}, "mu"), ({"mu": float("nan")}, "mu"), ({"mu": 1e-9}, "mu"),
    ({"mu": True}, "mu"), ({"keep": True}, "keep"), ({"keep": 2.5}, "keep"),
])
def test_prune_errors_name_the_argument(small_head, kwargs, named):
    reference = torch.randn(16, 4, generator=torch.Generator().manual_seed(10))
    with pytest.raises(ValueError, match=rf"^prune: {named}\b"):
        prune(small_head, reference, **kwargs)


def test_prune_rejects_a_nan_reference_row(small_head):
    reference = torch.randn(16, 4, generator=torch.Generator().manual_seed(11))
    reference[5, 2] = float("nan")
    with pytest.raises(ValueError, match=r"prune: reference .* rows \[5\]"):
        prune(small_head, reference, keep=4)
