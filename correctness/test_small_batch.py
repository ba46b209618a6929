"""The paper's batch size (issue 15 item 5): the paths added for it compute what the general
ones do.

- `estimator()` under no_grad runs the forward's body without the custom op (glai_kernels/
  calls.py, `direct_forward`): same result bits, same checks, and still refuses an aliasing output;
- with gradients, eager calls on plain tensors record a Function (`op._EagerEstimator`, a
  `calls.EagerFunction`) instead of the custom op's autograd, or the backend's own node
  (`Backend.eager`: cpp's C++ node, csrc/eager_autograd.cpp): the same output and gradient
  bits, double backward included, for every dtype, every subset of gradients, with and
  without bias;
- the cpp dx kernel's two small-batch forms, taken when B fits one vector: with AVX-512 and a
  weight within the CPU vendor's bound (4 MiB on Intel, 16 MiB on AMD; measured, csrc/cpu/
  kernels.h), dot products along s (tiles of 4 rows of b by 6 of i, the weight
  read o_chunk o's at a time, lanes summed by a shuffle tree); otherwise the tall tile (24
  rows of i at a time with AVX-512, 12 otherwise); on every instruction set, on shapes whose
  B, I and P are not multiples of the tiles and whose O spans several o chunks;
- the cpp forward's short last row block (at most 4 rows, B = 16's third) computed with a
  4-row tile: the same bits, y and Z, as the same rows inside a batch of full 6-row blocks;
- the torch backend's dx at B <= P (batched GEMMs on weight in place, no transposed copy).
"""

from __future__ import annotations

import pytest
import torch

import glai_kernels
from glai_kernels import registry
from glai_kernels.backends.torch import torch_backward
from glai_kernels.op import estimator_op

# (B, I, P, O): B within one float32 vector of AVX-512 (16) or AVX2 (8); I around the tall
# tile (24 and 12 rows) and the form along s (6 rows), with remainders; P with and without a
# partial vector; O past one chunk of the form along s (1 + 16 KiB / (24 P) o's: 21 at P = 33,
# 98 at P = 7)
SHAPES = [(16, 385, 128, 3), (16, 47, 33, 5), (8, 24, 16, 2), (5, 100, 7, 4), (12, 73, 64, 3),
          (1, 30, 5, 1), (3, 12, 17, 2), (13, 47, 33, 23), (7, 13, 7, 100)]


def _inputs(shape, dtype=torch.float32, seed=0):
    b, i, p, o = shape
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, i, generator=g, dtype=dtype),
            torch.rand(b, p, generator=g, dtype=dtype),
            torch.randn(o, i, p, generator=g, dtype=dtype),
            torch.randn(b, o, generator=g, dtype=dtype))


def _dx64(dy, act, weight):
    return torch.einsum("bo,ois,bs->bi", dy.double(), weight.double(), act.double())


def _assert_cpp_dx_is_the_reference(x, act, weight, dy):
    """The cpp kernel's dx alone (raw op) within its dtype's tolerance of the float64 one."""
    dtype = x.dtype
    dx = torch.ops.glai_ext.backward(dy, x, act, weight, torch.empty(0, dtype=dtype),
                                     True, False, False)[0]
    ref = _dx64(dy, act, weight)
    bound = (1e-5 if dtype == torch.float32 else 1e-12) * ref.abs().max()
    assert (dx.double() - ref).abs().max() <= bound


@pytest.mark.parametrize("backend", ["einsum", "torch", "cpp"])
def test_direct_forward_is_the_op(backend):
    """Under no_grad, estimator() gives the custom op's result, bit for bit, bias included."""
    if registry.get(backend).unsupported_reason("cpu", torch.float32) is not None:
        pytest.skip(f"{backend} is unavailable here")
    x, act, weight, _ = _inputs((16, 70, 24, 5))
    bias = torch.randn(5)
    with torch.no_grad():
        direct = glai_kernels.estimator(x, act, weight, bias, backend=backend)
    through_op = estimator_op(x, act, weight, bias, backend, False)[0]
    assert torch.equal(direct, through_op)


