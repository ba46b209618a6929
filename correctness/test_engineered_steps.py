"""The engineered protocol's native steps (csrc/cpu/engineered_steps.cpp; issue 41): GLAI's
`FusedSparseStep` and the MLP's `HandFusedMLPStep` with `native=True` run the forward and the
update as one extension call each, and must compute the Python path's (`native=False`) values,
optimizer state and loss bit for bit: the same kernels on the same tensors in the same order.
The MLP step's default (`gemm="own"`) runs its products on the selector's register tile
(kernels.inc's `product`) instead: the Python path's values to test_protocols.py's rounding,
each product within the rounding bound of its sums, a transposed operand caught, and the
user's model left in its layout."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from fused_step_setup import BATCH, STEPS, batches, sparse_head, state_of
from glai_models import random_mlp

from glai_kernels import fused
from glai_kernels.glai.fused_step import FusedSparseStep, _selector_columns
from glai_kernels.glai.mlp_step import HandFusedMLPStep
from glai_kernels.glai.tasks import info_nce, two_views

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


def _contrastive(model, x: torch.Tensor) -> torch.Tensor:
    """Family B's loss (glai/tasks.py, Contrastive): InfoNCE between two dropout views."""
    return info_nce(*two_views(model, x), 0.5)


def _glai_run(head, make_optimizer, native: bool, views: int = 1, lr_scale: float = 1.0,
              contrastive: bool = False):
    """STEPS fused steps of `head` (cross entropy, `views` model calls per loss; or family
    B's two-view InfoNCE); returns (losses, state after, (native forwards, native updates)
    run: one-call and several-call updates counted together)."""
    optimizer = make_optimizer([p for p in head.parameters() if p.requires_grad])
    for group in optimizer.param_groups:
        group["lr"] *= lr_scale
    stepper = FusedSparseStep(head, optimizer, native=native)
    forwards, updates = _count(stepper, "_native_forward"), _count(stepper, "_native_update")
    several = _count(stepper, "_native_update_calls")
    losses = []
    torch.manual_seed(11)  # dropout's random numbers, where the head has dropout
    for x, target in batches(head.sparse_weight.values.dtype):
        if contrastive:
            losses.append(stepper.step(lambda model, x=x: _contrastive(model, x)))
            continue
        losses.append(stepper.step(lambda model, x=x, t=target: sum(
            F.cross_entropy(model(x), t) for _ in range(views))))
    return losses, state_of(head, optimizer), (forwards[0], updates[0] + several[0])


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


@pytest.mark.parametrize("case", ["two calls", "separate bias group"])
def test_native_fused_step_falls_back_where_it_does_not_apply(case):
    """Two model calls per loss (native forwards, the several-call native update), the bias
    in its own group (the native forward, the update from Python): the Python path's bits."""
    head = sparse_head(torch.float64, backend="cpp")
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
    assert updates == {"two calls": (2 * STEPS, STEPS), "separate bias group": (STEPS, 0)}[case]
    assert _equal(losses, python_losses)
    assert _equal(state, python_state)


