"""A kept-path index is checked where it enters (issue 40, items 1 and 2).

`SparsePathWeight(values, index)` and `load_state_dict` refuse an index that breaks any
invariant of layout.py, naming the field, before a kernel sees it; a direct call of the custom
op with a corrupt index raises instead of reading out of bounds (it killed the process with
SIGSEGV on the torch and triton backends); `from_entries` sorts sizes whose O·I·P passes
2^63 correctly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from glai_kernels.sparse import KeptIndex, SparsePathWeight, estimator, from_dense, from_entries

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (4, 5, 3)


def _weight(seed: int = 0) -> SparsePathWeight:
    """A (4, 5, 3) weight with an output, an input and a path kept nowhere."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(SHAPE, generator=gen) < 0.6
    mask[2] = False
    mask[:, 3] = False
    mask[:, :, 1] = False
    return from_dense(torch.randn(SHAPE, generator=gen), mask)


def _corrupt(index: KeptIndex, field: str, position: int, value: int) -> KeptIndex:
    fields = {name: t.clone() for name, t in index._asdict().items()}
    fields[field][position] = value
    return KeptIndex(**fields)


# (field changed, position, new value, the field the error names): out of range first,
# then in range but inconsistent (each of these gave a wrong y silently on torch and triton)
CORRUPTIONS = [
    ("inputs", 0, 10**6, "index.inputs"),
    ("inputs", -1, -1, "index.inputs"),
    ("group_ptr", 1, 10**6, "index.group_ptr"),
    ("group_outputs", 0, 4, "index.group_outputs"),
    ("group_paths", 0, -5, "index.group_paths"),
    ("output_ptr", 2, 10**6, "index.output_ptr"),
    ("input_ptr", -1, 0, "index.input_ptr"),
    ("input_entries", 0, 10**6, "index.input_entries"),
    ("entry_groups", 0, -1, "index.entry_groups"),
    ("path_ptr", 0, 1, "index.path_ptr"),
    ("path_groups", 0, 10**6, "index.path_groups"),
    ("output_ptr", 1, 0, "index.output_ptr"),      # output 0's groups moved to output 1
    ("inputs", 2, 3, "index.input_ptr"),           # an entry's input changed, counts stale
    ("entry_groups", 0, 1, "index.entry_groups"),
    ("input_entries", 0, 1, "index.input_entries"),
    ("path_groups", 0, 1, "index.path_groups"),
    ("group_paths", 0, 1, "index.path_ptr"),
    ("group_ptr", 1, 0, "index.group_ptr"),         # an empty group
]


@pytest.mark.parametrize(("field", "position", "value", "named"), CORRUPTIONS,
                         ids=[f"{c[0]}[{c[1]}]={c[2]}" for c in CORRUPTIONS])
def test_construction_refuses_a_corrupt_index_naming_the_field(field, position, value, named):
    sw = _weight()
    bad = _corrupt(sw.index, field, position, value)
    with pytest.raises(ValueError, match=rf"SparsePathWeight: {named}\b"):
        SparsePathWeight(sw.values.detach(), bad)


def test_unsorted_groups_and_inputs_are_refused():
    """An index whose derived tensors agree with its entries but whose entries are out of
    (o, s, i) order: a kernel's per-output ranges assume the order."""
    sw = _weight()
    index = sw.index
    swapped = {name: t.clone() for name, t in index._asdict().items()}
    for name in ("group_outputs", "group_paths"):  # groups 0 and 1's (o, s) swapped
        swapped[name][[0, 1]] = getattr(index, name)[[1, 0]]
    with pytest.raises(ValueError, match=r"index.group_outputs and group_paths .* order"):
        SparsePathWeight(sw.values.detach(), KeptIndex(**swapped))
    first = int(index.group_ptr[0]), int(index.group_ptr[1])
    assert first[1] - first[0] >= 2, "the test needs a group of two entries"
    reversed_inputs = {name: t.clone() for name, t in index._asdict().items()}
    reversed_inputs["inputs"][first[0]:first[1]] = index.inputs[first[0]:first[1]].flip(0)
    with pytest.raises(ValueError, match=r"index.inputs must increase within each group"):
        SparsePathWeight(sw.values.detach(), KeptIndex(**reversed_inputs))