@pytest.fixture
def aliasing_backend():
    """A backend whose forward returns a view of its input x."""
    def aliasing(x, act, weight):
        return x[:, : weight.shape[0]]

    registry.register(registry.Backend(name="aliasing", forward=aliasing, backward=aliasing,
                                       devices=("cpu",), description="test backend"))
    yield "aliasing"
    registry.unregister("aliasing")


def test_direct_forward_still_refuses_an_aliasing_output(aliasing_backend):
    """A backend returning a view of its input is refused on the direct path as by the op."""
    x, act, weight, _ = _inputs((4, 6, 3, 6))
    with torch.no_grad(), pytest.raises(RuntimeError, match="alias"):
        glai_kernels.estimator(x, act, weight, backend=aliasing_backend)
    with pytest.raises(RuntimeError, match="alias"):
        estimator_op(x, act, weight, None, aliasing_backend, False)


# the node an eager call records: op.py's Function, or the backend's own (Backend.eager)
_EAGER_NODE = {"einsum": "_EagerEstimatorBackward", "torch": "_EagerEstimatorBackward",
               "cpp": "glai::EstimatorBackward"}


@pytest.mark.parametrize("backend", ["einsum", "torch", "cpp"])
def test_eager_autograd_is_the_op(backend):
    """With gradients, estimator() records the eager Function and gives the custom op's
    output and gradients, bit for bit, and the same gradients of gradients."""
    if registry.get(backend).unsupported_reason("cpu", torch.float32) is not None:
        pytest.skip(f"{backend} is unavailable here")
    x, act, weight, dy = _inputs((16, 70, 24, 5), seed=3)
    bias = torch.randn(5)

    def run(through_op: bool):
        leaves = [t.detach().requires_grad_(True) for t in (x, act, weight, bias)]
        if through_op:
            y = estimator_op(*leaves, backend, True)[0]
        else:
            y = glai_kernels.estimator(*leaves, backend=backend)
            assert y.grad_fn.name().endswith(_EAGER_NODE[backend])
        grads = torch.autograd.grad(y, leaves, dy, create_graph=True)
        second = torch.autograd.grad(grads[2].square().sum(), leaves[:2])
        return [y, *grads, *second]

    for eager, op in zip(run(False), run(True), strict=True):
        assert torch.equal(eager, op)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("wanted", [(0,), (1,), (2,), (0, 1, 2)], ids=["x", "act", "w", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
def test_cpp_eager_node_is_the_op(dtype, wanted, with_bias):
    """cpp's C++ node gives the custom op's output and gradients bit for bit whichever inputs
    need gradients (act's decides whether Z is kept), with and without bias, and leaves its
    inputs as they were."""
    if registry.get("cpp").unsupported_reason("cpu", dtype) is not None:
        pytest.skip("cpp is unavailable here")
    x, act, weight, dy = _inputs((13, 29, 19, 3), dtype, seed=5)
    bias = torch.randn(3, dtype=dtype) if with_bias else None
    before = [t.clone() for t in (x, act, weight)]

    def run(through_op: bool):
        leaves = [t.detach().requires_grad_(k in wanted or (k == 3 and with_bias))
                  for k, t in enumerate((x, act, weight, bias)) if t is not None]
        inputs = [*leaves, None] if bias is None else leaves
        if through_op:
            y = estimator_op(*inputs, "cpp", act.requires_grad or 1 in wanted)[0]
        else:
            y = glai_kernels.estimator(*inputs, backend="cpp")
            assert y.grad_fn.name().endswith(_EAGER_NODE["cpp"])
        asked = [t for t in leaves if t.requires_grad]
        return [y, *torch.autograd.grad(y, asked, dy)]

    for eager, op in zip(run(False), run(True), strict=True):
        assert eager.dtype == op.dtype and torch.equal(eager, op)
    assert all(torch.equal(t, b) for t, b in zip((x, act, weight), before, strict=True))


def test_cpp_eager_node_sees_a_saved_input_modified():
    """The C++ node saves its inputs as autograd does: one changed in place after the forward
    makes the backward fail instead of using the new values."""
    x, act, weight, dy = _inputs((4, 6, 5, 2))
    weight.requires_grad_(True)
    y = glai_kernels.estimator(x, act, weight, backend="cpp")
    with torch.no_grad():
        x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, [weight], dy)


def test_cpp_eager_node_frees_its_saved_tensors():
    """The C++ node keeps its saved tensors for a retained graph and frees them after a
    backward without retain_graph, as autograd's own nodes do: a second backward then fails
    with autograd's message instead of reading freed or stale memory."""
    x, act, weight, dy = _inputs((4, 6, 5, 2))
    weight.requires_grad_(True)
    y = glai_kernels.estimator(x, act, weight, backend="cpp")
    first = torch.autograd.grad(y, [weight], dy, retain_graph=True)[0]
    assert torch.equal(torch.autograd.grad(y, [weight], dy)[0], first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, [weight], dy)


def test_eager_autograd_refuses_an_aliasing_output(aliasing_backend):
    x, act, weight, _ = _inputs((4, 6, 3, 6))
    with pytest.raises(RuntimeError, match="alias"):
        glai_kernels.estimator(x, act, weight.requires_grad_(True), backend=aliasing_backend)


def test_direct_forward_keeps_the_input_checks():
    x, act, weight, _ = _inputs((4, 6, 3, 2))
    with torch.no_grad(), pytest.raises((ValueError, RuntimeError)):
        glai_kernels.estimator(x, act[:, :2], weight, backend="torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpp_dx_at_small_batch(isa, shape, dtype):
    x, act, weight, dy = _inputs(shape, dtype)
    _assert_cpp_dx_is_the_reference(x, act, weight, dy)


@pytest.mark.parametrize("dtype, shape", [(torch.float32, (16, 2050, 2050, 1)),
                                          (torch.float64, (8, 1450, 1451, 1))],
                         ids=["f32", "f64"])
def test_cpp_dx_at_small_batch_past_16_mib(isa, dtype, shape):
    """A weight over 16 MiB at B within one vector takes the tall tile on every instruction
    set (AVX-512 included): still the float64 reference."""
    x, act, weight, dy = _inputs(shape, dtype)
    assert weight.numel() * weight.element_size() > 16 << 20
    _assert_cpp_dx_is_the_reference(x, act, weight, dy)


def test_cpp_dx_at_small_batch_between_the_vendors_bounds(isa):
    """A weight of 8 MiB at B = 16 is past Intel's bound for the form along s and within
    AMD's: whichever form this CPU takes, dx is the float64 reference's."""
    x, act, weight, dy = _inputs((16, 1031, 1017, 2))
    assert 4 << 20 < weight.numel() * weight.element_size() < 16 << 20
    _assert_cpp_dx_is_the_reference(x, act, weight, dy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [16, 4, 1])
def test_cpp_forward_short_last_block_same_bits(isa, batch, dtype):
    """B = 16, 4 and 1 end in a block of 4, 4 and 1 rows (the short tile); the same rows in a
    batch of 18 (three full blocks) give y and Z bit for bit, and y matches float64."""
    x, act, weight, _ = _inputs((18, 37, 83, 3), dtype)
    y_full, z_full = torch.ops.glai_ext.forward(x, act, weight, True)
    rows = slice(18 - batch, 18)  # the last rows: in the short block at B = batch
    y, z = torch.ops.glai_ext.forward(x[rows].contiguous(), act[rows].contiguous(), weight,
                                      True)
    assert torch.equal(y, y_full[rows]) and torch.equal(z, z_full[rows])
    ref = torch.einsum("bi,bs,ois->bo", x[rows].double(), act[rows].double(), weight.double())
    bound = (1e-5 if dtype == torch.float32 else 1e-12) * ref.abs().max()
    assert (y.double() - ref).abs().max() <= bound


@pytest.mark.parametrize("shape", [(16, 385, 128, 3), (4, 30, 5, 2), (8, 10, 8, 3)])
def test_torch_dx_small_batch_path(shape):
    """B <= P takes the batched-GEMM dx; it matches the float64 reference, and so does the
    path for B > P (the same shape with P cut below B)."""
    x, act, weight, dy = _inputs(shape)
    for a, w in ((act, weight), (act[:, :2], weight[:, :, :2])):
        dx, _, _ = torch_backward(dy, x, a, w.contiguous(), (True, False, False))
        ref = _dx64(dy, a, w)
        assert (dx.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
