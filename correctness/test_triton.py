"""What only the triton backend has: forced tile configs and K splits, the deterministic
reduction, the fp32 workspaces behind half-precision results, int64 indexing, the bfloat16
emulation the interpreter needs, and where the backend says it can run.

The rest of the suite (every dtype and shape, gradcheck, opcheck, compile) runs this backend
through the registry like any other. Here the configs are forced through the launchers'
`config` arguments, with GPU-sized tiles (multiples of 16), so the interpreter checks the
same tile arithmetic a GPU would run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checker import check

import glai_kernels
from glai_kernels import registry
from glai_kernels.contract import SUPPORTED_DTYPES
from glai_kernels.paper_heads import PAPER_HEADS
from reference import (
    abs_forward64,
    abs_grads64,
    forward64,
    grads64,
    make_inputs,
    tolerance,
)
from reference.tolerance import worst_error

triton_backend = pytest.importorskip("glai_kernels.backends.triton")
ForwardConfig = triton_backend.ForwardConfig
GradWeightConfig = triton_backend.GradWeightConfig
GradInputsConfig = triton_backend.GradInputsConfig

DEVICE = next((d for d in ("cuda", "cpu") if registry.get("triton").unsupported_reason(d) is None),
              None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="the triton backend cannot run here: "
                                f"{registry.get('triton').unsupported_reason('cpu')}")

DTYPES = SUPPORTED_DTYPES
DTYPE_IDS = [str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES]
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def forced(forward: ForwardConfig | None = None, weight: GradWeightConfig | None = None,
           inputs: GradInputsConfig | None = None):
    """An estimator callable for the checker that runs the triton launchers with these
    configs, through the real op (registered as a temporary backend)."""
    name = "triton-forced"
    registry.register(registry.Backend(
        name=name,
        forward=functools.partial(triton_backend.triton_forward, config=forward),
        backward=functools.partial(triton_backend.triton_backward, weight_config=weight,
                                   inputs_config=inputs),
        devices=("cpu", "cuda"),
        description="the triton backend with forced configs (tests)",
    ))
    try:
        yield lambda x, act, w, b: glai_kernels.estimator(x, act, w, b, backend=name)
    finally:
        registry.unregister(name)


@pytest.fixture
def slice_sums(monkeypatch):
    """Records (slices, workspace dtype, result dtype) of every fixed-order reduction."""
    calls = []
    original = triton_backend._sum_slices

    def spy(ws, out):
        calls.append((ws.shape[0], ws.dtype, out.dtype))
        return original(ws, out)

    monkeypatch.setattr(triton_backend, "_sum_slices", spy)
    return calls


def _assert_passes(failures) -> None:
    assert not failures, "; ".join(str(f) for f in failures)


# Shapes no config below was chosen for: nothing divides a tile; P = 37 spans three path
# blocks of 16 (dx partials), I = 13 spans several input slices (dact partials).
AWKWARD = (33, 13, 37, 65)
SPLIT_FORWARD = ForwardConfig(block_m=16, block_n=32, block_k=32, split_k=5)
WEIGHT_TILES = GradWeightConfig(block_o=16, block_k=64, block_b=16)
SPLIT_INPUTS = GradInputsConfig(block_b=16, block_i=2, block_s=16, block_o=16, i_splits=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gpu_sized_tiles_with_splits_match_oracle(dtype):
    with forced(SPLIT_FORWARD, WEIGHT_TILES, SPLIT_INPUTS) as fn:
        _assert_passes(check(fn, *AWKWARD, dtype=dtype, device=DEVICE, seed=21))


@pytest.mark.parametrize("grads", [("x",), ("act",), ("x", "act"), ("weight", "act")],
                         ids=lambda g: "+".join(g))
def test_partial_workspaces_for_each_gradient_subset(grads, slice_sums):
    with forced(SPLIT_FORWARD, WEIGHT_TILES, SPLIT_INPUTS) as fn:
        _assert_passes(check(fn, *AWKWARD, device=DEVICE, seed=22, grads=grads))
    # dx: 3 path blocks of 16 for P = 37; dact: 3 input slices; nothing else is summed here
    expected = [(3, torch.float32, torch.float32)] * len({"x", "act"} & set(grads))
    assert slice_sums == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_split_k_on_and_off_agree(dtype, slice_sums):
    data = make_inputs(5, 97, 41, 19, dtype=dtype, device=DEVICE, seed=23)
    scale = abs_forward64(data.x, data.act, data.weight)
    whole = triton_backend.triton_forward(data.x, data.act, data.weight,
                                          config=ForwardConfig(16, 32, 64, split_k=1))
    assert worst_error(whole, forward64(data.x, data.act, data.weight), scale) <= tolerance(dtype)
    for split in (2, 7, 16):
        pieces = triton_backend.triton_forward(data.x, data.act, data.weight,
                                               config=ForwardConfig(16, 32, 64, split_k=split))
        # the same sum in another order: within the dtype's tolerance of each other
        assert worst_error(pieces, whole.double(), scale) <= tolerance(dtype), split
    assert slice_sums == []  # deterministic mode is off: the slices met by atomic adds


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_deterministic_path_repeats_bitwise_and_matches_oracle(dtype, deterministic,
                                                               slice_sums):
    data = make_inputs(*AWKWARD, dtype=dtype, device=DEVICE, seed=24, bias=False)
    dy = torch.randn(AWKWARD[0], AWKWARD[3], generator=torch.Generator().manual_seed(3))
    dy = dy.to(DEVICE, dtype)

    def run():
        y = triton_backend.triton_forward(data.x, data.act, data.weight, config=SPLIT_FORWARD)
        grads = triton_backend.triton_backward(dy, data.x, data.act, data.weight,
                                               (True, True, True), weight_config=WEIGHT_TILES,
                                               inputs_config=SPLIT_INPUTS)
        return [y, *grads]

    first, second = run(), run()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    # forward's 5 K slices, then dx's 3 path blocks and dact's 3 input slices, all in fp32
    assert slice_sums[:3] == [(5, torch.float32, dtype), (3, torch.float32, dtype),
                              (3, torch.float32, dtype)]
    inputs = (data.x, data.act, data.weight)
    expected = [forward64(*inputs), *grads64(dy, *inputs)[:3]]
    scales = [abs_forward64(*inputs), *abs_grads64(dy, *inputs)[:3]]
    for name, got, want, scale in zip(("y", "dx", "dact", "dweight"), first, expected, scales,
                                      strict=True):
        assert worst_error(got, want, scale) <= tolerance(dtype), name


@pytest.mark.parametrize(("dtype", "big", "small"), [(torch.float16, 2048.0, 0.5),
                                                     (torch.bfloat16, 256.0, 0.125)],
                         ids=["f16", "bf16"])
def test_slice_sum_accumulates_in_float32(dtype, big, small):
    """One big slice then sixteen small ones, each small one under half the dtype's spacing
    at `big`: a running sum in the dtype never moves, a float32 one gains 16*small, which
    the dtype holds exactly (2056 in float16, 258 in bfloat16)."""
    ws = torch.tensor([big] + [small] * 16, device=DEVICE).reshape(17, 1)
    out = triton_backend._sum_slices(ws, torch.empty(1, dtype=dtype, device=DEVICE))
    assert out.item() == big + 16 * small


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("mode", ["atomic", "deterministic"])
def test_half_split_k_long_positive_sums(dtype, mode):
    """K = 8192 positive terms cut into 8 slices: each slice's partial stays fp32 until the
    one final rounding, so half inputs keep their tolerance."""
    context = contextlib.nullcontext()
    if mode == "deterministic":
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        context = contextlib.ExitStack()
        context.callback(torch.use_deterministic_algorithms, previous)
    with context, forced(ForwardConfig(16, 16, 64, split_k=8), WEIGHT_TILES,
                         GradInputsConfig(16, 4, 16, 16, i_splits=4)) as fn:
        _assert_passes(check(fn, 3, 128, 64, 2, dtype=dtype, device=DEVICE, seed=25,
                             positive=True))


def test_rule_based_configs_split_the_paper_heads():
    """At the paper's batches the (b, o) tiles are few, so the rules split K and the inputs:
    the default suite's paper-head tests go through the split paths."""
    for head in PAPER_HEADS.values():
        shape = head.shape(batch=2)
        device = torch.device(DEVICE)
        assert triton_backend.forward_config(shape, torch.float32, device).split_k > 1, head.name
        assert triton_backend.grad_inputs_config(shape, torch.float32, device).i_splits > 1


