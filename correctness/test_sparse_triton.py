"""What only the sparse triton backend has: its block sizes (batch blocks and entry blocks,
forced small so the interpreter walks every edge with small shapes), the saved group sums
Zg [G, B], run-to-run determinism, and where it says it can run.

The rest (every dtype, case, gradient subset, gradcheck, opcheck, compile) runs it through
the sparse registry in test_sparse.py like any other sparse backend.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sparse_checker import Case, check_sparse, kept_mask

from glai_kernels.registry import Backend
from glai_kernels.sparse import SPARSE_ESTIMATOR, from_dense
from glai_kernels.sparse import reference as sparse_reference
from glai_kernels.sparse.registry import groups_by_batch
from reference import make_inputs, tolerance
from reference.tolerance import worst_error

sparse_triton = pytest.importorskip("glai_kernels.sparse.backends.triton")
SparseConfig = sparse_triton.SparseConfig

DEVICE = next((d for d in ("cuda", "cpu")
               if SPARSE_ESTIMATOR.get("triton").unsupported_reason(d) is None), None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="the sparse triton backend cannot run "
                                f"here: {SPARSE_ESTIMATOR.get('triton').unsupported_reason('cpu')}")

# 4 batch rows and 2 entries per step: B = 3, 4, 5 sit on either side of a batch block, and
# almost every group (and every input's and path's list) takes several entry steps.
SMALL = SparseConfig(block_b=4, block_e=2)
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def forced(config: SparseConfig):
    """The name of a temporary sparse backend: the triton launchers with `config`."""
    name = "triton-sparse-forced"
    SPARSE_ESTIMATOR.register(Backend(
        name=name,
        forward=functools.partial(sparse_triton.triton_forward, config=config),
        forward_saving=functools.partial(sparse_triton.triton_forward_saving, config=config),
        backward=functools.partial(sparse_triton.triton_backward, config=config),
        saved_shape=groups_by_batch,
        devices=("cpu", "cuda"),
        description="the sparse triton backend with forced blocks (tests)",
    ))
    try:
        yield name
    finally:
        SPARSE_ESTIMATOR.unregister(name)


EDGES = {
    "B3": Case((3, 6, 4, 5), mu=0.5),
    "B4": Case((4, 6, 4, 5), mu=0.5),
    "B5": Case((5, 6, 4, 5), mu=0.5),
    # P = 1: one group per output holding all its kept inputs, 9 entries = 5 steps of 2
    "long-groups": Case((5, 9, 1, 3), mu=1.0),
    "K1": Case((5, 3, 2, 4), keep=1),
    "empty-output": Case((6, 5, 3, 4), mu=0.6, empty_output=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", EDGES.values(), ids=EDGES.keys())
def test_small_blocks_match_dense_oracle(case, dtype):
    with forced(SMALL) as name:
        failures = check_sparse(name, DEVICE, case, dtype=dtype, seed=sum(case.shape))
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["f64", "f16"])
def test_small_blocks_other_dtypes(dtype):
    with forced(SMALL) as name:
        failures = check_sparse(name, DEVICE, Case((5, 7, 3, 4), mu=0.4), dtype=dtype, seed=4,
                                gates="soft")
    assert not failures, "; ".join(failures)


def test_k0_never_reaches_the_kernels():
    """K = 0 is answered by the op with zeros (registry.py); the forced backend agrees."""
    with forced(SMALL) as name:
        assert not check_sparse(name, DEVICE, Case((5, 4, 3, 2), keep=0))


def _layout(shape, case: Case, dtype, seed):
    batch, inputs, paths, outputs = shape
    data = make_inputs(batch, inputs, paths, outputs, dtype=dtype, device=DEVICE, seed=seed,
                       gates="soft", bias=False)
    mask = kept_mask((outputs, inputs, paths), case, seed).to(DEVICE)
    sw = from_dense(data.weight, mask)
    return data.x, data.act, sw.values.detach(), sw.index


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_saved_group_sums_are_zg_in_the_accumulation_dtype(dtype):
    """forward_saving's Zg is [G, B], float32 for half inputs, equal to the layout's group
    sums (the float64 reference over the layout), and the backward reads it."""
    shape = (5, 9, 3, 4)
    x, act, values, index = _layout(shape, Case(shape, mu=0.5), dtype, seed=7)
    y, zg = sparse_triton.triton_forward_saving(x, act, values, index, config=SMALL)
    assert zg.shape == (index.groups, shape[0]) and zg.dtype == torch.float32
    expected = sparse_reference.group_sums64(x, values, index).t()
    scale = sparse_reference.group_sums64(x.abs(), values.abs(), index).t()
    # Zg is never rounded to the inputs' dtype: float32's tolerance holds for half inputs
    assert worst_error(zg, expected, scale) <= tolerance(torch.float32)
    assert torch.equal(y, sparse_triton.triton_forward(x, act, values, index, config=SMALL))
    dy = torch.randn(shape[0], shape[3], generator=torch.Generator().manual_seed(8))
    dy = dy.to(DEVICE, dtype)
    needs = (False, True, False)
    _, from_saved, _ = sparse_triton.triton_backward(dy, x, act, values, index, needs, zg,
                                                     config=SMALL)
    _, recomputed, _ = sparse_triton.triton_backward(dy, x, act, values, index, needs,
                                                     config=SMALL)
    expected_dact = sparse_reference.backward64(dy, x, act, values, index)[1]
    scale_dact = sparse_reference.backward64(dy.abs(), x.abs(), act.abs(), values.abs(),
                                             index)[1]
    for dact in (from_saved, recomputed):
        assert dact.dtype == dtype
        assert worst_error(dact, expected_dact, scale_dact) <= tolerance(dtype)


def test_repeats_bitwise():
    """No atomics and a fixed order per output element: the same bits every run, with the
    default blocks and with small ones."""
    shape = (5, 7, 4, 4)
    x, act, values, index = _layout(shape, Case(shape, mu=0.5), torch.float32, seed=9)
    dy = torch.randn(shape[0], shape[3], generator=torch.Generator().manual_seed(10))
    dy = dy.to(DEVICE)
    for config in (None, SMALL):
        def run(config=config):
            y, zg = sparse_triton.triton_forward_saving(x, act, values, index, config=config)
            grads = sparse_triton.triton_backward(dy, x, act, values, index, (True, True, True),
                                                  zg, config=config)
            return [y, zg, *grads]

        first, second = run(), run()
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a, b)


def test_rule_based_blocks():
    config = sparse_triton.sparse_config(16, torch.float32)
    if sparse_triton.interpreted():
        assert config.block_b == 16 and config.block_e >= 32  # few, large steps
    else:
        assert config.block_b == 16 and config.block_e == 32
    assert sparse_triton.sparse_config(1000, torch.float32).block_b == 64


def test_where_it_runs():
    backend = SPARSE_ESTIMATOR.get("triton")
    assert backend.auto_priority == {"cuda": 20}
    assert backend.auto_priority["cuda"] > SPARSE_ESTIMATOR.get("torch").auto_priority["cuda"]
    for dtype in (torch.float32, torch.bfloat16):
        assert SPARSE_ESTIMATOR.pick_auto("cpu", dtype).name != "triton"
    if DEVICE == "cpu":
        assert "CUDA" in backend.unsupported_reason("cuda")


def _cpu_reason_in_subprocess(prelude: str, env: dict[str, str]) -> str:
    code = (prelude + "\nfrom glai_kernels.sparse import SPARSE_ESTIMATOR\n"
            "print(SPARSE_ESTIMATOR.get('triton').unsupported_reason('cpu'))\n")
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env=environment | {"PYTHONPATH": str(ROOT)} | env,
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_cpu_needs_the_interpreter(monkeypatch):
    # the sparse backend asks the dense triton module, which owns the availability check
    dense_triton = importlib.import_module("glai_kernels.backends.triton")
    monkeypatch.setattr(dense_triton, "interpreted", lambda: False)
    reason = sparse_triton.triton_availability("cpu")
    assert "TRITON_INTERPRET=1" in reason and "before importing" in reason


def test_registers_and_imports_without_triton():
    blocked = "import sys\nsys.modules['triton'] = None  # import triton now fails"
    assert _cpu_reason_in_subprocess(blocked, {"TRITON_INTERPRET": "1"}) == \
        "triton is not installed"


# ----------------------------------------------------------------------------------------
# The interpreter's launches patch triton.language once per module (dense module's `_jit`)

dense_triton = importlib.import_module("glai_kernels.backends.triton")
interpreted_only = pytest.mark.skipif(
    not sparse_triton.interpreted() or dense_triton._Interpreted is None,
    reason="the kernels run compiled, or this triton's interpreter lacks what the fewer "
           "patchings rest on")


@contextlib.contextmanager
def plain_interpreter():
    """Every jitted function of the dense and sparse triton modules as triton's own
    InterpretedFunction for the block: the interpreter as it patches by itself."""
    from triton.runtime.interpreter import InterpretedFunction
    jitted = [f for module in (dense_triton, sparse_triton) for f in vars(module).values()
              if isinstance(f, dense_triton._Interpreted)]
    for f in jitted:
        f.__class__ = InterpretedFunction
    try:
        yield
    finally:
        for f in jitted:
            f.__class__ = dense_triton._Interpreted


def _patchings(monkeypatch) -> list[str]:
    """The module of every function the interpreter patches triton.language for, from now."""
    from triton.runtime import interpreter
    seen: list[str] = []
    plain = interpreter._patch_lang

    def counting(fn):
        seen.append(fn.__module__)
        return plain(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    return seen


@interpreted_only
def test_a_launch_patches_once_per_module_and_gives_the_plain_interpreters_bits(monkeypatch):
    """A forward and a backward of many groups: each launch patches triton.language at most
    once for itself and once per module of the jitted functions it calls (this module's
    helpers, triton's tl.sum and tl.zeros), where the interpreter alone patches at every
    call, and every output is bit for bit the plain interpreter's. Afterwards the
    interpreter's call is its own again."""
    from triton.runtime.interpreter import InterpretedFunction
    plain_call = InterpretedFunction.__call__
    shape = (5, 9, 4, 3)
    x, act, values, index = _layout(shape, Case(shape, mu=0.7), torch.float32, seed=11)
    dy = torch.randn(shape[0], shape[3], generator=torch.Generator().manual_seed(12))

    def run():
        y = sparse_triton.triton_forward(x, act, values, index, config=SMALL)
        grads = sparse_triton.triton_backward(dy, x, act, values, index, (True, True, True),
                                              config=SMALL)
        return [y, *grads]

    launches = []
    launch = dense_triton._Interpreted.run

    def counted(self, *args, **kwargs):
        launches.append(self.fn.__name__)
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(dense_triton._Interpreted, "run", counted)
    seen = _patchings(monkeypatch)
    fewer = run()
    patched_fewer = len(seen)
    # the launch itself, then at most the sparse module, the dense one and triton's standard
    assert len(launches) >= 4 and patched_fewer <= 4 * len(launches), (launches, seen)
    assert InterpretedFunction.__call__ is plain_call and not dense_triton._launch_patched
    seen.clear()
    with plain_interpreter():
        plain = run()
    assert len(seen) > 2 * patched_fewer, (len(seen), patched_fewer)
    for a, b in zip(fewer, plain, strict=True):
        assert torch.equal(a, b)


@interpreted_only
def test_an_error_inside_a_launch_is_the_interpreters_and_restores_its_call():
    """A helper that fails (an arange of 3, not a power of 2) fails the launch with the
    interpreter's own error type, and the interpreter's call is restored all the same."""
    from triton.runtime.errors import InterpreterError
    from triton.runtime.interpreter import InterpretedFunction
    plain_call = InterpretedFunction.__call__
    out = torch.zeros(4)
    with pytest.raises(InterpreterError, match="power of 2"):
        _failing_kernel[(1,)](out, 3)
    assert InterpretedFunction.__call__ is plain_call and not dense_triton._launch_patched
    _failing_kernel[(1,)](out, 4)  # the same kernel, a right size: it runs after the failure
    assert torch.equal(out, torch.ones(4))


if dense_triton.tl is not None:
    tl = dense_triton.tl

    @dense_triton._jit
    def _store_ones(ptr, N: tl.constexpr):  # noqa: N803 (triton: constants in capitals)
        tl.store(ptr + tl.arange(0, N), tl.full((N,), 1.0, tl.float32))

    @dense_triton._jit
    def _failing_kernel(ptr, N: tl.constexpr):  # noqa: N803
        _store_ones(ptr, N)