def test_a_wrong_length_is_refused_naming_the_field():
    sw = _weight()
    fields = sw.index._asdict()
    fields["path_groups"] = fields["path_groups"][:-1]
    with pytest.raises(ValueError, match=r"index.path_groups must have"):
        SparsePathWeight(sw.values.detach(), KeptIndex(**fields))


@pytest.mark.parametrize(("field", "position", "value", "named"),
                         CORRUPTIONS[:3] + CORRUPTIONS[11:13],
                         ids=["inputs-high", "inputs-low", "group_ptr", "output_ptr", "inputs"])
def test_loading_refuses_a_corrupt_index_and_keeps_the_module(field, position, value, named):
    sw = _weight()
    before = {name: t.clone() for name, t in sw.state_dict().items()}
    state = dict(before)
    state[field] = _corrupt(sw.index, field, position, value)._asdict()[field]
    with pytest.raises(ValueError, match=rf"load_state_dict: {named}\b"):
        sw.load_state_dict(state)
    for name, t in sw.state_dict().items():
        assert torch.equal(t, before[name]), name


def test_loading_refuses_a_corrupt_index_of_another_size():
    """A state dict of another K resizes the module; its index is checked before that."""
    sw, other = _weight(0), _weight(1)
    assert other.nnz != sw.nnz
    state = dict(other.state_dict())
    state["inputs"] = state["inputs"].clone()
    state["inputs"][0] = 99
    with pytest.raises(ValueError, match=r"load_state_dict: index.inputs out of range"):
        sw.load_state_dict(state)
    assert sw.nnz == sw.inputs.numel() != other.nnz
    sw.load_state_dict(other.state_dict())  # the valid one loads
    assert torch.equal(sw.to_dense(), other.to_dense())


@pytest.mark.parametrize("edit", ["replaced", "in place"])
def test_a_buffer_changed_after_construction_is_checked_at_the_next_call(edit):
    """`checked_index_sizes` remembers the checks per tensor object and version: a replaced
    buffer is a new object, an edited one has a new version; either is checked (contents
    too) before any backend runs."""
    sw = _weight()
    x, act = torch.randn(2, SHAPE[1]), torch.randn(2, SHAPE[2])
    estimator(x, act, sw, backend="torch")
    if edit == "replaced":
        sw.inputs = sw.inputs.clone()
    with torch.no_grad():
        sw.inputs[0] = 10**6
    with pytest.raises(ValueError, match=r"index.inputs out of range"):
        estimator(x, act, sw, backend="torch")


_DIRECT_CALL = textwrap.dedent("""
    import json, sys, torch
    import glai_kernels.sparse as sparse
    from glai_kernels.sparse import SPARSE_ESTIMATOR, KeptIndex, from_dense
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 5, 3, generator=gen) < 0.6
    sw = from_dense(torch.randn(4, 5, 3, generator=gen), mask)
    x, act = torch.randn(2, 5), torch.randn(2, 3)
    results = {}
    for name in sys.argv[1:]:
        if SPARSE_ESTIMATOR.get(name).unsupported_reason("cpu", torch.float32) is not None:
            continue
        for field, position, value in (("inputs", 0, 10**6), ("output_ptr", 1, 10**6),
                                       ("path_groups", 0, -3), ("group_ptr", 1, -7)):
            index = [t.clone() for t in sw.index]
            index[KeptIndex._fields.index(field)][position] = value
            try:
                torch.ops.glai.sparse_estimator(x, act, sw.values.detach(), index, None,
                                                name, False)
                outcome = "returned"
            except (ValueError, RuntimeError) as e:
                outcome = f"{type(e).__name__}: {e}"
            results[f"{name} {field}"] = outcome
            print(json.dumps({f"{name} {field}": outcome}), flush=True)
""")


