"""Both ops under PyTorch's transforms (issue 43), against the same transform of the float64
einsum oracle on every backend here: torch.func's grad, vjp, jacrev, jvp, jacfwd, hessian,
vmap (over rows, over stacked weights, both, and per-sample gradients) and functional_call,
torch.autograd.forward_ad, torch.export; and the sparse op's double backward (issue 40 item
2): gradgradcheck on every sparse backend, by its eager route and by its custom op.

These are Python-level transforms: the CUDA emulation (correctness/cuda_emulation) does not
apply to them; the `cuda` backends run them only on a CUDA machine. Shapes are tiny: the
`compile` and `triton` backends (Triton's interpreter on CPU) are slow per call.
"""

from __future__ import annotations

import copy
import inspect
import os

import pytest
import torch
from backends_under_test import backend_param
from torch.autograd import forward_ad, gradcheck, gradgradcheck
from torch.func import (
    functional_call,
    grad,
    hessian,
    jacfwd,
    jacrev,
    jvp,
    stack_module_state,
    vjp,
    vmap,
)

import glai_kernels.sparse as sparse
from glai_kernels import GLAIEstimator, estimator, registry, transforms
from glai_kernels import calls as calls_module
from glai_kernels.contract import Shape
from glai_kernels.sparse import SPARSE_ESTIMATOR, from_dense
from glai_kernels.sparse.op import sparse_estimator_op

F64 = torch.float64
SHAPE = (4, 6, 5, 3)  # (B, I, P, O): the shapes
SMALL = (2, 3, 2, 2)  # for the many calls of hessian and gradgradcheck
N = 3  # the vmap batch


def _sparse_params() -> list:
    chosen = os.environ.get(registry.ENV_VAR)
    names = sorted(SPARSE_ESTIMATOR.names())
    if chosen and chosen != registry.AUTO:
        names = [n for n in names if n == chosen]
    return [backend_param(name, SPARSE_ESTIMATOR.get(name), device)
            for name in names for device in SPARSE_ESTIMATOR.get(name).devices]


@pytest.fixture(params=_sparse_params())
def sparse_backend(request) -> tuple[str, str]:
    """(sparse backend name, device) for every available pair."""
    return request.param


class _SparseCall(torch.nn.Module):
    """The sparse op as a module, so functional_call swaps its values: (x, act, bias) -> y."""

    def __init__(self, sw, backend: str):
        super().__init__()
        self.sw, self.backend = sw, backend

    def forward(self, x, act, bias):
        return sparse.estimator(x, act, self.sw, bias, backend=self.backend)


def _inputs(device: str, shape, weight_shape=None) -> tuple[torch.Tensor, ...]:
    """(x [B, I], act [B, P], weight [O, I, P] or `weight_shape`, bias [O]), float64."""
    batch, inputs, paths, outputs = shape
    torch.manual_seed(0)
    return tuple(torch.randn(*s, dtype=F64, device=device)
                 for s in ((batch, inputs), (batch, paths),
                           weight_shape or (outputs, inputs, paths), (outputs,)))


def _sparse_weight(device: str, shape):
    _, inputs, paths, outputs = shape
    torch.manual_seed(1)
    mask = torch.rand(outputs, inputs, paths) < 0.5
    return from_dense(torch.randn(outputs, inputs, paths, dtype=F64), mask).to(device)


def _problem(kind: str, name: str, device: str, shape=SHAPE):
    """(f, oracle, (x, act, w, bias)): f(x, act, w, bias) -> y [B, O] on the op and backend
    (w the dense weight, or the kept values [K] through functional_call), the oracle the
    same function by einsum in float64."""
    if kind == "dense":
        def f(x, act, w, bias):
            return estimator(x, act, w, bias, backend=name)

        def oracle(x, act, w, bias):
            return torch.einsum("bi,bs,ois->bo", x, act, w) + bias

        return f, oracle, _inputs(device, shape)
    sw = _sparse_weight(device, shape)
    module, entries = _SparseCall(sw, name), sw.entries()

    def f_sparse(x, act, values, bias):
        return functional_call(module, {"sw.values": values}, (x, act, bias))

    def oracle_sparse(x, act, values, bias):
        weight = values.new_zeros(sw.shape).index_put(entries, values)
        return torch.einsum("bi,bs,ois->bo", x, act, weight) + bias

    return f_sparse, oracle_sparse, _inputs(device, shape, sw.values.shape)


