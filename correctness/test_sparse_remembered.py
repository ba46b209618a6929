"""An eager call on a SparsePathWeight remembers that its checks passed (glai_kernels/sparse/
op.py, `_remember` / `_remembered_call`): the next call with the same unedited index and
inputs of the same kind skips `check_inputs`' Python; anything else takes the full path.
What it found is kept on the index's entry in sparse/checked.py's memory, under that
memory's one key, so an edit that makes the index's contents be checked again also drops it.

- the remembered call gives the full path's y and gradients bit for bit, and `check_inputs`
  does not run for it (it did before: this test fails on the code before stop 46);
- an index buffer edited in place, replaced by `.data =` (no version bump) or by a new tensor
  is checked again, and a corrupt one is refused with the full path's error;
- inputs that differ from the remembered call's (dtype, sizes, bias, an empty batch, no
  gradient, autocast) take the full path and its errors or results;
- the memory does not keep a SparsePathWeight alive, and never holds an index of inference
  tensors (no version counter);
- an in-place edit of an index buffer invalidates both uses of the one memory: the eager
  call's record and the index's checked contents.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from sparse_checker import sparse_problem

import glai_kernels.sparse as sparse
from glai_kernels.sparse import SPARSE_ESTIMATOR, checked
from glai_kernels.sparse import contract as sparse_contract
from glai_kernels.sparse import op as sparse_op
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.weight import SparsePathWeight

pytestmark = pytest.mark.skipif(
    SPARSE_ESTIMATOR.get("cpp").unsupported_reason("cpu", torch.float32) is not None,
    reason="the sparse cpp backend is unavailable here")

SHAPE = (11, 23, 17, 5)  # B, I, P, O: awkward sizes


def _setup(dtype=torch.float32, seed=3):
    x, act, values, index, dy = sparse_problem(*SHAPE, mu=0.35, dtype=dtype, seed=seed)
    sw = SparsePathWeight(values.clone(), KeptIndex(*index))
    bias = torch.randn(SHAPE[3], generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x, act, sw, bias.requires_grad_(), dy


def _call_record(sw: SparsePathWeight) -> object | None:
    """What the memory keeps of the last eager call with sw's own index, else None."""
    index = sw.index
    return checked.recall_call(checked.key_of(index, sw.device, sw.nnz), index)


def _counting(monkeypatch, module, name: str) -> list[int]:
    """[how many times module.name ran] from now on, the function itself still run."""
    calls = [0]
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture
def counted(monkeypatch):
    """How many times the sparse op's `check_inputs` ran."""
    return _counting(monkeypatch, sparse_op, "check_inputs")