def test_a_direct_op_call_with_a_corrupt_index_raises_on_every_backend():
    """torch.ops.glai.sparse_estimator checks the index's bounds itself (nobody validated a
    list of tensors): a ValueError naming the field, never a crash. Run in a subprocess so
    that a crash fails this test instead of killing pytest."""
    from glai_kernels.sparse import SPARSE_ESTIMATOR

    names = [n for n in SPARSE_ESTIMATOR.names() if "cpu" in SPARSE_ESTIMATOR.get(n).devices
             and SPARSE_ESTIMATOR.get(n).unsupported_reason("cpu", torch.float32) is None]
    assert "torch" in names
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", _DIRECT_CALL, *names], capture_output=True,
                         text=True, env=env, timeout=600, cwd=ROOT)
    results = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            results.update(json.loads(line))
    assert run.returncode == 0, (f"the direct calls ended with status {run.returncode} after "
                                 f"{results}: {run.stderr[-2000:]}")
    assert {key.split()[0] for key in results} == set(names)
    for key, outcome in results.items():
        field = key.split()[1]
        assert outcome.startswith("ValueError") and f"index.{field}" in outcome, (key, outcome)


def test_from_entries_sorts_sizes_whose_product_passes_int64():
    """O·I·P = (2^21 + 1)^3 > 2^63: each size passes the int32 check, but a flat key
    (o·P + s)·I + i wraps past int64 and put output 2^21's entry before output 0's, so the
    kernels summed it into the wrong output."""
    side = 2**21 + 1
    shape = (side, side, side)
    outputs = torch.tensor([side - 1, 0, 0, side - 1])
    inputs = torch.tensor([0, 7, side - 1, 3])
    paths = torch.tensor([side - 1, 2, 2, 0])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sw = from_entries(outputs, inputs, paths, values, shape)
    o, i, s = sw.entries()
    assert o.tolist() == [0, 0, side - 1, side - 1]
    assert s.tolist() == [2, 2, 0, side - 1]
    assert i.tolist() == [7, side - 1, 3, 0]
    assert sw.values.tolist() == [2.0, 3.0, 4.0, 1.0]
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(1, side)
    act = torch.zeros(1, side)
    x[0, [0, 3, 7, side - 1]] = torch.randn(4, generator=gen)
    act[0, [0, 2, side - 1]] = torch.randn(3, generator=gen)
    xd, ad = x.double()[0], act.double()[0]
    exact = torch.stack([2 * xd[7] * ad[2] + 3 * xd[side - 1] * ad[2],
                         1 * xd[0] * ad[side - 1] + 4 * xd[3] * ad[0]])[None]
    for backend in ("torch", "cpp"):
        y = estimator(x, act, sw, backend=backend)
        torch.testing.assert_close(y.double()[:, [0, side - 1]], exact)
        assert int(y.count_nonzero()) == 2


# ---- direct calls: the full check, once per index (issue 40's last gaps, stop 45) ----------
# A direct call of the custom op with an index nobody validated got only the bounds check, so
# an in-range but inconsistent index gave a wrong y silently on torch and triton. Now every
# call checks the contents in full, and remembers an index that passed by its tensors'
# identities, versions and storage (glai_kernels/sparse/checked.py).

INCONSISTENT = CORRUPTIONS[11:]  # in range: only the full check sees them


def _direct(sw: SparsePathWeight, index, backend: str = "torch") -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    x, act = torch.randn(3, SHAPE[1], generator=gen), torch.randn(3, SHAPE[2], generator=gen)
    return torch.ops.glai.sparse_estimator(x, act, sw.values.detach(), list(index), None,
                                           backend, False)[0]