def _problem_params() -> list:
    """Every dense backend on the dense op, every sparse backend on the sparse op."""
    from conftest import backend_device_params
    return [pytest.param((kind, *p.values[0]), id=f"{kind}-{p.id}", marks=p.marks)
            for kind, params in (("dense", backend_device_params()),
                                 ("sparse", _sparse_params()))
            for p in params]


@pytest.fixture(params=_problem_params())
def case(request) -> tuple[str, str, str]:
    """(op: "dense" or "sparse", backend name, device)."""
    return request.param


def _close(got, expected):
    # float64 both sides: the default float64 tolerances, tighter than gradcheck's
    torch.testing.assert_close(got, expected)


ALL = (0, 1, 2, 3)  # argnums: x, act, w, bias


def _loss(f):
    return lambda *args: f(*args).square().sum()


def test_reverse_mode(case):
    """grad, vjp and jacrev in every argument."""
    f, oracle, args = _problem(*case)
    _close(grad(_loss(f), argnums=ALL)(*args), grad(_loss(oracle), argnums=ALL)(*args))
    dy = torch.randn_like(oracle(*args))
    _close(vjp(f, *args)[1](dy), vjp(oracle, *args)[1](dy))
    _close(jacrev(f, argnums=ALL)(*args), jacrev(oracle, argnums=ALL)(*args))


def test_forward_mode(case):
    """jvp, jacfwd and torch.autograd.forward_ad: never a zero or a dropped tangent."""
    f, oracle, args = _problem(*case)
    tangents = tuple(torch.randn_like(a) for a in args)
    y, ydot = jvp(f, args, tangents)
    _close(y, oracle(*args))
    _close(ydot, jvp(oracle, args, tangents)[1])
    assert ydot.abs().max() > 0.1
    _close(jacfwd(f, argnums=ALL)(*args), jacfwd(oracle, argnums=ALL)(*args))
    with forward_ad.dual_level():
        duals = [forward_ad.make_dual(a, t) for a, t in zip(args, tangents, strict=True)]
        tangent = forward_ad.unpack_dual(f(*duals)).tangent
        expected = forward_ad.unpack_dual(oracle(*duals)).tangent
    assert tangent is not None
    _close(tangent, expected)