def _run(x, act, sw, bias, dy, backend="cpp"):
    y = sparse.estimator(x, act, sw, bias, backend=backend)
    leaves = [t for t in (act, sw.values, bias) if t.requires_grad]
    return [y, *torch.autograd.grad(y, leaves, dy)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("act_grad", [False, True], ids=["values", "values+act"])
def test_remembered_call_is_the_checked_call(counted, dtype, act_grad):
    x, act, sw, bias, dy = _setup(dtype)
    act.requires_grad_(act_grad)
    first = _run(x, act, sw, bias, dy)
    assert counted[0] == 1
    second = _run(x.clone(), act, sw, bias, dy)  # another x of the same kind
    assert counted[0] == 1, "the second call checked its inputs again"
    assert second[0].grad_fn.name() == "glai::SparseEstimatorBackward"
    for a, b in zip(first, second, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_remembered_without_gradients_and_with_resolution(counted):
    """No gradient asked: the full path's direct forward, bit for bit; `run_resolved` without
    a backend resolves; an unknown backend is refused as on the full path."""
    x, act, sw, bias, _ = _setup()
    with torch.no_grad():
        expected = sparse.estimator(x, act, sw, bias, backend="cpp")  # checked: direct
        y = sparse.estimator(x, act, sw, bias, backend="cpp")  # remembered
    assert y.grad_fn is None and torch.equal(y, expected) and counted[0] == 1
    y = sparse_op.run_resolved(x, act, sw, bias, None, "cpp")
    assert torch.equal(y, expected) and counted[0] == 1
    assert y.grad_fn.name() == "glai::SparseEstimatorBackward"
    with pytest.raises(ValueError, match="unknown sparse_estimator backend 'nope'"):
        sparse.estimator(x, act, sw, bias, backend="nope")
    with pytest.raises(ValueError, match="x must be 2-d"):  # the checks' error comes first
        sparse.estimator(x[0], act, sw, bias, backend="nope")


@pytest.mark.parametrize("edit", ["in place", ".data", "new buffer"])
def test_an_edited_index_is_checked_again(counted, edit):
    x, act, sw, bias, dy = _setup()
    _run(x, act, sw, bias, dy)
    inputs = sw.inputs
    if edit == "in place":
        with torch.no_grad():
            inputs[0] = SHAPE[1] + 5  # out of range
    elif edit == ".data":  # no version bump: the data pointer and shape see it
        inputs.data = torch.full_like(inputs, SHAPE[1] + 5)
    else:
        sw.inputs = torch.full_like(inputs, SHAPE[1] + 5)
    with pytest.raises(ValueError, match="inputs"):
        sparse.estimator(x, act, sw, bias, backend="cpp")
    assert counted[0] == 2


def test_an_unchanged_copy_is_checked_once_more(counted):
    x, act, sw, bias, dy = _setup()
    expected = _run(x, act, sw, bias, dy)
    sw.inputs = sw.inputs.clone()  # the same contents, another tensor
    for a, b in zip(expected, _run(x, act, sw, bias, dy), strict=True):
        assert torch.equal(a, b)
    _run(x, act, sw, bias, dy)
    assert counted[0] == 2


@pytest.mark.parametrize("case", ["dtype", "x width", "act rows", "act width", "bias size",
                                  "bias dtype"])
def test_other_inputs_take_the_full_path_and_its_errors(case):
    x, act, sw, bias, dy = _setup()
    _run(x, act, sw, bias, dy)
    bad = {"dtype": lambda: (x.double(), act, bias),
           "x width": lambda: (x[:, 1:], act, bias),
           "act rows": lambda: (x, act[1:], bias),
           "act width": lambda: (x, act[:, 1:], bias),
           "bias size": lambda: (x, act, bias[1:]),
           "bias dtype": lambda: (x, act, bias.double())}[case]()
    checked.clear()
    with pytest.raises((ValueError, TypeError)) as without:
        sparse.estimator(bad[0], bad[1], sw, bad[2], backend="cpp")
    _run(x, act, sw, bias, dy)
    with pytest.raises(type(without.value)) as remembered:
        sparse.estimator(bad[0], bad[1], sw, bad[2], backend="cpp")
    assert str(remembered.value) == str(without.value)


def test_empty_batch_and_autocast_take_the_full_path():
    x, act, sw, bias, dy = _setup()
    _run(x, act, sw, bias, dy)
    y = sparse.estimator(x[:0], act[:0], sw, bias, backend="cpp")
    assert y.shape == (0, SHAPE[3]) and y.grad_fn.name() != "glai::SparseEstimatorBackward"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = sparse.estimator(x, act, sw, bias, backend="cpp")
    assert y.dtype == torch.bfloat16


def test_the_memory_keeps_no_weight_alive():
    x, act, sw, bias, dy = _setup()
    _run(x, act, sw, bias, dy)
    key = checked.key_of(sw.index, sw.device, sw.nnz)
    assert key in checked._MEMORY and _call_record(sw) is not None
    alive = weakref.ref(sw)
    del sw
    gc.collect()
    assert alive() is None
    assert key not in checked._MEMORY


def test_an_index_of_inference_tensors_is_never_remembered(counted):
    """Inference tensors keep no version counter (sparse/checked.py): checked on every call."""
    x, act, sw, _, _ = _setup()
    with torch.inference_mode():
        index = [t.clone() for t in sw.index]
    sw = SparsePathWeight(sw.values.detach(), KeptIndex(*index))
    expected = sparse.estimator(x, act, sw, backend="cpp")
    assert torch.equal(sparse.estimator(x, act, sw, backend="cpp"), expected)
    assert _call_record(sw) is None and counted[0] == 2
    assert not any(ref() is t for entry in checked._MEMORY.values() for ref in entry.refs
                   for t in index)


def test_an_in_place_edit_invalidates_both_uses_through_one_key(counted, monkeypatch):
    """The eager call's record and the index's checked contents live on one entry of one
    memory (sparse/checked.py), under one key: an in-place edit that leaves the contents valid
    (the version counter moves) makes the next call check its inputs and the index's contents
    again, and remember both anew under the new key."""
    contents = _counting(monkeypatch, sparse_contract, "check_contents")
    x, act, sw, bias, dy = _setup()
    expected = _run(x, act, sw, bias, dy)
    _run(x, act, sw, bias, dy)
    assert (counted[0], contents[0]) == (1, 0)  # the index was checked when sw was built
    before = checked.key_of(sw.index, sw.device, sw.nnz)
    assert checked.recall(before, sw.index) is not None and _call_record(sw) is not None
    with torch.no_grad():
        sw.inputs[0] = sw.inputs[0].clone()  # the same value: only the version moves
    after = checked.key_of(sw.index, sw.device, sw.nnz)
    assert after != before
    assert checked.recall(after, sw.index) is None and _call_record(sw) is None
    for a, b in zip(expected, _run(x, act, sw, bias, dy), strict=True):
        assert torch.equal(a, b)
    assert (counted[0], contents[0]) == (2, 1)
    assert checked.recall(after, sw.index) is not None and _call_record(sw) is not None
    _run(x, act, sw, bias, dy)
    assert (counted[0], contents[0]) == (2, 1)