@pytest.fixture
def check_calls(monkeypatch) -> dict[str, int]:
    """Counts of the index checks that read the tensors (full and bounds-only), wherever a
    module calls them from."""
    from glai_kernels.sparse import checked, contract, layout

    checked.clear()
    counts = {"check_contents": 0, "check_bounds": 0}
    for name in counts:
        original = getattr(layout, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(layout, name, counting)
        if hasattr(contract, name):
            monkeypatch.setattr(contract, name, counting)
    return counts


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("field", "position", "value", "named"), INCONSISTENT,
                         ids=[f"{c[0]}[{c[1]}]={c[2]}" for c in INCONSISTENT])
def test_a_direct_call_refuses_an_inconsistent_index(backend, field, position, value, named):
    """Each of these gave a wrong y silently on `torch` and `triton` (cpp's own check
    raised a RuntimeError without naming a field)."""
    from glai_kernels.sparse import SPARSE_ESTIMATOR

    if SPARSE_ESTIMATOR.get(backend).unsupported_reason("cpu", torch.float32) is not None:
        pytest.skip(f"{backend} cannot run here")
    sw = _weight()
    with pytest.raises(ValueError, match=rf"sparse estimator: {named}\b"):
        _direct(sw, _corrupt(sw.index, field, position, value), backend)


def test_a_direct_call_refuses_unsorted_groups():
    sw = _weight()
    swapped = {name: t.clone() for name, t in sw.index._asdict().items()}
    for name in ("group_outputs", "group_paths"):
        swapped[name][[0, 1]] = getattr(sw.index, name)[[1, 0]]
    with pytest.raises(ValueError, match=r"index.group_outputs and group_paths .* order"):
        _direct(sw, KeptIndex(**swapped))


def test_the_backward_op_checks_its_index_too():
    sw = _weight()
    bad = _corrupt(sw.index, "path_groups", 0, 1)
    x, act = torch.randn(2, SHAPE[1]), torch.randn(2, SHAPE[2])
    dy = torch.randn(2, SHAPE[0])
    with pytest.raises(ValueError, match=r"index.path_groups\b"):
        torch.ops.glai.sparse_estimator_backward(dy, x, act, sw.values.detach(), list(bad),
                                                 x.new_empty(0), [True, True, True], "torch")


def test_a_foreign_index_is_checked_once_then_remembered(check_calls):
    sw = _weight()
    foreign = [t.clone() for t in sw.index]
    y = _direct(sw, foreign)
    assert check_calls["check_contents"] == 1
    for _ in range(3):
        torch.testing.assert_close(_direct(sw, foreign), y, rtol=0, atol=0)
    assert check_calls["check_contents"] == 1
    _direct(sw, [t.clone() for t in foreign])  # equal values, other tensors: checked
    assert check_calls["check_contents"] == 2