def test_forward_ad_applies_the_function_without_binding(monkeypatch):
    """Outside every functorch transform (here a forward-AD level) the op's Function is
    applied as Function.apply ends, without binding its arguments by inspect.signature on
    each call (≈ 19 µs of 35 a call); the tangent is the same."""
    seen = []
    signature = inspect.signature

    def spy(obj, *args, **kwargs):
        seen.append(obj)
        return signature(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", spy)
    x, act, w, bias = _inputs("cpu", SHAPE)
    t = torch.randn_like(x)
    with forward_ad.dual_level():
        y = estimator(forward_ad.make_dual(x, t), act, w, bias, backend="torch")
        tangent = forward_ad.unpack_dual(y).tangent
    assert transforms._Slot.forward not in seen
    _close(tangent, torch.einsum("bi,bs,ois->bo", t, act, w))


def test_hessian(case):
    """hessian (jacfwd of jacrev) of a squared loss in x, act and w."""
    f, oracle, (x, act, w, bias) = _problem(*case, SMALL)

    def on(fn):
        return hessian(lambda x, act, w: fn(x, act, w, bias).square().sum(),
                       argnums=(0, 1, 2))(x, act, w)

    _close(on(f), on(oracle))
    # a loss linear in x: its dx does not depend on x, whose tangent then meets only the
    # gradient's shape-giving slot (transforms.py): a zero Hessian, not an error
    c = torch.randn_like(oracle(x, act, w, bias))
    zero = hessian(lambda x: (f(x, act, w, bias) * c).sum())(x)
    _close(zero, torch.zeros_like(zero))


def test_vmap(case):
    """vmap over rows (one call on the stacked rows; batched at dim 0 or 1), over stacked
    weights (an empty batch too), over both (a loop of calls), and per-sample gradients
    (vmap of grad)."""
    f, oracle, (x, act, w, bias) = _problem(*case)
    xs = torch.randn(N, *x.shape, dtype=F64, device=x.device)
    ws = torch.randn(N, *w.shape, dtype=F64, device=x.device)
    for in_dims, args in (((0, None, None, None), (xs, act, w, bias)),
                          ((1, None, None, None), (xs.movedim(0, 1), act, w, bias)),
                          ((None, None, 0, None), (x, act, ws, bias)),
                          ((None, None, 0, None), (x[:0], act[:0], ws, bias)),  # B = 0
                          ((0, None, 0, None), (xs, act, ws, bias))):
        _close(vmap(f, in_dims=in_dims)(*args), vmap(oracle, in_dims=in_dims)(*args))

    def per_sample(fn):
        def loss(w, x, act):
            return fn(x[None], act[None], w, bias).square().sum()
        return vmap(grad(loss, argnums=(0, 1, 2)), in_dims=(None, 0, 0))(w, x, act)

    _close(per_sample(f), per_sample(oracle))


def test_vmap_calls_the_backend_once_where_it_folds(spy_calls):
    """Rows fold into B and stacked dense weights into O: one backend call each, forward and
    the gradient that keeps them apart; the weight's gradient for batched rows is N calls."""
    x, act, w, bias = _inputs("cpu", SHAPE)
    xs, ws = torch.stack([x] * N), torch.stack([w] * N)

    def f(x, act, w):
        return estimator(x, act, w, bias, backend="spy_high")

    def calls_of(run) -> list[str]:
        spy_calls.clear()
        run()
        return list(spy_calls)

    assert calls_of(lambda: vmap(f, in_dims=(0, None, None))(xs, act, w)) == ["spy_high.forward"]
    assert calls_of(lambda: vmap(f, in_dims=(None, None, 0))(x, act, ws)) == ["spy_high.forward"]
    per_row_dx = vmap(grad(lambda x: f(x, act, w).sum()))
    assert calls_of(lambda: per_row_dx(xs)) == ["spy_high.forward", "spy_high.backward"]
    per_head_dw = vmap(grad(lambda w: f(x, act, w).sum()))
    assert calls_of(lambda: per_head_dw(ws)) == ["spy_high.forward", "spy_high.backward"]
    per_row_dw = vmap(grad(lambda x, w: f(x, act, w).sum(), argnums=1), in_dims=(0, None))
    assert calls_of(lambda: per_row_dw(xs, w)) == ["spy_high.forward"] + ["spy_high.backward"] * N


def test_grad_levels(case):
    """grad under no_grad, grad of grad, and vmap of grad of grad (each grad level the op
    takes itself, transforms._through_grad): the oracle's results."""
    f, oracle, (x, act, w, bias) = _problem(*case, SMALL)

    def g(fn):
        return grad(lambda w: fn(x, act, w, bias).square().sum())

    def gg(fn):
        return grad(lambda w: g(fn)(w).square().sum())

    with torch.no_grad():
        _close(g(f)(w), g(oracle)(w))
    _close(gg(f)(w), gg(oracle)(w))
    ws = torch.randn(N, *w.shape, dtype=F64, device=w.device)
    _close(vmap(gg(f))(ws), vmap(gg(oracle))(ws))


def test_grad_matches_backward_bit_for_bit(backend_device):
    """torch.func.grad and the ordinary backward compute the same gradient of x and of w (on
    the eager route dact may come from the forward's kept partial sums instead)."""
    name, device = backend_device
    inputs = _inputs(device, SHAPE)
    dy = torch.randn(SHAPE[0], SHAPE[3], dtype=F64, device=device)
    for which in (0, 2):
        leaf = inputs[which].clone().requires_grad_(True)

        def loss(t, which=which):
            args = [*inputs[:which], t, *inputs[which + 1:]]
            return (estimator(*args, backend=name) * dy).sum()

        loss(leaf).backward()
        assert torch.equal(grad(loss)(inputs[which]), leaf.grad)


def test_ensemble_of_modules(backend_device):
    """stack_module_state + functional_call + vmap over GLAIEstimator heads: each head's own
    output and gradient, as N separate calls give them."""
    name, device = backend_device
    torch.manual_seed(2)
    _, inputs, paths, outputs = SHAPE
    heads = [GLAIEstimator(inputs, paths, outputs, backend=name, device=device, dtype=F64)
             for _ in range(N)]
    params, buffers = stack_module_state(heads)
    base = copy.deepcopy(heads[0]).to("meta")
    x, act = _inputs(device, SHAPE)[:2]

    def call(params, buffers, x, act):
        return functional_call(base, (params, buffers), (x, act))

    ys = vmap(call, in_dims=(0, 0, None, None))(params, buffers, x, act)
    ys.square().sum().backward()
    for n, head in enumerate(heads):
        y = head(x, act)
        y.square().sum().backward()
        _close(ys[n], y)
        _close(params["weight"].grad[n], head.weight.grad)
        _close(params["bias"].grad[n], head.bias.grad)


# ---- torch.export --------------------------------------------------------------------------

class _Dense(torch.nn.Module):
    def forward(self, x, act, w, bias):
        return estimator(x, act, w, bias, backend="torch")


def _exported_matches(module, args, op_name: str) -> None:
    program = torch.export.export(module, args)
    assert op_name in str(program.graph)
    _close(program.module()(*args), module(*args))


def test_export():
    """torch.export of the dense op, the sparse op and GLAIEstimator keeps the custom op."""
    x, act, w, bias = _inputs("cpu", SHAPE)
    _exported_matches(_Dense(), (x, act, w, bias), "glai.estimator")
    module = GLAIEstimator(*SHAPE[1:], backend="torch", dtype=F64)
    _exported_matches(module, (x, act), "glai.estimator")
    sparse_module = _SparseCall(_sparse_weight("cpu", SHAPE), "torch")
    _exported_matches(sparse_module, (x, act, bias), "glai.sparse_estimator")


# ---- the sparse op's double backward --------------------------------------------------------

def test_sparse_gradgradcheck(sparse_backend):
    """gradgradcheck in float64 by the eager route (a Function whose create_graph backward
    calls the backward op) and by the custom op (whose backward op has its own formula)."""
    name, device = sparse_backend
    f, _, args = _problem("sparse", name, device, SMALL)
    args = tuple(a.requires_grad_(True) for a in args)
    index = list(_sparse_weight(device, SMALL).index)

    def through_op(x, act, values, bias):
        return sparse_estimator_op(x, act, values, index, bias, name, True)[0]

    # Triton's interpreter takes ~0.1 s a call: its checks project on random directions
    fast = name == "triton" and device == "cpu"
    for fn in (f, through_op):
        assert gradcheck(fn, args, fast_mode=fast) and gradgradcheck(fn, args, fast_mode=fast)


def test_sparse_gradient_penalty_reaches_act(sparse_backend):
    """The issue's case: a penalty on dx (create_graph) moves dact as float64 einsum says."""
    name, device = sparse_backend
    f, oracle, args = _problem("sparse", name, device)

    def penalty_grad(fn):
        leaves = tuple(a.clone().requires_grad_(True) for a in args)
        (dx,) = torch.autograd.grad(fn(*leaves).square().sum(), leaves[0], create_graph=True)
        return torch.autograd.grad(dx.square().sum(), leaves[1])[0]

    _close(penalty_grad(f), penalty_grad(oracle))


# ---- vmap over stacked heads: one backend call, no copy of the stacked weight (issue 43) ----

def _recording_backend(name: str, calls: list) -> registry.Backend:
    """A CPU backend computing the op by einsum that records each call as (what, the weight's
    data_ptr, its shape): "forward", "backward" with `needs`, "eager" (its own autograd node,
    as `cpp` has; with the bias's data_ptr or None) and "eager.backward"; each gradient it
    returns is recorded as ("dweight", data_ptr)."""

    def grads(dy, x, act, weight, needs):
        dw = torch.einsum("bo,bi,bs->ois", dy, x, act) if needs[2] else None
        if dw is not None:
            calls.append(("dweight", dw.data_ptr()))
        return (torch.einsum("bo,ois,bs->bi", dy, weight, act) if needs[0] else None,
                torch.einsum("bo,bi,ois->bs", dy, x, weight) if needs[1] else None, dw)

    def forward(x, act, weight):
        calls.append(("forward", weight.data_ptr(), tuple(weight.shape)))
        return torch.einsum("bi,bs,ois->bo", x, act, weight)

    def backward(dy, x, act, weight, needs, saved=None):
        calls.append(("backward", weight.data_ptr(), tuple(weight.shape), tuple(needs)))
        return grads(dy, x, act, weight, needs)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, act, weight, bias):
            calls.append(("eager", weight.data_ptr(), tuple(weight.shape),
                          None if bias is None else bias.data_ptr()))
            ctx.save_for_backward(x, act, weight)
            y = torch.einsum("bi,bs,ois->bo", x, act, weight)
            return y if bias is None else y + bias

        @staticmethod
        def backward(ctx, dy):
            x, act, weight = ctx.saved_tensors
            calls.append(("eager.backward", weight.data_ptr(), tuple(weight.shape)))
            return (*grads(dy, x, act, weight, ctx.needs_input_grad[:3]),
                    dy.sum(0) if ctx.needs_input_grad[3] else None)

    return registry.Backend(name=name, forward=forward, backward=backward, devices=("cpu",),
                            description="records its calls",
                            eager=lambda x, act, w, bias, save: Eager.apply(x, act, w, bias))


