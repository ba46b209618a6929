"""What the glai_ext extension's ops (backends `cpp` and `cuda`) compute beyond the shared
suite: its inner ops' fakes, its threads, its instruction sets and its tile edges, and the
large results it keeps between calls. Its build is in correctness/test_extension_build.py.

The rest of the suite already runs both backends against the oracle through the registry.
"""

from __future__ import annotations

import multiprocessing
import re
from pathlib import Path

import pytest
import torch
from checker import check

import glai_kernels
from glai_kernels import extension
from glai_kernels.backends.cpp import cpp_backward, cpp_forward_saving
from reference import abs_grads64, grads64, make_inputs, tolerance
from reference.tolerance import worst_error

# ---- the inner ops' fakes ------------------------------------------------------------------

def _devices() -> list:
    """The devices whose glai_ext kernels can run here (cpp's CPU, cuda's GPU)."""
    status = {s.name: s for s in glai_kernels.backends()}
    devices = [pytest.param("cpu", marks=pytest.mark.skipif(
        not status["cpp"].available, reason=f"cpp: {status['cpp'].devices['cpu']}"))]
    reason = status["cuda"].devices["cuda"]
    devices.append(pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
        reason is not None, reason=f"cuda: {reason}")]))
    return devices


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("save", [False, True], ids=["plain", "saving"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_inner_forward_op_passes_opcheck(device, save, dtype):
    data = make_inputs(5, 4, 6, 3, dtype=dtype, device=device, seed=11, bias=False)
    torch.library.opcheck(torch.ops.glai_ext.forward.default,
                          (data.x, data.act, data.weight, save))


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("with_z", [False, True], ids=["recompute", "saved-z"])
@pytest.mark.parametrize("needs", [(True, True, True), (False, True, False),
                                   (True, False, True), (False, False, True)],
                         ids=["all", "act", "x+weight", "weight"])
def test_inner_backward_op_passes_opcheck(device, with_z, needs):
    data = make_inputs(5, 4, 6, 3, device=device, seed=12, bias=False)
    dy = torch.randn(5, 3, generator=torch.Generator().manual_seed(13)).to(device)
    z = extension.run_forward(data.x, data.act, data.weight, with_z)[1]
    torch.library.opcheck(torch.ops.glai_ext.backward.default,
                          (dy, data.x, data.act, data.weight, z, *needs))


def test_inner_ops_fakes_give_shapes_without_running(built):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, act, w = torch.empty(7, 4), torch.empty(7, 6), torch.empty(3, 4, 6)
        y, z = torch.ops.glai_ext.forward(x, act, w, True)
        grads = torch.ops.glai_ext.backward(torch.empty(7, 3), x, act, w, z, True, False, True)
        with pytest.raises(RuntimeError, match=r"weight must be \[O, I, P\]"):
            torch.ops.glai_ext.forward(x, act, torch.empty(3, 5, 6), False)
    assert (tuple(y.shape), tuple(z.shape)) == ((7, 3), (7, 3, 6))
    assert [tuple(g.shape) for g in grads] == [(7, 4), (0,), (3, 4, 6)]


# ---- threads -------------------------------------------------------------------------------

@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def all_calls_parallel():
    """Every dense kernel call on all of torch's threads, however small (the threshold hook)."""
    previous = torch.ops.glai_ext.min_flops_per_thread(0)
    yield
    torch.ops.glai_ext.min_flops_per_thread(previous)


@pytest.fixture(params=["openmp", "pool"])
def runner(request, built):
    """Who runs the kernels' tasks besides the caller: torch's OpenMP team or the pool's own
    helpers (csrc/task_pool.h); restored afterwards."""
    previous = torch.ops.glai_ext.cpu_runner()
    torch.ops.glai_ext.cpu_runner(request.param)
    yield request.param
    torch.ops.glai_ext.cpu_runner(previous)


def test_unknown_runner_is_refused(built):
    with pytest.raises(RuntimeError, match="runner must be"):
        torch.ops.glai_ext.cpu_runner("tbb")


def test_threads_follow_torch_set_num_threads(built, restore_threads, runner):
    # parallel_threads also checks that each of the 64 tasks ran exactly once
    torch.set_num_threads(1)
    assert torch.ops.glai_ext.parallel_threads(64) == 1
    torch.set_num_threads(2)
    assert torch.ops.glai_ext.parallel_threads(64) == 2
    assert torch.ops.glai_ext.parallel_threads(1) == 1
    assert torch.ops.glai_ext.parallel_threads(0) == 0


def _threads_in_a_forked_child(queue) -> None:
    torch.set_num_threads(2)  # the runner is the parent's: the child inherits its setting
    queue.put(torch.ops.glai_ext.parallel_threads(16))


def test_the_task_pool_works_in_a_forked_child(built, restore_threads, runner):
    """A child forked after the parent's pool started has none of its threads: it must start
    its own, not wait for the parent's."""
    torch.set_num_threads(2)
    assert torch.ops.glai_ext.parallel_threads(16) == 2  # the parent's helpers exist now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_threads_in_a_forked_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the forked child's kernel call hung"
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 2


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_one_openmp_runtime_is_loaded(built):
    maps = Path("/proc/self/maps").read_text()
    runtimes = {Path(p).resolve() for p in re.findall(r"(/\S*lib[gi]omp[^/\s]*\.so\S*)", maps)}
    assert len(runtimes) <= 1, runtimes


# 300: dweight's two chunks of b; 16 x 5 outputs: five forward tasks, split by P's three column
# blocks on two threads (kernels.inc, kForwardMinTasks); 401 inputs: dx in many more tasks
# than threads, not a multiple of two or three, claimed in segment order (kernels.inc,
# segment_order), by the GEMM tiles (B = 50) and along s (B = 16)
@pytest.mark.parametrize("batch, inputs, paths, outputs", [
    (50, 23, 70, 9), (300, 23, 70, 9), (16, 23, 150, 5), (50, 401, 70, 9), (16, 401, 150, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_results_do_not_depend_on_the_thread_count(built, restore_threads, all_calls_parallel,
                                                  runner, dtype, batch, inputs, paths, outputs):
    data = make_inputs(batch, inputs, paths, outputs, seed=7, dtype=dtype)
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(8)).to(dtype)

    def run():
        y, z = cpp_forward_saving(data.x, data.act, data.weight)
        grads = cpp_backward(dy, data.x, data.act, data.weight, (True, True, True), saved=z)
        recomputed = cpp_backward(dy, data.x, data.act, data.weight, (False, True, False))
        return [y, z, *grads, recomputed[1]]

    torch.set_num_threads(1)
    one = run()
    for threads in (2, 3):
        torch.set_num_threads(threads)
        for a, b in zip(one, run(), strict=True):
            assert torch.equal(a, b)


# ---- instruction sets and tile edges -------------------------------------------------------

def test_unknown_isa_is_refused(built):
    with pytest.raises(RuntimeError, match="supports"):
        torch.ops.glai_ext.cpu_isa("sse1")


def _cpp(x, act, weight, bias):
    return glai_kernels.estimator(x, act, weight, bias, backend="cpp")


# Tiles: 6 rows; 64 float32 / 32 float64 columns (AVX-512), 16 / 8 (AVX2), 8 / 4 (portable),
# in vectors of 16 / 8, 8 / 4, 4 / 2. Sizes one below, at and one above those edges; odd
# sizes for bfloat16, whose AVX512_BF16 kernels take the reduction index in pairs (on the
# other instruction sets bfloat16 runs the float kernels).
EDGE_SHAPES = [
    (5, 6, 15, 2), (6, 7, 16, 1), (7, 5, 17, 3),
    (12, 11, 31, 2), (13, 13, 33, 2), (65, 12, 63, 2),
    (64, 6, 64, 1), (63, 7, 65, 2), (3, 19, 129, 4), (129, 5, 8, 3),
    # dweight sums b in chunks of 256 rows: two chunks, and three with a partial last one
    (512, 6, 64, 1), (515, 13, 65, 2),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tile_edges_match_oracle(isa, shape, dtype):
    failures = check(_cpp, *shape, dtype=dtype, seed=sum(shape))
    assert not failures, "; ".join(map(str, failures))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_dact_without_saved_z_matches_oracle(built, dtype):
    """The op always keeps Z when act needs a gradient; the recomputing path is checked here."""
    data = make_inputs(37, 13, 70, 5, dtype=dtype, seed=9)
    dy = torch.randn(37, 5, generator=torch.Generator().manual_seed(10)).to(dtype)
    _, dact, _ = cpp_backward(dy, data.x, data.act, data.weight, (False, True, False))
    args = [t.double() for t in (dy, data.x, data.act, data.weight)]
    error = worst_error(dact, grads64(*args).act, abs_grads64(*args).act)
    assert error <= tolerance(dtype), error


def test_op_rejects_inconsistent_shapes(built):
    x, act, w = torch.randn(3, 4), torch.randn(3, 5), torch.randn(2, 4, 6)
    with pytest.raises(RuntimeError, match=r"weight must be \[O, 4, 5\]"):
        torch.ops.glai_ext.forward(x, act, w, False)
    with pytest.raises(RuntimeError, match=r"dy must be \[3, 2\]"):
        torch.ops.glai_ext.backward(torch.randn(3, 3), x, act, torch.randn(2, 4, 5),
                                    torch.empty(0), True, True, True)


# ---- large results kept between backward calls (csrc/gradient_cache.h) --------------------

@pytest.mark.parametrize("o, i, p", [(4, 129, 130), (512, 128, 130), (512, 128, 256)],
                         ids=["262KB", "34MB", "67MB-streamed"])
def test_a_large_dweight_reuses_a_freed_block_and_is_fully_written(built, o, i, p):
    """A dweight of >= 256 KiB comes back, when freed, to the next backward of its size: the
    same memory, every element rewritten (checked against float64 for fresh inputs). From
    32 MiB (float; 64 MiB for bfloat16), with rows of whole cache lines, the kernel stores it
    past the caches."""
    torch.ops.glai_ext.release_cached_results()
    ptrs = []
    for seed in (1, 2):
        data = make_inputs(2, i, p, o, seed=seed)
        dy = torch.randn(2, o, generator=torch.Generator().manual_seed(seed))
        _, _, dweight = cpp_backward(dy, data.x, data.act, data.weight, (False, False, True))
        assert torch.ops.glai_ext.cached_result_bytes() == 0  # the block is in use
        expected = torch.einsum("bo,bi,bs->ois", dy.double(), data.x.double(), data.act.double())
        assert torch.allclose(dweight.double(), expected, rtol=1e-5, atol=1e-5)
        ptrs.append(dweight.data_ptr())
        del dweight
        assert torch.ops.glai_ext.cached_result_bytes() == o * i * p * 4
    assert ptrs[0] == ptrs[1]
    assert torch.ops.glai_ext.release_cached_results() == o * i * p * 4
    assert torch.ops.glai_ext.cached_result_bytes() == 0


def _dweight_of(paths: int, seed: int) -> torch.Tensor:
    """dweight [4, 129, paths] of one cpp backward at B = 2."""
    data = make_inputs(2, 129, paths, 4, seed=seed)
    dy = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))
    return cpp_backward(dy, data.x, data.act, data.weight, (False, False, True))[2]


def test_kept_blocks_past_the_limit_free_the_oldest(built):
    """With the limit at 600,000 bytes, three freed dweights of 268, 289 and 310 KB keep the
    last two (the oldest goes); a block of the second size is taken back; one larger than the
    limit is not kept."""
    ops = torch.ops.glai_ext
    ops.release_cached_results()
    previous = ops.cached_result_limit(600_000)
    try:
        sizes = {p: 4 * 129 * p * 4 for p in (130, 140, 150, 300)}
        for seed, paths in enumerate((130, 140, 150)):
            _dweight_of(paths, seed)  # freed at once: kept
        assert ops.cached_result_bytes() == sizes[140] + sizes[150]
        taken = _dweight_of(140, 7)  # the kept 289 KB block, in use again
        assert ops.cached_result_bytes() == sizes[150]
        del taken
        _dweight_of(300, 8)  # 619 KB, over the limit: not kept
        assert ops.cached_result_bytes() == sizes[140] + sizes[150]
        # the 289 KB block came back after the 310 KB one: lowering the limit frees the latter
        assert ops.cached_result_limit(sizes[150]) == 600_000
        assert ops.cached_result_bytes() == sizes[140]
    finally:
        ops.cached_result_limit(previous)
        ops.release_cached_results()


def _has_bf16_kernels() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags and torch.ops.glai_ext.cpu_isa() == "avx512"


def test_a_streamed_bf16_dweight_has_the_bits_of_a_cached_one(built):
    """From 64 MiB (O = 512, I = 129, P = 512: 67.6 MB) the bfloat16 dweight's full tiles are
    stored past the caches, rounded to bfloat16 sixteen lanes at a time; its last, partial
    row block of i is not. Each dweight[o] depends on o's column of dy alone, so its first and
    last four o's must be, bit for bit, those of a 528 KB dweight (stored through the caches,
    rounded one element at a time) of the same inputs, subnormal, infinite and NaN values
    included."""
    if not _has_bf16_kernels():
        pytest.skip("needs AVX512_BF16 and the avx512 kernels")
    g = torch.Generator().manual_seed(12)
    batch, inputs, paths, outputs = 2, 129, 512, 512
    x = torch.randn(batch, inputs, generator=g).bfloat16()
    act = (torch.rand(batch, paths, generator=g) > 0.5).bfloat16()
    dy = torch.randn(batch, outputs, generator=g).bfloat16()
    x[0, 1:40] = 3e-39   # products that round to bfloat16 subnormals
    x[1, 7] = float("inf")
    x[0, 8] = float("nan")
    weight = torch.zeros(outputs, inputs, paths, dtype=torch.bfloat16)
    big = cpp_backward(dy, x, act, weight, (False, False, True))[2]
    assert big.view(torch.int16)[:, 1:40].ne(0).any()  # subnormals survived, not flushed
    for part in (slice(0, 4), slice(outputs - 4, outputs)):
        small = cpp_backward(dy[:, part].contiguous(), x, act, weight[part].contiguous(),
                             (False, False, True))[2]
        assert torch.equal(big[part].view(torch.int16), small.view(torch.int16))


def test_the_bf16_forward_pairs_rows_in_place_or_packed_with_the_same_bits(built):
    """The bfloat16 forward pairs the weight's rows along i in registers at a small batch, and
    from 16 row blocks of b (B = 96 here) packs the weight in pairs first, into a buffer the
    weight's size (4 x 65 pairs x 304 words = 316,160 bytes) that comes from the kept blocks
    and goes back to them. Each row of b is computed alone, so a B = 3 call (in place: no
    kept block) must give, bit for bit, the first three rows of the B = 96 call (packed), Z
    included; and a repeated packed call the same bits."""
    if not _has_bf16_kernels():
        pytest.skip("needs AVX512_BF16 and the avx512 kernels")
    ops = torch.ops.glai_ext
    ops.release_cached_results()
    data = make_inputs(96, 129, 300, 4, seed=11, dtype=torch.bfloat16)
    y3, z3 = ops.forward(data.x[:3].contiguous(), data.act[:3].contiguous(), data.weight, True)
    assert ops.cached_result_bytes() == 0
    y96, z96 = ops.forward(data.x, data.act, data.weight, True)
    assert ops.cached_result_bytes() == 4 * 65 * 304 * 4
    assert torch.equal(y3.view(torch.int16), y96[:3].view(torch.int16))
    assert torch.equal(z3, z96[:3])
    again, _ = ops.forward(data.x, data.act, data.weight, True)
    assert ops.cached_result_bytes() == 4 * 65 * 304 * 4
    assert torch.equal(again.view(torch.int16), y96.view(torch.int16))
    expected = torch.einsum("bi,bs,ois->bo", data.x.double(), data.act.double(),
                            data.weight.double())
    assert torch.allclose(y96.double(), expected, rtol=2e-2, atol=2e-2)


def test_a_small_dweight_is_not_kept(built):
    """Just under 256 KiB (4 x 128 x 127 floats): at::empty's memory, nothing kept."""
    torch.ops.glai_ext.release_cached_results()
    data = make_inputs(3, 128, 127, 4, seed=5)
    dy = torch.randn(3, 4, generator=torch.Generator().manual_seed(6))
    _, _, dweight = cpp_backward(dy, data.x, data.act, data.weight, (False, False, True))
    del dweight
    assert torch.ops.glai_ext.cached_result_bytes() == 0