def test_no_batch_sized_intermediate_is_allocated(monkeypatch):
    """Every buffer the launchers allocate is an output or a small workspace, never
    [B, I, P] or [B, O, P]: B*I*P = 6930 elements here, the largest legitimate buffer is
    dweight's O*I*P = 3465, the workspaces are at most 3*B*I."""
    batch, inputs, paths, outputs = 10, 33, 21, 5
    sizes = []

    class Recorder:
        def __getattr__(self, name):
            attr = getattr(torch, name)
            if name in ("empty", "zeros", "empty_like", "zeros_like"):
                @functools.wraps(attr)
                def record(*args, **kwargs):
                    t = attr(*args, **kwargs)
                    sizes.append(t.numel())
                    return t
                return record
            return attr

    monkeypatch.setattr(triton_backend, "torch", Recorder())
    data = make_inputs(batch, inputs, paths, outputs, device=DEVICE, seed=26)
    dy = torch.randn(batch, outputs, device=DEVICE)
    triton_backend.triton_forward(data.x, data.act, data.weight,
                                  config=ForwardConfig(16, 16, 16, 4))
    triton_backend.triton_backward(dy, data.x, data.act, data.weight, (True, True, True),
                                   weight_config=WEIGHT_TILES,
                                   inputs_config=GradInputsConfig(16, 2, 16, 16, i_splits=3))
    assert sizes and max(sizes) <= max(outputs * inputs * paths, 3 * batch * inputs)
    assert batch * inputs * paths not in sizes and batch * outputs * paths not in sizes