@pytest.fixture
def recorded():
    """("recording", its calls): _recording_backend registered for one test."""
    calls: list = []
    registry.register(_recording_backend("recording", calls))
    yield "recording", calls
    registry.unregister("recording")


def _stacked_heads(name: str, shape=SHAPE, dtype=F64):
    """(heads, (params, buffers), call, x, act): N GLAIEstimator heads at `shape` (B, I, P,
    O) on the CPU, their stacked state and `call(params, buffers, x, act)`, one head's y under
    vmap."""
    torch.manual_seed(3)
    _, inputs, paths, outputs = shape
    heads = [GLAIEstimator(inputs, paths, outputs, backend=name, dtype=dtype)
             for _ in range(N)]
    params, buffers = stack_module_state(heads)
    base = copy.deepcopy(heads[0]).to("meta")
    x, act = (t.to(dtype) for t in _inputs("cpu", shape)[:2])

    def call(params, buffers, x, act):
        return functional_call(base, (params, buffers), (x, act))

    return heads, (params, buffers), call, x, act


def test_stacked_heads_make_one_call_on_the_stacked_weight(recorded):
    """vmap over stacked heads (stack_module_state, functional_call): the forward, the plain
    backward through it and torch.func.grad under vmap each make ONE backend call, on the
    stacked weight's own memory (no copy), the bias given to the forward's call (under grad
    too), and the weight's gradient is the backend's result itself (no copy either)."""
    name, calls = recorded
    _, (params, buffers), call, x, act = _stacked_heads(name)
    weight = params["weight"]
    folded = (N * SHAPE[3], *SHAPE[1:3])
    ptr, bias_ptr = weight.data_ptr(), params["bias"].data_ptr()
    heads = vmap(call, in_dims=(0, 0, None, None))

    with torch.no_grad():
        heads(params, buffers, x, act)
    assert calls == [("forward", ptr, folded)]

    calls.clear()
    ys = heads(params, buffers, x, act)
    assert calls == [("eager", ptr, folded, bias_ptr)]
    (dw,) = torch.autograd.grad(ys.square().sum(), [weight])
    assert calls[1:] == [("eager.backward", ptr, folded), ("dweight", dw.data_ptr())]

    calls.clear()

    def loss(params, buffers, x, act):
        return call(params, buffers, x, act).square().sum()

    dw = vmap(grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, act)["weight"]
    # the stacked state needs gradients of its own (as stack_module_state makes it), so the
    # forward below every transform is the eager node; torch.func.grad's backward is one call
    assert calls == [("eager", ptr, folded, bias_ptr),
                     ("backward", ptr, folded, (False, False, True)), ("dweight", dw.data_ptr())]