def _mlp_run(model, native: bool, views: int = 1, gemm: str = "torch",
             contrastive: bool = False):
    """STEPS hand-fused SGD steps (fused, weight decay) of `model` on a seeded [BATCH, n0]
    squared error (`views` model calls per loss) or family B's two-view InfoNCE; returns
    (losses, parameters after, native updates run: one-call and several-call together)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-2, fused=True)
    stepper = HandFusedMLPStep(model, optimizer, native=native, gemm=gemm)
    updates = _count(stepper, "_native_update")
    several = _count(stepper, "_native_update_calls")
    first = next(m for m in model if isinstance(m, torch.nn.Linear))
    last = [m for m in model if isinstance(m, torch.nn.Linear)][-1]
    gen = torch.Generator().manual_seed(4)
    dtype = first.weight.dtype
    losses = []
    torch.manual_seed(11)
    for _ in range(STEPS):
        x = torch.randn(BATCH, first.in_features, generator=gen, dtype=dtype)
        target = torch.randn(BATCH, last.out_features, generator=gen, dtype=dtype)
        if contrastive:
            losses.append(stepper.step(lambda m, x=x: _contrastive(m, x)))
            continue
        losses.append(stepper.step(lambda m, x=x, t=target: sum(
            (m(x) - t).square().mean() for _ in range(views))))
    return losses, [p.detach().clone() for p in model.parameters()], updates[0] + several[0]


WIDTHS = [(11, 14, 5), (13, 17, 9, 3), (7, 3), (37, 70, 33)]


def _model(widths, dtype):
    """Two and three Linears, the linear baseline (one Linear), and rows over 4 vectors."""
    if len(widths) == 2:
        torch.manual_seed(2)
        return torch.nn.Sequential(torch.nn.Linear(*widths, dtype=dtype))
    return random_mlp(widths, seed=2, dtype=dtype)


@pytest.mark.parametrize("widths", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_mlp_step_is_the_python_hand_fused_step_bit_for_bit(widths, dtype):
    """With torch's GEMMs (`gemm="torch"`) the native step runs the Python path's ops."""
    model = _model(widths, dtype)
    twin = copy.deepcopy(model)
    losses, params, updates = _mlp_run(model, native=True)
    assert updates == STEPS
    python_losses, python_params, python_updates = _mlp_run(twin, native=False)
    assert python_updates == 0
    assert _equal(losses, python_losses)
    assert _equal(params, python_params)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("case", ["dropout in eval mode", "two dropouts in a row"])
def test_native_mlp_step_falls_back_where_it_does_not_apply(case):
    """Dropout in eval mode (nothing drawn: the native path) and a chain the op does not
    take (two Dropouts in a row: the Python path): the Python path's bits."""
    model = random_mlp((11, 14, 5), seed=2, dropout=0.0 if case == "two calls" else 0.3)
    if case == "dropout in eval mode":
        model.eval()  # dropout does nothing: the native path applies
    if case == "two dropouts in a row":
        model = torch.nn.Sequential(*model[:3], torch.nn.Dropout(0.2), *model[3:])
    twin = copy.deepcopy(model)
    losses, params, updates = _mlp_run(model, native=True)
    python_losses, python_params, _ = _mlp_run(twin, native=False)
    assert updates == (STEPS if case == "dropout in eval mode" else 0)
    assert _equal(losses, python_losses)
    assert _equal(params, python_params)


TOL = {torch.float32: {"rtol": 1e-6, "atol": 1e-6},  # test_protocols.py's rounding
       torch.float64: {"rtol": 1e-12, "atol": 1e-13}}