# ---- int64 indexing: _tile is where every block index becomes an offset


def _probe_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def probe_tile(out_ptr, index, BLOCK: tl.constexpr):  # noqa: N803
        tl.store(out_ptr + tl.arange(0, BLOCK), triton_backend._tile(index, BLOCK))

    @triton.jit
    def probe_rounding(in_ptr, out_ptr, N: tl.constexpr, EMULATE: tl.constexpr):  # noqa: N803
        offsets = tl.arange(0, N)
        v = tl.load(in_ptr + offsets)
        rounded = triton_backend._rounded(v, tl.bfloat16, EMULATE)
        tl.store(out_ptr + offsets, rounded.to(tl.float32))

    return probe_tile, probe_rounding


def test_tile_offsets_are_int64_past_2_pow_31():
    probe_tile, _ = _probe_kernels()
    out = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    index = 2**31 - 1  # the largest int32 block index, passed as an int32 argument
    probe_tile[(1,)](out, index, BLOCK=8)
    expected = torch.arange(8, dtype=torch.int64) + index * 8
    assert out.cpu().tolist() == expected.tolist()  # int32 arithmetic would wrap negative


@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "native"])
def test_bfloat16_rounding_is_to_nearest_even(emulate):
    if not emulate and triton_backend.interpreted():
        pytest.skip("the interpreter's own fp32->bf16 conversion truncates: why EMULATE exists")
    _, probe_rounding = _probe_kernels()
    gen = torch.Generator().manual_seed(27)
    values = torch.randn(1024, generator=gen) * 100
    # exact ties between two bfloat16 neighbours (1 + 2^-8 lies halfway between 1 and
    # 1 + 2^-7), which truncation and round-half-up both get wrong for one of the signs
    values[:4] = torch.tensor([1 + 2**-8, -(1 + 2**-8), 1 + 3 * 2**-8, 3 * 2**-9])
    values = values.to(DEVICE)
    out = torch.empty_like(values)
    probe_rounding[(1,)](values, out, N=1024, EMULATE=emulate)
    assert torch.equal(out, values.bfloat16().float())


# ---- where the backend runs


def _availability_in_subprocess(prelude: str, env: dict[str, str]) -> str:
    code = (prelude + "\nimport glai_kernels\nfrom glai_kernels import registry\n"
            "print(registry.get('triton').unsupported_reason('cpu'))\n")
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(DEVICE != "cpu", reason="checks the CPU reasons")
def test_cpu_needs_the_interpreter_chosen_before_import():
    reason = _availability_in_subprocess("", {"PYTHONPATH": str(ROOT)})
    assert "TRITON_INTERPRET=1" in reason and "before importing" in reason
    assert registry.get("triton").unsupported_reason("cpu") is None  # this process set it
    assert "CUDA" in registry.get("triton").unsupported_reason("cuda")  # none here


def test_registers_and_imports_without_triton():
    blocked = "import sys\nsys.modules['triton'] = None  # import triton now fails"
    reason = _availability_in_subprocess(blocked, {"PYTHONPATH": str(ROOT),
                                                   "TRITON_INTERPRET": "1"})
    assert reason == "triton is not installed"


def test_auto_never_picks_the_interpreter():
    for dtype in glai_kernels.SUPPORTED_DTYPES:
        assert registry.pick_auto("cpu", dtype).name != "triton"
    assert set(registry.get("triton").auto_priority) == {"cuda"}


def test_triton_is_off_the_top_of_the_cuda_priority():
    """On a GPU it won no measured cell (docs/notes/cuda.md, "An H200 lease: the cuda tests,
    the whole heads sweep and `triton` at the paper's batch (stop 33)"): without a measured
    table `auto` takes `cuda`, then `torch`, before it; it stays a candidate, so a table that
    measures it winning a cell still picks it there."""
    rank = {name: registry.get(name).auto_priority["cuda"] for name in ("triton", "cuda", "torch")}
    assert rank["triton"] < rank["torch"] < rank["cuda"], rank