@pytest.mark.parametrize("shape, dtype", [(SHAPE, F64), ((16, 37, 29, 5), torch.float32)],
                         ids=["float64", "float32-B16"])
def test_stacked_heads_match_the_loop_bit_for_bit(built, shape, dtype):
    """On `cpp`, whose sums do not depend on how many outputs a call has, the vmapped heads'
    y and weight gradient (plain autograd through the vmapped forward, and torch.func.grad
    under vmap) are N separate calls' bit for bit. (`einsum`'s GEMMs sum in another order on
    the folded weight.)"""
    heads, (params, buffers), call, x, act = _stacked_heads("cpp", shape, dtype)
    stacked = vmap(call, in_dims=(0, 0, None, None))
    loop = [h(x, act) for h in heads]
    loop_grads = [torch.autograd.grad(y.square().sum(), (h.weight, h.bias))
                  for h, y in zip(heads, loop, strict=True)]
    loop_dw, loop_db = (torch.stack([g[i] for g in loop_grads]) for i in (0, 1))
    loop_y = torch.stack(loop).detach()
    ys = stacked(params, buffers, x, act)
    dw, db = torch.autograd.grad(ys.square().sum(), (params["weight"], params["bias"]))

    def loss(params, buffers, x, act):
        return call(params, buffers, x, act).square().sum()

    grads = vmap(grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, act)
    with torch.no_grad():
        assert torch.equal(stacked(params, buffers, x, act), loop_y)
    assert torch.equal(ys, loop_y)
    assert torch.equal(dw, loop_dw)
    assert torch.equal(grads["weight"], loop_dw)
    # the bias's gradient is aten's sum of dy over B, whose order depends on how many columns
    # it sums (N*O folded, O in the loop): the folded call's bits, the loop's value
    weight, bias = (t.detach().flatten(0, 1).requires_grad_(True)
                    for t in (params["weight"], params["bias"]))
    y = estimator(x, act, weight, bias, backend="cpp")
    (folded_db,) = torch.autograd.grad(y.square().sum(), bias)
    assert torch.equal(db.flatten(), folded_db)
    torch.testing.assert_close(db, loop_db)
    torch.testing.assert_close(grads["bias"], loop_db)