def test_a_weights_own_index_is_never_checked_again(check_calls):
    """SparsePathWeight validated its index when it was built: neither `estimator` on it nor
    a custom op call with its index (direct, under autocast, under a transform) checks it
    again, not even its bounds (≈ 50 µs at A1 on every such call before)."""
    sw = _weight()
    check_calls.update(check_contents=0, check_bounds=0)  # construction's own check
    gen = torch.Generator().manual_seed(4)
    x, act = torch.randn(3, SHAPE[1], generator=gen), torch.randn(3, SHAPE[2], generator=gen)
    _direct(sw, sw.index)
    estimator(x, act, sw, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        estimator(x, act, sw, backend="torch")
    torch.func.grad(lambda a: estimator(x, a, sw, backend="torch").sum())(act)
    y = estimator(x, act.requires_grad_(), sw, backend="torch")
    torch.autograd.grad(y.sum(), act)
    assert check_calls == {"check_contents": 0, "check_bounds": 0}


@pytest.mark.parametrize(("field", "position", "value", "named"),
                         [CORRUPTIONS[0], *INCONSISTENT],
                         ids=[f"{c[0]}[{c[1]}]={c[2]}" for c in [CORRUPTIONS[0], *INCONSISTENT]])
def test_an_index_edited_in_place_after_a_good_call_is_refused(field, position, value, named):
    """The memory keys on the tensors' version counters: an in-place edit after a call that
    passed makes the next call check the index again, and refuse it naming the field."""
    sw = _weight()
    foreign = KeptIndex(*(t.clone() for t in sw.index))
    _direct(sw, foreign)
    getattr(foreign, field)[position] = value
    with pytest.raises(ValueError, match=rf"sparse estimator: {named}\b"):
        _direct(sw, foreign)


def test_a_buffer_given_new_storage_through_data_is_checked_again():
    """`t.data = other` keeps the tensor object and its version counter: the storage's address
    in the key sees it (it was a stale hit, and a wrong y, on `estimator`)."""
    sw = _weight()
    x, act = torch.randn(2, SHAPE[1]), torch.randn(2, SHAPE[2])
    estimator(x, act, sw, backend="torch")
    version = sw.output_ptr._version
    sw.output_ptr.data = _corrupt(sw.index, "output_ptr", 1, 0).output_ptr
    assert sw.output_ptr._version == version  # what a version-only key would miss
    with pytest.raises(ValueError, match=r"index.output_ptr\b"):
        estimator(x, act, sw, backend="torch")
    with pytest.raises(ValueError, match=r"index.output_ptr\b"):
        _direct(sw, sw.index)


def test_the_memory_keeps_no_index_alive():
    """An entry holds weak references: freeing the index frees its entry, so no id a later
    tensor reuses can match it."""
    import gc
    import weakref

    from glai_kernels.sparse import checked

    checked.clear()
    sw = _weight()
    assert len(checked._MEMORY) == 1  # the weight's own index, recorded when built
    foreign = [t.clone() for t in sw.index]
    _direct(sw, foreign)
    assert len(checked._MEMORY) == 2
    alive = weakref.ref(foreign[0])
    del foreign
    gc.collect()
    assert alive() is None
    assert len(checked._MEMORY) == 1
    del sw
    gc.collect()
    assert not checked._MEMORY


def test_inference_tensors_are_checked_on_every_call(check_calls):
    """They keep no version counter, so an in-place edit could not be seen: never remembered."""
    sw = _weight()
    with torch.inference_mode():
        foreign = [t.clone() for t in sw.index]
        _direct(sw, foreign)
        _direct(sw, foreign)
    assert check_calls["check_contents"] == 2


def test_compiled_code_checks_an_index_edited_in_place_at_its_next_call():
    """torch.compile traces with fake tensors (no check reads them); the compiled code runs
    the custom op on the real tensors, whose check sees the edit."""
    sw = _weight()
    x, act = torch.randn(3, SHAPE[1]), torch.randn(3, SHAPE[2])

    def f(x, act):
        return estimator(x, act, sw, backend="torch")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, act), f(x, act))
    with torch.no_grad():
        sw.output_ptr[1] = 0
    with pytest.raises(ValueError, match=r"index.output_ptr\b"):
        compiled(x, act)


def test_the_fast_check_agrees_with_the_rebuild():
    """`check_contents` tests each statement as it stands and rebuilds the index only to
    name a fault: on valid indices and on one, two or three entries changed at random (in
    bounds), the quick verdict and the rebuild's (`_first_fault`) must agree."""
    from fuzz import corrupt

    from glai_kernels.sparse import layout

    gen = torch.Generator().manual_seed(11)
    agreed = {True: 0, False: 0}
    for trial in range(600):
        shape = tuple(int(d) for d in torch.randint(1, 7, (3,), generator=gen))
        mask = torch.rand(shape, generator=gen) < float(torch.rand((), generator=gen))
        index = layout.build_index(mask)
        if not index.nnz:
            continue
        for change in range(trial % 4):  # 0 to 3 entries changed
            index = corrupt(index, trial * 7 + change)[0]
        try:
            layout.check_bounds(index)
        except ValueError:
            continue
        consistent = layout._consistent(index)
        assert consistent == (layout._first_fault(index) == "the index is inconsistent"), (
            trial, index)
        agreed[consistent] += 1
    assert min(agreed.values()) >= 40, agreed  # both verdicts were reached often