@pytest.mark.parametrize("widths", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_mlp_step_on_its_own_gemm_is_the_python_step_to_rounding(widths, dtype):
    """The default `gemm="own"`: the same products summed in another order."""
    model = _model(widths, dtype)
    twin = copy.deepcopy(model)
    losses, params, updates = _mlp_run(model, native=True, gemm="own")
    assert updates == STEPS
    python_losses, python_params, _ = _mlp_run(twin, native=False)
    torch.testing.assert_close(losses, python_losses, **TOL[dtype])
    torch.testing.assert_close(params, python_params, **TOL[dtype])


def _within_rounding(got, want, bound, terms: int) -> bool:
    """|got - want| <= terms * eps * bound (+ want's own rounding) everywhere: a sum of `terms`
    products in got's dtype against float64, `bound` the sum of the terms' magnitudes."""
    eps = torch.finfo(got.dtype).eps
    return bool(((got.double() - want).abs() <= terms * eps * bound + eps * want.abs()).all())


@pytest.mark.parametrize("widths", [(19, 70, 9), (48, 64, 16)], ids=["odd", "whole tiles"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 13, 16, 70])
def test_own_gemm_products_against_float64(isa, batch, dtype, widths):
    """Each product of glai_ext::mlp_step_forward/update with own_gemm against float64 torch,
    within the rounding bound of its sums, on every instruction set: batches within, at and over
    one vector, widths off every vector multiple (edge tiles through linear's epilogue) and on
    them (whole 8-row tiles stored in place); a bias left out (the known-wrong variant) is
    outside the bound."""
    gen = torch.Generator().manual_seed(batch)
    n0, n1, n2 = widths
    x = torch.randn(batch, n0, generator=gen, dtype=dtype)
    ws = [torch.randn(m, n, generator=gen, dtype=dtype) / n ** 0.5
          for n, m in itertools.pairwise((n0, n1, n2))]
    bs = [torch.randn(m, generator=gen, dtype=dtype) for m in (n1, n2)]
    y, h = torch.ops.glai_ext.mlp_step_forward(x, ws, bs, True)
    x64, h64, dy = x.double(), h.double(), torch.randn(batch, n2, generator=gen, dtype=dtype)
    w64, b64, dy64 = [w.double() for w in ws], [b.double() for b in bs], dy.double()
    pre = x64 @ w64[0].t() + b64[0]
    assert _within_rounding(h, torch.relu(pre), x64.abs() @ w64[0].abs().t() + b64[0].abs(),
                            n0 + 1)
    y_bound = h64.abs() @ w64[1].abs().t() + b64[1].abs()
    assert _within_rounding(y, h64 @ w64[1].t() + b64[1], y_bound, n1 + 1)
    assert not _within_rounding(y, h64 @ w64[1].t(), y_bound, n1 + 1)
    grads = [torch.empty_like(t) for pair in zip(ws, bs, strict=True) for t in pair]
    params = [t.clone() for pair in zip(ws, bs, strict=True) for t in pair]
    torch.ops.glai_ext.mlp_step_update(dy, x, [h], params[0::2], params[1::2], grads, 0.0,
                                       0.0, 0.0, True, [], [])  # lr 0: the gradients alone
    gate = (h64 > 0).double()
    dh64, dh_bound = (dy64 @ w64[1]) * gate, (dy64.abs() @ w64[1].abs()) * gate
    checks = [(dh64.t() @ x64, dh_bound.t() @ x64.abs(), n2 + batch),
              (dh64.sum(0), dh_bound.sum(0), n2 + batch),
              (dy64.t() @ h64, dy64.abs().t() @ h64.abs(), batch),
              (dy64.sum(0), dy64.abs().sum(0), batch)]
    for k, (got, (want, bound, terms)) in enumerate(zip(grads, checks, strict=True)):
        assert _within_rounding(got, want, bound, terms), k


def test_native_mlp_step_ops_name_bad_arguments():
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(RuntimeError, match="weights and biases must be one per Linear"):
        torch.ops.glai_ext.mlp_step_forward(x, [w], [], False)
    with pytest.raises(RuntimeError, match=r"weights\[1\] must be \[n, 5\]"):
        torch.ops.glai_ext.mlp_step_forward(x, [w, torch.randn(2, 4)],
                                            [torch.zeros(5), torch.zeros(2)], True)
    with pytest.raises(RuntimeError, match="grads 2"):
        torch.ops.glai_ext.mlp_step_update(torch.randn(4, 5), x, [], [w], [torch.zeros(5)],
                                           [], 0.1, 0.0, 0.0, True, [], [])
    with pytest.raises(RuntimeError, match="x must be a contiguous"):
        torch.ops.glai_ext.mlp_step_forward(x.t().contiguous().t(), [w], [torch.zeros(5)], True)
    model = _model((3, 4, 2), torch.float32)
    with pytest.raises(ValueError, match="gemm must be 'own' or 'torch'"):
        HandFusedMLPStep(model, torch.optim.SGD(model.parameters(), lr=0.1), gemm="mkl")


def test_own_gemm_gives_the_same_bits_on_any_thread_count():
    """The own GEMM splits rows over torch's threads; each row's sums keep their order."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(21, 300, generator=gen)
    ws = [torch.randn(257, 300, generator=gen), torch.randn(31, 257, generator=gen)]
    bs = [torch.randn(257, generator=gen), torch.randn(31, generator=gen)]
    previous, results = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y, h = torch.ops.glai_ext.mlp_step_forward(x, ws, bs, True)
            grads = [torch.empty_like(t) for pair in zip(ws, bs, strict=True) for t in pair]
            params = [t.clone() for pair in zip(ws, bs, strict=True) for t in pair]
            torch.ops.glai_ext.mlp_step_update(torch.ones_like(y), x, [h], params[0::2],
                                               params[1::2], grads, 0.1, 0.01, 0.0, True,
                                               [], [])
            results.append([y, h, *grads, *params])
    finally:
        torch.set_num_threads(previous)
    assert _equal(results[0], results[1])


@pytest.mark.parametrize("batch", [13, 16])
def test_own_gemm_products_see_a_transposed_operand(isa, batch):
    """A square chain (every W [n, n]), where a kernel reading W^T for W (or dW^T for dW)
    would still fit every shape: each product is within rounding of the right float64 product
    and outside it for the transposed operand (the known-wrong kernel)."""
    gen = torch.Generator().manual_seed(30 + batch)
    n = 21
    x = torch.randn(batch, n, generator=gen)
    ws = [torch.randn(n, n, generator=gen) / n ** 0.5 for _ in range(2)]
    bs = [torch.randn(n, generator=gen) for _ in range(2)]
    y, h = torch.ops.glai_ext.mlp_step_forward(x, ws, bs, True)
    x64, h64, w64 = x.double(), h.double(), [w.double() for w in ws]
    bound = h64.abs() @ w64[1].abs().t() + bs[1].double().abs()
    assert _within_rounding(y, h64 @ w64[1].t() + bs[1].double(), bound, n + 1)
    assert not _within_rounding(y, h64 @ w64[1] + bs[1].double(), bound, n + 1)
    dy = torch.randn(batch, n, generator=gen)
    dy64 = dy.double()
    grads = [torch.empty_like(t) for pair in zip(ws, bs, strict=True) for t in pair]
    params = [t.clone() for pair in zip(ws, bs, strict=True) for t in pair]
    torch.ops.glai_ext.mlp_step_update(dy, x, [h], params[0::2], params[1::2], grads, 0.0,
                                       0.0, 0.0, True, [], [])
    dw1, dw1_bound = dy64.t() @ h64, dy64.abs().t() @ h64.abs()
    assert _within_rounding(grads[2], dw1, dw1_bound, batch)
    assert not _within_rounding(grads[2], dw1.t(), dw1_bound.t(), batch)
    gate = (h64 > 0).double()
    dh, dh_bad = (dy64 @ w64[1]) * gate, (dy64 @ w64[1].t()) * gate
    bound0 = ((dy64.abs() @ w64[1].abs()) * gate).t() @ x64.abs()
    assert _within_rounding(grads[0], dh.t() @ x64, bound0, n + batch)
    assert not _within_rounding(grads[0], dh_bad.t() @ x64, bound0, n + batch)


def test_the_step_comparison_sees_a_transposed_weight():
    """The known-wrong step: the Python path on the transposed weights of a square chain (what
    a step reading W^T for W would compute) is outside the rounding the own-GEMM step keeps."""
    model = _model((17, 17, 17), torch.float32)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for m in twin:
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(m.weight.t().clone())
    _, params, _ = _mlp_run(model, native=True, gemm="own")
    _, wrong, _ = _mlp_run(twin, native=False)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(params, wrong, **TOL[torch.float32])


def test_the_own_gemm_step_leaves_the_users_model_as_it_was():
    """What a user sees after own-GEMM steps: the same Parameter objects (the ones the optimizer
    steps), in nn.Linear's layout (contiguous, the same strides and storage), no .grad, a
    state_dict of the same keys, shapes and strides, and an ordinary step afterwards that
    matches the same ordinary step on a model trained by the Python path, to rounding."""
    model = _model((13, 17, 9, 3), torch.float32)
    twin = copy.deepcopy(model)
    before = {name: (p, p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    stepper = HandFusedMLPStep(model, optimizer)
    x, target = torch.randn(BATCH, 13), torch.randn(BATCH, 3)
    for _ in range(STEPS):
        stepper.step(lambda m: (m(x) - target).square().mean())
    for name, p in model.named_parameters():
        assert p is before[name][0] and p.data_ptr() == before[name][1], name
        assert p.is_contiguous() and p.stride() == before[name][2] and p.grad is None, name
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(model.parameters())
    state, twin_state = model.state_dict(), twin.state_dict()
    assert list(state) == list(twin_state)
    assert all(state[k].shape == twin_state[k].shape and state[k].stride() ==
               twin_state[k].stride() for k in state)
    reference = HandFusedMLPStep(twin, torch.optim.SGD(twin.parameters(), lr=0.1, fused=True),
                                 native=False)
    for _ in range(STEPS):
        reference.step(lambda m: (m(x) - target).square().mean())
    for m in (model, twin):  # the ordinary loop afterwards, on each
        loss = (m(x) - target).square().mean()
        loss.backward()
        torch.optim.SGD(m.parameters(), lr=0.1, fused=True).step()
    torch.testing.assert_close(list(model.parameters()), list(twin.parameters()),
                               **TOL[torch.float32])


def test_a_weight_in_another_layout_takes_torchs_gemms():
    """A weight the user keeps as a transposed view (not contiguous): the native step keeps
    that layout and runs torch's GEMMs on it (gemm="torch"'s bits), no copy made."""
    model = _model((11, 14, 5), torch.float64)
    with torch.no_grad():
        first = model[0]
        first.weight.data = first.weight.detach().t().contiguous().t()
    twin = copy.deepcopy(model)
    strides = first.weight.stride()
    losses, params, updates = _mlp_run(model, native=True, gemm="own")
    torch_losses, torch_params, _ = _mlp_run(twin, native=True, gemm="torch")
    assert updates == STEPS and first.weight.stride() == strides
    assert _equal(losses, torch_losses)
    assert _equal(params, torch_params)


# Family B (issue 41, stop 48): dropout in training inside the native forwards, drawing the
# Python paths' random numbers in their order; family B's loss (two dropout views of one call)


def _reordered_selector(head):
    """The head with its selector's path columns permuted, one unit twice and one left out
    (units no longer 0..n1-1 in order): the gather after the dropout matters."""
    columns = torch.tensor([13, 2, 2, 7, 0, 1, 3, 4, 5, 6, 8, 9, 10, 11])
    assert columns.numel() == head.selector.paths
    head.selector = head.selector.select(columns)
    return head


@pytest.mark.parametrize("case", ["cross entropy", "two views", "reordered columns"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_fused_step_with_selector_dropout_is_the_python_step_bit_for_bit(dtype, case):
    head = sparse_head(dtype, dropout=0.3, backend="cpp")
    if case == "reordered columns":
        head = _reordered_selector(head)
    assert head.selector.training and head.selector.dropout[0] > 0
    twin = copy.deepcopy(head)
    contrastive = case == "two views"
    losses, state, updates = _glai_run(head, ADAMS["adam"], native=True,
                                       contrastive=contrastive)
    assert updates == (STEPS, STEPS)
    python_losses, python_state, python_updates = _glai_run(twin, ADAMS["adam"], native=False,
                                                            contrastive=contrastive)
    assert python_updates == (0, 0)
    assert _equal(losses, python_losses)
    assert _equal(state, python_state)


def _native_act(head, x: torch.Tensor, seed: int) -> torch.Tensor:
    """act [B, P] of one native model call of the fused step, the generator seeded first."""
    stepper = FusedSparseStep(head, ADAMS["adam"]([p for p in head.parameters()
                                                   if p.requires_grad]))
    forwards, calls = _count(stepper, "_native_forward"), []
    torch.manual_seed(seed)
    stepper._forward(x, calls, stepper._plan())
    assert forwards[0] == 1
    return calls[0][1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_selector_dropout_draws_over_every_hidden_unit(dtype):
    """The native act is the selector's own (gates over all n1 units, F.dropout, then the
    columns), and not the known-wrong variant drawing the noise over the [B, P] columns;
    with the generator's state moved by one draw, the noise moves too."""
    head = _reordered_selector(sparse_head(dtype, dropout=0.3, backend="cpp"))
    x = batches(dtype)[0][0]
    act = _native_act(head, x, seed=5)
    torch.manual_seed(5)
    with torch.no_grad():
        want = head.selector(x)
    assert _equal([act], [want])
    assert act.unique().numel() == 2 and (act == 0).any()  # dropped and kept gates both
    head.selector.eval()
    with torch.no_grad():
        gates = head.selector(x)  # 0/1, no dropout
    head.selector.train()
    torch.manual_seed(5)
    assert not torch.equal(act, F.dropout(gates, 0.3, True))
    torch.manual_seed(5)
    torch.rand(1)  # one draw before: another stream
    with torch.no_grad():
        shifted = head.selector(x)
    assert not torch.equal(act, shifted)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_step_drawing_its_noise_in_another_order_is_seen(dtype):
    """The known-wrong variant of the comparison above: the selector's dropout at another
    generator state (one draw earlier) changes the step's losses and state."""
    head = sparse_head(dtype, dropout=0.3, backend="cpp")
    twin = copy.deepcopy(head)
    real = FusedSparseStep._native_forward

    def shifted(self, x, plan):
        torch.rand(1)  # one more draw before the op's
        return real(self, x, plan)
    try:
        FusedSparseStep._native_forward = shifted
        _, state, _ = _glai_run(head, ADAMS["adam"], native=True)
    finally:
        FusedSparseStep._native_forward = real
    _, python_state, _ = _glai_run(twin, ADAMS["adam"], native=False)
    assert not _equal(state, python_state)