def _graph_nodes(root) -> list[str]:
    """The names of the autograd nodes reachable from `root` (a grad_fn)."""
    seen, todo, names = set(), [root], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        todo.extend(n for n, _ in node.next_functions)
    return names


def test_stacked_heads_forward_is_the_folded_call(recorded, monkeypatch):
    """The vmapped forward of stacked heads is the eager call of the op on the folded weight
    [N*O, I, P] AND the folded bias [N*O] (views of the stacked state): under no_grad
    calls.direct_forward, the bias added inside it; where autograd records, the backend's
    eager node given the bias, with no add of [N, B, O] + [N, 1, O] after it."""
    name, _ = recorded
    _, (params, buffers), call, x, act = _stacked_heads(name)
    heads = vmap(call, in_dims=(0, 0, None, None))
    direct_calls = []
    real = calls_module.direct_forward

    def direct_forward(impl, shape, tensors, rest, bias):
        direct_calls.append((impl.name, shape, tensors[2].data_ptr(), bias.data_ptr(),
                             tuple(bias.shape)))
        return real(impl, shape, tensors, rest, bias)

    monkeypatch.setattr(calls_module, "direct_forward", direct_forward)
    batch, inputs, paths, outputs = SHAPE
    with torch.no_grad():
        heads(params, buffers, x, act)
    assert direct_calls == [(name, Shape(batch, inputs, paths, N * outputs),
                             params["weight"].data_ptr(), params["bias"].data_ptr(),
                             (N * outputs,))]
    ys = heads(params, buffers, x, act)
    nodes = _graph_nodes(ys.grad_fn)
    assert "EagerBackward" in nodes
    assert not [n for n in nodes if n.startswith("AddBackward")], nodes


def test_stacked_heads_grad_backward_has_no_grad_level_function(recorded, monkeypatch):
    """vmap of torch.func.grad over stacked heads: the grad level's Function is applied once,
    for the forward (with the bias); with a sum loss the backward's cotangent needs no
    gradient at the grad level, so the weight's and bias's gradients are computed below it
    without a second Function, as one backend call on the folded dy [B, N*O] and weight;
    with a squared loss the cotangent depends on the weight there, so that level records
    the backward (a second Function, for the weight's gradient)."""
    name, calls = recorded
    _, (params, buffers), call, x, act = _stacked_heads(name)
    applied = []
    real = transforms._grad_function

    def counting(level):
        function = real(level)

        class Counting:
            @staticmethod
            def apply(c, k, *operands):
                applied.append(k)
                return function.apply(c, k, *operands)

        return Counting

    monkeypatch.setattr(transforms, "_grad_function", counting)
    gradients = []
    real_gradients = calls_module.gradients

    def spy(impl, dy, tensors, *args):
        gradients.append((tuple(dy.shape), tensors[2].data_ptr()))
        return real_gradients(impl, dy, tensors, *args)

    monkeypatch.setattr(calls_module, "gradients", spy)
    batch, _, _, outputs = SHAPE
    for square, functions in ((False, [transforms.Y]), (True, [transforms.Y, transforms.W])):
        applied.clear()
        gradients.clear()
        calls.clear()

        def loss(params, buffers, x, act, square=square):
            y = call(params, buffers, x, act)
            return (y.square() if square else y).sum()

        vmap(grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, act)
        assert applied == functions
        assert gradients == [((batch, N * outputs), params["weight"].data_ptr())]
        assert [c[0] for c in calls] == ["eager", "backward", "dweight"]


