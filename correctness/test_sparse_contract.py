"""The sparse op keeps the dense op's contract (docs/ARCHITECTURE.md §1; issue 40, item 5):
non-finite values propagate as the float64 sums over the kept entries do, torch.autocast casts
as it does for the dense op, and meta tensors give shapes or a clear refusal naming the
argument, on every sparse backend here (`triton` through its interpreter on CPU).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from glai_models import random_mlp
from sparse_nonfinite import (
    assert_as_the_sums,
    assert_short_group_classes,
    nonfinite_case,
    oracles64,
    short_group_case,
    weight,
)

import glai_kernels.sparse as sparse
from glai_kernels import registry
from glai_kernels.glai import from_mlp, prune
from glai_kernels.glai.head import GLAIHead
from glai_kernels.sparse import SPARSE_ESTIMATOR, SparsePathWeight, from_dense

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(
    SPARSE_ESTIMATOR.get(name).unsupported_reason("cpu") is not None,
    reason=f"{name}: {SPARSE_ESTIMATOR.get(name).unsupported_reason('cpu')}"))
    for name in ("torch", "cpp", "triton")]


@pytest.fixture(autouse=True)
def _no_backend_request(monkeypatch):
    """Each test names its backend, or means "auto": not one from $GLAI_BACKEND."""
    monkeypatch.delenv(registry.ENV_VAR, raising=False)


# Triton's interpreter computes masked-off lanes too, through numpy, which warns of their NaN
NUMPY_NAN = "ignore:invalid value encountered:RuntimeWarning"


@pytest.mark.filterwarnings(NUMPY_NAN)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batch", [5, 19], ids=["B5", "B19"])  # one vector of lanes, two
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_propagate_as_the_float64_sums(backend, batch, dtype):
    infinite = {"y": False, "dact": False}
    for seed in range(6):
        x, act, sw, dy = nonfinite_case(seed, batch, dtype)
        terms, grouped, scale = oracles64(x, act, sw.values, sw.index, dy)
        for act_grad in (True, False):  # a forward that keeps Zg for dact, and one that does not
            xs, acts = x.clone().requires_grad_(), act.clone().requires_grad_(act_grad)
            y = sparse.estimator(xs, acts, sw, backend=backend)
            wrt = [xs, acts, sw.values] if act_grad else [xs, sw.values]
            grads = dict(zip(["dx", "dact", "dvalues"] if act_grad else ["dx", "dvalues"],
                             torch.autograd.grad(y, wrt, dy), strict=True))
            got = {"y": y, **grads}
            names = ("y", "dx", "dact", "dvalues")
            for name, term, group, size in zip(names, terms, grouped, scale, strict=True):
                if name not in got:
                    continue
                actual = got[name].detach()
                where = f"{backend} {name} (seed {seed}, act_grad={act_grad})"
                assert actual.dtype == dtype, where
                reached = assert_as_the_sums(where, actual, term, group, size, dtype)
                if name in infinite:
                    infinite[name] |= reached
    assert all(infinite.values())  # the planted values reached ±inf in y and dact


@pytest.mark.filterwarnings(NUMPY_NAN)
def test_an_infinite_value_in_a_short_group_stays_inf_on_the_kernels_padded_rounds():
    """The issue's case: one kept entry per group, an infinite value, B = 29 (padded lanes);
    y and dact are ±inf in the float64 sums, never NaN."""
    x, act, sw, dy = short_group_case()
    for backend in ("torch", "cpp", "triton"):
        if SPARSE_ESTIMATOR.get(backend).unsupported_reason("cpu") is not None:
            continue
        acts = act.clone().requires_grad_()
        y = sparse.estimator(x, acts, sw, backend=backend)
        (dact,) = torch.autograd.grad(y, acts, dy)
        assert_short_group_classes(backend, y, dact, x, act, sw, dy)


# ---- autocast ------------------------------------------------------------------------------


def autocast_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    sw = weight(seed=seed)
    _, inputs, paths = sw.shape
    x = torch.randn(6, inputs, generator=gen)
    act = torch.rand(6, paths, generator=gen)
    bias = torch.randn(sw.shape[0], generator=gen)
    return x, act, sw, bias


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_runs_the_backend_in_the_regions_dtype(backend):
    """As the dense op: float32 inputs (the values included) cast to bfloat16, y bfloat16,
    the same bits as the backend on the cast inputs outside the region; the casts are
    differentiable, so the float32 leaves get float32 gradients."""
    x, act, sw, bias = autocast_inputs()
    leaves = [t.clone().requires_grad_() for t in (x, act, bias)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = sparse.estimator(leaves[0], leaves[1], sw, leaves[2], backend=backend)
    assert y.dtype == torch.bfloat16
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(y.dtype)
    grads = torch.autograd.grad(y, [*leaves, sw.values], dy)

    half = copy.deepcopy(sw).to(torch.bfloat16)
    cast = [t.to(torch.bfloat16).requires_grad_() for t in (x, act, bias)]
    expected = sparse.estimator(cast[0], cast[1], half, cast[2], backend=backend)
    assert torch.equal(y, expected)
    for got, want, leaf in zip(grads, torch.autograd.grad(expected, [*cast, half.values], dy),
                               [*leaves, sw.values], strict=True):
        assert got.dtype == leaf.dtype == torch.float32
        assert torch.equal(got, want.float())


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_mixes_a_linear_output_with_float32_and_backward_in_the_region(backend):
    x, act, sw, _ = autocast_inputs(1)
    linear = torch.nn.Linear(x.shape[1], x.shape[1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = linear(x)
        assert h.dtype == torch.bfloat16 and act.dtype == torch.float32
        y = sparse.estimator(h, act, sw, backend=backend)
        y.float().square().sum().backward()  # the backward inside the region too
    assert y.dtype == torch.bfloat16
    assert linear.weight.grad.dtype == sw.values.grad.dtype == torch.float32
    assert bool(sw.values.grad.isfinite().all()) and bool(sw.values.grad.ne(0).any())


def test_autocast_leaves_float64_alone_and_casts_at_the_ops_key():
    x, act, sw, bias = autocast_inputs(2)
    wide = copy.deepcopy(sw).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert sparse.estimator(x.double(), act.double(), wide).dtype == torch.float64
        # the custom op itself, not through `estimator`: its Autocast<CPU> kernel casts
        y, _ = torch.ops.glai.sparse_estimator(x, act, sw.values, list(sw.index), bias, "cpp",
                                               False)
    assert y.dtype == torch.bfloat16
    half = copy.deepcopy(sw).to(torch.bfloat16)
    expected = sparse.estimator(x.bfloat16(), act.bfloat16(), half, bias.bfloat16(),
                                backend="cpp")
    assert torch.equal(y, expected)


def test_a_sparse_head_under_autocast():
    mlp = random_mlp((9, 13, 4), seed=0, dtype=torch.float32)
    omega = torch.randn(64, 9, generator=torch.Generator().manual_seed(1))
    head = prune(from_mlp(mlp), omega, mu=0.2, layout="sparse").head
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = head(omega[:8])
        F.cross_entropy(y.float(), torch.arange(8) % 4).backward()
    assert y.dtype == torch.bfloat16
    assert head.sparse_weight.values.grad.dtype == torch.float32
    assert head.backend_used.startswith("sparse:")


# ---- meta tensors --------------------------------------------------------------------------


def test_from_dense_refuses_a_meta_mask_and_empty_builds_on_meta():
    w = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="from_dense: mask is on the meta device"):
        from_dense(w.to("meta"), (w > 0).to("meta"))
    empty = SparsePathWeight.empty((2, 3, 4), device="meta")
    assert empty.device.type == "meta" and empty.nnz == 0 and empty.shape == (2, 3, 4)


@pytest.mark.parametrize("backend", [None, "cpp", "torch"], ids=["auto", "cpp", "torch"])
def test_the_estimator_on_meta_gives_shapes(backend):
    x, act, sw, bias = autocast_inputs(3)
    meta = copy.deepcopy(sw).to("meta")
    xs, acts = x.to("meta").requires_grad_(), act.to("meta").requires_grad_()
    y = sparse.estimator(xs, acts, meta, bias.to("meta"), backend=backend)
    assert y.device.type == "meta" and y.shape == (x.shape[0], sw.shape[0])
    y.sum().backward()
    assert xs.grad.shape == x.shape and acts.grad.shape == act.shape
    assert meta.values.grad.shape == sw.values.shape


def test_the_estimator_refuses_meta_mixed_with_real_tensors_naming_the_argument():
    x, act, sw, _ = autocast_inputs(4)
    with pytest.raises(ValueError, match=r"sw\.values must be on the same device as x \(meta\)"):
        sparse.estimator(x.to("meta"), act.to("meta"), sw)
    with pytest.raises(ValueError, match=r"sw\.values must be on the same device as x \(cpu\)"):
        sparse.estimator(x, act, copy.deepcopy(sw).to("meta"))


def test_a_sparse_head_moved_to_meta_runs_and_prune_refuses_meta():
    mlp = random_mlp((9, 13, 4), seed=0, dtype=torch.float32)
    omega = torch.randn(64, 9, generator=torch.Generator().manual_seed(1))
    head = prune(from_mlp(mlp), omega, mu=0.2, layout="sparse").head.to("meta")
    assert head.layout == "sparse" and head.device.type == "meta"
    y = head(omega[:8].to("meta"))
    assert y.device.type == "meta" and y.shape == (8, 4)
    y.sum().backward()
    assert head.sparse_weight.values.grad.shape == head.sparse_weight.values.shape
    built = GLAIHead(head.selector, SparsePathWeight.empty(head.weight_shape, device="meta"),
                     torch.zeros(4, device="meta"))  # built on meta: K = 0 needs no values
    assert built(omega[:8].to("meta")).shape == (8, 4)
    assert built.backend_used == "sparse:auto"
    with pytest.raises(ValueError, match="prune: head is on the meta device"):
        prune(head, omega.to("meta"), mu=0.5)
    with pytest.raises(ValueError, match="prune: reference is on the meta device"):
        prune(from_mlp(mlp), omega.to("meta"), mu=0.5)
    with pytest.raises(ValueError, match="prune: head is on the meta device"):
        prune(from_mlp(mlp).to("meta"), omega, mu=0.5)


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")  # torch's own
def test_a_meta_weight_loads_a_real_state_dict_checking_its_index():
    sw = weight(seed=5)
    meta = SparsePathWeight.empty(sw.shape, device="meta")
    meta.load_state_dict(sw.state_dict())
    assert meta.nnz == sw.nnz and meta.values.is_meta
    state = sw.state_dict()
    state["inputs"] = state["inputs"].clone().fill_(sw.shape[1])  # out of range
    with pytest.raises(ValueError, match=r"load_state_dict: index\.inputs out of range"):
        SparsePathWeight.empty(sw.shape, device="meta").load_state_dict(state)