def _dropout_model(kind: str, dtype):
    """Family B's MLP forms: hidden dropout after each ReLU (two and three Linears, one rate
    each), and the linear baseline with its input dropout (glai/protocol.py)."""
    if kind == "linear":
        torch.manual_seed(2)
        return torch.nn.Sequential(torch.nn.Dropout(0.25), torch.nn.Linear(11, 5, dtype=dtype))
    if kind == "input and hidden":
        model = random_mlp((13, 17, 9, 3), seed=2, dtype=dtype, dropout=(0.2, 0.4))
        return torch.nn.Sequential(torch.nn.Dropout(0.1), *model)
    return random_mlp((11, 14, 5), seed=2, dtype=dtype, dropout=0.3)


DROPOUT_MODELS = ["hidden", "input and hidden", "linear"]


@pytest.mark.parametrize("contrastive", [False, True], ids=["squared error", "two views"])
@pytest.mark.parametrize("kind", DROPOUT_MODELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_mlp_step_with_dropout_is_the_python_step_bit_for_bit(dtype, kind, contrastive):
    model = _dropout_model(kind, dtype)
    twin = copy.deepcopy(model)
    losses, params, updates = _mlp_run(model, native=True, contrastive=contrastive)
    assert updates == STEPS
    python_losses, python_params, python_updates = _mlp_run(twin, native=False,
                                                            contrastive=contrastive)
    assert python_updates == 0
    assert _equal(losses, python_losses)
    assert _equal(params, python_params)


@pytest.mark.parametrize("kind", DROPOUT_MODELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_mlp_step_with_dropout_on_its_own_gemm_is_the_python_step_to_rounding(dtype,
                                                                                    kind):
    model = _dropout_model(kind, dtype)
    twin = copy.deepcopy(model)
    losses, params, updates = _mlp_run(model, native=True, gemm="own", contrastive=True)
    assert updates == STEPS
    python_losses, python_params, _ = _mlp_run(twin, native=False, contrastive=True)
    torch.testing.assert_close(losses, python_losses, **TOL[dtype])
    torch.testing.assert_close(params, python_params, **TOL[dtype])


@pytest.mark.parametrize("gemm", ["torch", "own"])
def test_mlp_dropout_draws_in_the_models_order(gemm):
    """The native forward's noise is F.dropout's on x, then each hidden layer's
    bernoulli_(1 - p) / (1 - p) over [B, n_l], in the model's order: drawn here in that
    order they match, drawn in the reverse order (the known-wrong variant) they do not."""
    model = _dropout_model("input and hidden", torch.float32)
    stepper = HandFusedMLPStep(model, torch.optim.SGD(model.parameters(), lr=0.1, fused=True),
                               gemm=gemm)
    x = torch.randn(BATCH, 13, generator=torch.Generator().manual_seed(6))
    layers = stepper._native_layers(x)
    assert layers[3] == [0.1, 0.2, 0.4]
    torch.manual_seed(5)
    y, (dropped, hidden, relus, noise) = stepper._native_call(x, layers)
    torch.manual_seed(5)
    with torch.no_grad():
        saved: list = []
        want = stepper._forward(x, saved)
    if gemm == "torch":
        assert torch.equal(y, want)
    shapes = [(BATCH, 17), (BATCH, 9)]

    def draws(order):
        torch.manual_seed(5)
        first = F.dropout(torch.ones(BATCH, 13), 0.1, True)
        out = {}
        for k in order:
            p = (0.2, 0.4)[k]
            out[k] = torch.empty(shapes[k]).bernoulli_(1 - p).div_(1 - p)
        return first, [out[0], out[1]]
    first, in_order = draws([0, 1])
    assert torch.equal(dropped, x * first)
    assert _equal(noise, in_order)
    assert _equal(noise, [saved[3], saved[6]])  # the Python path's noise, kept for backward
    if gemm == "torch":  # the own GEMM's sums: the ReLUs' outputs to rounding
        assert _equal(relus, [saved[2], saved[5]])
    torch.testing.assert_close(relus, [saved[2], saved[5]], **TOL[torch.float32])
    assert _equal(hidden, [relus[0] * noise[0], relus[1] * noise[1]])
    _, reversed_order = draws([1, 0])
    assert not _equal(noise, reversed_order)


def test_native_dropout_ops_name_bad_arguments():
    x, w, b = torch.randn(4, 3), torch.randn(5, 3), torch.zeros(5)
    with pytest.raises(RuntimeError, match=r"dropout must hold one rate per Linear \(1\)"):
        torch.ops.glai_ext.mlp_step_forward(x, [w], [b], False, [0.1, 0.2])
    with pytest.raises(RuntimeError, match=r"dropout rates must be in \[0, 1\]"):
        torch.ops.glai_ext.mlp_step_forward(x, [w], [b], True, [1.5])
    with pytest.raises(RuntimeError, match="relus and noise must hold 0 tensors"):
        torch.ops.glai_ext.mlp_step_update(torch.randn(4, 5), x, [], [w], [b],
                                           [torch.empty_like(w), torch.empty_like(b)], 0.1,
                                           0.0, 0.0, True, [x], [])
    head = sparse_head(torch.float32, dropout=0.3, backend="cpp")
    stepper = FusedSparseStep(head, ADAMS["adam"]([p for p in head.parameters()
                                                   if p.requires_grad]))
    plan = stepper._plan()
    weight_t, sel_bias = head.selector._derived(
        "columns", (plan.sel_buffers["weight0"], plan.sel_buffers["bias0"],
                    plan.sel_buffers["units"]), _selector_columns)
    args = (torch.randn(4, 11), weight_t, sel_bias, plan.paths, plan.values.detach(),
            plan.index_list, None)
    with pytest.raises(RuntimeError, match="dropout needs units"):
        torch.ops.glai_ext.sparse_step_forward(*args, 0.3, None, 14)
    with pytest.raises(RuntimeError, match=r"units must be in \[0, hidden = 14\)"):
        torch.ops.glai_ext.sparse_step_forward(*args, 0.3, torch.full((plan.paths,), 14), 14)
    with pytest.raises(RuntimeError, match=r"dropout must be in \[0, 1\]"):
        torch.ops.glai_ext.sparse_step_forward(*args, -0.1, None, 14)


# Two model calls per loss (issue 41, stop 48): each side's native update sums the calls'
# gradients in call order, as its Python path does, then its update


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("adam", list(ADAMS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_fused_step_with_two_calls_is_the_python_step_bit_for_bit(dtype, adam, dropout):
    head = sparse_head(dtype, dropout=dropout, backend="cpp")
    twin = copy.deepcopy(head)
    losses, state, updates = _glai_run(head, ADAMS[adam], native=True, views=2)
    assert updates == (2 * STEPS, STEPS)
    python_losses, python_state, _ = _glai_run(twin, ADAMS[adam], native=False, views=2)
    assert _equal(losses, python_losses)
    assert _equal(state, python_state)


def test_the_two_call_comparison_sees_a_wrong_native_step():
    """The known-wrong variant: a learning rate one part in 10^6 off changes the bits."""
    head = sparse_head(torch.float32, dropout=0.3, backend="cpp")
    twin = copy.deepcopy(head)
    _, state, _ = _glai_run(head, ADAMS["adam"], native=True, views=2, lr_scale=1 + 1e-6)
    _, python_state, _ = _glai_run(twin, ADAMS["adam"], native=False, views=2)
    assert not _equal(state, python_state)


@pytest.mark.parametrize("views", [2, 3])
@pytest.mark.parametrize("kind", ["no dropout", *DROPOUT_MODELS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_mlp_step_with_several_calls_is_the_python_step(dtype, kind, views):
    """torch's GEMMs: the Python path's bits; the own tile: its rounding."""
    make = (lambda: _model((13, 17, 9, 3), dtype)) if kind == "no dropout" else (
        lambda: _dropout_model(kind, dtype))
    python_losses, python_params, _ = _mlp_run(make(), native=False, views=views)
    losses, params, updates = _mlp_run(make(), native=True, views=views)
    assert updates == STEPS
    assert _equal(losses, python_losses)
    assert _equal(params, python_params)
    losses, params, updates = _mlp_run(make(), native=True, views=views, gemm="own")
    assert updates == STEPS
    torch.testing.assert_close(losses, python_losses, **TOL[dtype])
    torch.testing.assert_close(params, python_params, **TOL[dtype])


def test_native_several_call_ops_name_bad_arguments():
    x, w, b = torch.randn(4, 3), torch.randn(5, 3), torch.zeros(5)
    with pytest.raises(RuntimeError, match="one dy and x per call"):
        torch.ops.glai_ext.mlp_step_update_calls(
            [torch.randn(4, 5)] * 2, [x], [], [w], [b],
            [torch.empty_like(w), torch.empty_like(b)], 0.1, 0.0, 0.0, False, [], [])
    values = torch.zeros(3)
    with pytest.raises(RuntimeError, match="one dy, x_aug and act per call"):
        torch.ops.glai_ext.sparse_step_update_calls(
            [torch.randn(4, 2)], [], [], values, [], torch.zeros(3), torch.zeros(3),
            torch.zeros(()), None, None, None, None, 0.1, 0.9, 0.999, 0.0, 1e-8, False)


@pytest.mark.parametrize("gemm", ["torch", "own"])
def test_calls_that_drop_differently_take_the_python_update(gemm):
    """A loss whose second call runs in eval mode (its dropout off): both forwards native,
    the update from Python on the tensors the forwards kept (noise, ReLU outputs): the
    Python path's values (its bits on torch's GEMMs)."""
    def run(native: bool):
        model = _dropout_model("input and hidden", torch.float64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-2, fused=True)
        stepper = HandFusedMLPStep(model, optimizer, native=native, gemm=gemm)
        single, several, forwards = (_count(stepper, name) for name in (
            "_native_update", "_native_update_calls", "_native_call"))
        gen = torch.Generator().manual_seed(4)
        torch.manual_seed(11)

        def loss_of(m, x):
            first = m(x)
            model.eval()
            second = m(x)
            model.train()
            return (first - second).square().mean() + first.square().mean()
        losses = []
        for _ in range(STEPS):
            x = torch.randn(BATCH, 13, generator=gen, dtype=torch.float64)
            losses.append(stepper.step(lambda m, x=x: loss_of(m, x)))
        params = [p.detach().clone() for p in model.parameters()]
        return losses, params, (forwards[0], single[0], several[0])
    losses, params, counts = run(True)
    assert counts == (2 * STEPS, 0, 0)  # the forwards native, the update from Python
    python_losses, python_params, *_ = run(False)
    if gemm == "torch":
        assert _equal(losses, python_losses)
        assert _equal(params, python_params)
    torch.testing.assert_close(losses, python_losses, **TOL[torch.float64])
    torch.testing.assert_close(params, python_params, **TOL[torch.float64])