def test_grad_level_applies_no_function_to_a_call_it_does_not_record(monkeypatch):
    """Under torch.func.grad (and vmap of it) a call of the op whose tensors need no gradient
    at the grad level runs one level down without the level's Function, as functorch takes
    an aten op there; the gradient is still the oracle's."""
    applied = []
    real = transforms._grad_function

    def counting(level):
        applied.append(level)
        return real(level)

    monkeypatch.setattr(transforms, "_grad_function", counting)
    x, act, w, bias = _inputs("cpu", SHAPE)

    def loss(scale, fn):
        return (scale * fn(x, act, w, bias)).square().sum()

    def f(x, act, w, bias):
        return estimator(x, act, w, bias, backend="torch")

    def oracle(x, act, w, bias):
        return torch.einsum("bi,bs,ois->bo", x, act, w) + bias

    scales = torch.tensor([0.5, 2.0, -1.5], dtype=F64)
    got = vmap(grad(lambda s: loss(s, f)))(scales)
    expected = vmap(grad(lambda s: loss(s, oracle)))(scales)
    assert applied == []
    _close(got, expected)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_stacked_heads_grad_and_vjp_of_a_sum_match_the_loop_bit_for_bit(built, dtype):
    """On `cpp`, vmap of torch.func.grad and of torch.func.vjp (a cotangent per head) of a
    sum loss over stacked heads, the case whose backward is one call on the folded
    operands below the grad level: the weight's gradient is N separate calls' bit for bit,
    the bias's the folded call's bits (the sum over B of the folded dy) and the loop's
    value."""
    shape = (16, 37, 29, 5)
    heads, (params, buffers), call, x, act = _stacked_heads("cpp", shape, dtype)
    loop_grads = [torch.autograd.grad(h(x, act).sum(), (h.weight, h.bias)) for h in heads]
    loop_dw, loop_db = (torch.stack([g[i] for g in loop_grads]) for i in (0, 1))
    weight, bias = (t.detach().flatten(0, 1).requires_grad_(True)
                    for t in (params["weight"], params["bias"]))
    (folded_db,) = torch.autograd.grad(estimator(x, act, weight, bias, backend="cpp").sum(),
                                       bias)

    def loss(params, buffers, x, act):
        return call(params, buffers, x, act).sum()

    def pulled(params, buffers, x, act, one):
        _, pull = vjp(lambda p: loss(p, buffers, x, act), params)
        return pull(one)[0]

    by_grad = vmap(grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, act)
    by_vjp = vmap(pulled, in_dims=(0, 0, None, None, 0))(params, buffers, x, act,
                                                          torch.ones(N, dtype=dtype))
    for grads in (by_grad, by_vjp):
        assert torch.equal(grads["weight"], loop_dw)
        assert torch.equal(grads["bias"].flatten(), folded_db)
        torch.testing.assert_close(grads["bias"], loop_db)


@pytest.mark.parametrize("kind, name", [("dense", "cpp"), ("dense", "torch"), ("sparse", "cpp")])
def test_compiled_grad(kind, name):
    """torch.compile of a torch.func.grad: right against the oracle's eager grad (until stop
    45 it raised: under compile the dense op called the custom op, whose torch.library
    autograd is not functorch-ready). A few backends: each case compiles a graph."""
    reason = (registry.ESTIMATOR if kind == "dense" else SPARSE_ESTIMATOR).get(
        name).unsupported_reason("cpu", F64)
    if reason:
        pytest.skip(reason)
    torch._dynamo.reset()
    f, oracle, args = _problem(kind, name, "cpu")
    got = torch.compile(grad(_loss(f), argnums=ALL))(*args)
    expected = grad(_loss(oracle), argnums=ALL)(*args)
    for g, e in zip(got, expected, strict=True):
        _close(g, e)
