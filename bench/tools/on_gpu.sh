#!/usr/bin/env bash
# One call on a lent CUDA machine, sized for a short lease: build the extension with its CUDA
# part, run every test whose id names cuda or triton, then time the paper heads on the GPU
# (writes the CUDA dispatch table, in the archive). Each step ends by itself before its
# deadline, reports written: the tests through bench/tools/lease_plugin.py, every `glai-bench
# run` through its --time-limit (which holds its opening ceilings, its shapes, its closing
# ceilings and reports: bench/harness/budget.py; results.csv is also written after each shape
# and on SIGTERM), the pipeline through its --time-limit and --unit-time-limit. Each program's
# limit is its step's share less BACKSTOP_S (default 10: the interpreter's start-up, before the
# limit's clock starts), and `timeout` at the share is only a backstop (the build alone has
# nothing but its timeout); a step whose share is under the least that measures something
# (BENCH_FLOOR_S=45 for the kernel sweep, STEP_FLOOR_S=30 for the others) is skipped with a
# line in steps.txt saying so. A slow step thus leaves the others their time; what each step
# printed, the failures' tracebacks and the run's reports as one archive land in $OUT (default
# /tmp/on_gpu), at most 8 files (the device tool's limit). The runs' folders
# (bench_cuda, pipeline, ... below) are in $WORK (default /tmp).
#
#     bash bench/tools/on_gpu.sh            # from the repository root, on the GPU machine
#     TOTAL_S=560 TEST_S=120 BENCH_MIN_S=120 ENERGY_S=60 TC_S=75 KEPT_S=90 PIPE_S=90 \
#       bash bench/tools/on_gpu.sh
#         # the defaults on CUDA: build (at most BUILD_S=200), then the tests get what the later
#         # steps' shares leave, at most TEST_S
#     ENERGY_S=60 ...   # after the kernel sweep, a step of its own: NVML energy over windows of
#         1 s (NVML's counter needs them: 0.1 s read up to 1,140 W on a 700 W H200, stop 33) and
#         the `train` pass (forward + dweight, the paper's kernel pair) beside forward and both,
#         at ENERGY_HEADS (default A1,A2,C1,B1), B = ENERGY_BATCHES (16), float32; ENERGY_S=0:
#         none (the default off CUDA). The kernel sweep itself reads no energy. Its report is
#         bench_cuda/energy/ in the archive.
#     ANATOMY_S=25 ...   # the default on CUDA (0 elsewhere): right after the build, where a
#         B = 16 call's time goes at ANATOMY_HEADS (A1,B1) on ANATOMY_BACKENDS (cuda,torch),
#         forward and both: event time, host issue time, kernel time (`glai-bench call-anatomy`;
#         its table in bench.log, its JSON as anatomy/ in the archive)
#     TC_S=75 ...   # the default on CUDA (0 elsewhere): after the energy step, issue 38's
#         tensor-core cells in a run of their own: float32 with TF32 allowed (`glai-bench run
#         --matmul-precision high`, for the `cuda` kernels and cuBLAS alike), float16 and
#         bfloat16, at TC_HEADS (default A1,A2,C1,C2: A1's TF32 target, the bfloat16 target's
#         heads) and B = TC_BATCHES (4096,256), forward and both, from the `full` preset's heads
#         sweep (TC_PRESET; the kernel sweep's preset has bfloat16 at B 16/32 only); torch
#         against cuda; its report is bench_cuda/tensor_cores/ in the archive (full float32 at
#         those batches is in the kernel sweep)
#     TRITON_S=150 TRITON_HEADS=A1,C2 bash bench/tools/on_gpu.sh   # and a triton run of its own
#     TRITON_BATCHES=16 ...     # (its batches; default 16,256,4096; TRITON_PRESET the preset
#         they are taken from, default `default`): its tuning starts cold
#         (no kept choice, no compiled kernel), and "triton autotune s" in bench.log gives each
#         row's first call and each kernel's tuning time per new shape
#     REPEATS=2 REPEAT_S=120 bash bench/tools/on_gpu.sh   # the small heads at B 16/32 twice more
#         (REPEAT_HEADS, REPEAT_BATCHES), then here: glai-bench merge OUT bench_cuda
#         bench_repeat1 bench_repeat2 --repeats   (each cell keeps its median run's row)
#     TEST_FOCUS="test_sparse.py and compile" bash bench/tools/on_gpu.sh   # those tests first,
#                                         # alone, cpu and cuda ids, whole tracebacks
#     PIPE_S=90 PIPE_PRESET=quick ...   # the defaults: after the kernel sweep, the GLAI pipeline
#         of the six heads (PIPE_HEADS=A2,C1: a subset), one seed, each (head, data, seed)
#         unit in its own process and cut off past PIPE_UNIT_S (default PIPE_S/6); a unit
#         that could not finish before the step's end is not started (the report names it),
#         and the report is rewritten after every unit (/tmp/pipeline, in the archive).
#         PIPE_S=0: none.
#     TEST_S=0 skips the tests; BENCH_PRESET=quick BENCH_HEADS=A1 BENCH_DTYPES=float32 narrow
#     the kernel sweep (BENCH_HEADS, default C1,C2,B2,A1,A2,B1, is also the order measured).
#     KEPT_S=90 ...   # the default on CUDA (0 elsewhere): after the pipeline, the kept-fraction
#         sweep's training-step pass at the six heads' matched μ and around it (B 16, C2 also
#         32; KEPT_HEADS, KEPT_BACKENDS), sparse against dense against the MLP; it writes the
#         layout crossover table (dispatch/<kind>.layout_crossover.json) beside its results in
#         /tmp/bench_cuda/kept_step (in the archive); install it here with
#         cp .../dispatch/*.layout_crossover.json glai_kernels/dispatch/
#
# The CPU dry run (CI runs it: .ci/run), every step but the tests, energy and the kept sweep
# end to end in under 5 minutes (each step ends by itself within its share of TOTAL_S;
# bench/tests/test_lease_steps.py runs it with tighter shares and checks no step needed its
# `timeout`):
#     OUT=/tmp/on_gpu_dry TOTAL_S=255 BUILD_S=90 TEST_S=0 BENCH_MIN_S=0 BENCH_DEVICE=cpu \
#       BENCH_PRESET=quick BENCH_BACKENDS=einsum,torch BENCH_HEADS=A1 BENCH_DTYPES=float32 \
#       TC_S=30 TC_PRESET=quick TC_HEADS=A1 TC_BATCHES=16 TC_DTYPES=float32,float16 \
#       TC_BACKENDS=torch \
#       PIPE_S=60 PIPE_UNIT_S=30 PIPE_HEADS=A2,C1 ANATOMY_S=25 ANATOMY_HEADS=A2 \
#       bash bench/tools/on_gpu.sh
#
# Needs torch with CUDA, nvcc, triton, pytest, pytest-xdist and pytest-timeout where it runs;
# installs nothing (the repository is imported from the checkout).
set -u
OUT=${OUT:-/tmp/on_gpu}
# where the runs write their folders (bench_cuda, pipeline, ...), archived from there
WORK=${WORK:-/tmp}
mkdir -p "$OUT"
START=$(date +%s)
TOTAL_S=${TOTAL_S:-560}
BUILD_S=${BUILD_S:-200}
TEST_S=${TEST_S:-120}
# the steps after the tests, each cut at its share (defaults on CUDA; energy and the kept
# sweep's step pass are CUDA-only by default): the tests get what they leave
PIPE_S=${PIPE_S:-90}
ENERGY_S=${ENERGY_S:-$( [ "${BENCH_DEVICE:-cuda}" = cuda ] && echo 60 || echo 0 )}
KEPT_S=${KEPT_S:-$( [ "${BENCH_DEVICE:-cuda}" = cuda ] && echo 90 || echo 0 )}
TC_S=${TC_S:-$( [ "${BENCH_DEVICE:-cuda}" = cuda ] && echo 75 || echo 0 )}
BENCH_MIN_S=${BENCH_MIN_S:-120}
# the kernel sweep's heads in the order it measures them (bench run follows --heads' order):
# the heads no H200 lease has measured since issue 38's kernels (stop 48 reached A1, A2, B1
# in its 77 s) first, the small before the large; every head still comes on a new GPU kind
BENCH_HEADS=${BENCH_HEADS:-C1,C2,B2,A1,A2,B1}
# the call anatomy right after the build (CUDA only by default): a few seconds a row
ANATOMY_S=${ANATOMY_S:-$( [ "${BENCH_DEVICE:-cuda}" = cuda ] && echo 25 || echo 0 )}
ANATOMY_HEADS=${ANATOMY_HEADS:-A1,B1}
ANATOMY_BACKENDS=${ANATOMY_BACKENDS:-$( [ "${BENCH_DEVICE:-cuda}" = cuda ] && echo cuda,torch || echo torch )}
# a program's own limit is its share less this (its start-up comes before the limit's clock)
BACKSTOP_S=${BACKSTOP_S:-10}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export GLAI_KERNELS_CACHE=${GLAI_KERNELS_CACHE:-/tmp/glai_cache}
PY=${PY:-python3}

left() { echo $((TOTAL_S - ($(date +%s) - START))); }
step() { printf '\n== %s (at %ss, %ss left)\n' "$1" $(( $(date +%s) - START )) "$(left)"; }
# skipped NAME BUDGET FLOOR: a line saying why a step does not run (its share under the
# least that measures something: start-up, the ceilings twice, one shape, the reports)
skipped() { echo "$1: skipped, $2 s left for it (a run that measures something needs $3 s)" |
  tee -a "$OUT/steps.txt"; }

{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-300
  "$PY" -c "import torch, triton; p = torch.cuda.get_device_properties(0); \
print(torch.__version__, torch.version.cuda, triton.__version__, p)"
} >"$OUT/env.txt" 2>&1

step build | tee -a "$OUT/steps.txt"
timeout "$BUILD_S" "$PY" - >"$OUT/build.log" 2>&1 <<'EOF'
import time
t = time.perf_counter()
from glai_kernels import extension_build
b = extension_build.build()
print(f"built in {time.perf_counter() - t:.1f} s: error={b.error} with_cuda={b.with_cuda} "
      f"cuda_reason={b.cuda_reason}")
EOF
echo "build rc=$?" | tee -a "$OUT/steps.txt"
# a failed build's compiler output is in its cache folder, which does not come back
cat "$GLAI_KERNELS_CACHE"/*/build.log >>"$OUT/build.log" 2>/dev/null
timeout 60 "$PY" -m glai_kernels >>"$OUT/build.log" 2>&1

if [ "$ANATOMY_S" -gt 0 ]; then
  # where a small call's time goes (bench/studies/call_anatomy.py): its event time against the
  # host's issue time and its kernels' device time, each row printed as it is measured; the
  # kernel sweep's B = 16 cells read with it (docs/notes/cuda.md, stop 48)
  step "call anatomy at $ANATOMY_HEADS, B 16" | tee -a "$OUT/steps.txt"
  rm -rf "$WORK/anatomy"
  timeout -k 5 "$ANATOMY_S" "$PY" -m bench call-anatomy --device "${BENCH_DEVICE:-cuda}" \
    --heads ${ANATOMY_HEADS//,/ } --batch 16 --passes forward both \
    --backends ${ANATOMY_BACKENDS//,/ } --out "$WORK/anatomy/anatomy.json" \
    >>"$OUT/bench.log" 2>&1
  echo "anatomy rc=$?" | tee -a "$OUT/steps.txt"
fi

if [ -n "${TEST_FOCUS:-}" ]; then
  step "focus: $TEST_FOCUS" | tee -a "$OUT/steps.txt"
  # one process, long tracebacks: a failure to be read, not counted
  GLAI_TESTS_UNTIL=$(( $(date +%s) + ${FOCUS_S:-90} - 20 )) \
  timeout -s INT -k 10 "${FOCUS_S:-90}" "$PY" -m pytest -q -p no:cacheprovider -p no:xdist \
    --timeout 60 --tb=long -rfE --benchmark-disable -k "$TEST_FOCUS" correctness bench/tests \
    >"$OUT/focus.log" 2>&1
  echo "focus rc=$?" | tee -a "$OUT/steps.txt"
fi

if [ "$TEST_S" -gt 0 ]; then
step tests | tee -a "$OUT/steps.txt"
# tests not started TEST_S from now are skipped (bench/tools/lease_plugin.py), so pytest ends with
# its report; each failure's traceback is written to failures.txt the moment it fails
budget=$(( $(left) - BENCH_MIN_S - PIPE_S - ENERGY_S - TC_S - KEPT_S - ${TRITON_S:-0} - ${REPEAT_S:-0} ))
[ "$budget" -gt "$TEST_S" ] && budget=$TEST_S
if [ "$budget" -lt 40 ]; then
  echo "tests skipped: ${budget}s left after the later steps' shares" | tee -a "$OUT/steps.txt"
else
GLAI_TESTS_UNTIL=$(( $(date +%s) + budget - 20 )) GLAI_TESTS_FAILURES="$OUT/failures.txt" \
timeout -s INT -k 10 "$budget" "$PY" -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-12}" \
  --timeout 120 --tb=short -rfE --benchmark-disable -k "${TEST_K:-cuda or triton}" \
  correctness bench/tests >"$OUT/tests.log" 2>&1
echo "tests rc=$?" | tee -a "$OUT/steps.txt"
fi
fi

step bench | tee -a "$OUT/steps.txt"
# the run keeps its limit itself, closing ceilings, reports and plots included; the limit is
# checked before each shape and each backend's first call (which may autotune for tens of
# seconds) against their estimates
budget=$(( $(left) - 10 - ${TRITON_S:-0} - ${REPEAT_S:-0} - PIPE_S - ENERGY_S - TC_S - KEPT_S ))
rm -rf $WORK/bench_cuda/results.csv $WORK/bench_cuda/results.json $WORK/bench_cuda/summary.md
if [ "$budget" -lt "${BENCH_FLOOR_S:-45}" ]; then
  skipped bench "$budget" "${BENCH_FLOOR_S:-45}"
else
timeout -k 10 "$budget" "$PY" -m bench run --suite kernels --device "${BENCH_DEVICE:-cuda}" --sweeps heads \
  --preset "${BENCH_PRESET:-default}" --dtypes "${BENCH_DTYPES:-float32,bfloat16}" --passes "${BENCH_PASSES:-forward,both}" --peers einsum \
  --heads "$BENCH_HEADS" \
  --backends "${BENCH_BACKENDS:-einsum,torch,cuda}" --rounds 3 --min-time 0.05 \
  --energy-window 0 --time-limit $(( budget - BACKSTOP_S )) \
  --out $WORK/bench_cuda --no-history >"$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/steps.txt"
fi
if [ "$ENERGY_S" -gt 0 ]; then
  # NVML energy at windows of 1 s (bench/harness/energy.py), and the `train` pass, at a few
  # heads at the paper's batch: 1 s a reading is ~30 readings in 90 s. Written inside
  # $WORK/bench_cuda (energy/), so the archive holds it; the steps after keep their time.
  step "energy and train at ${ENERGY_HEADS:-A1,A2,C1,B1}, B ${ENERGY_BATCHES:-16}" \
    | tee -a "$OUT/steps.txt"
  budget=$(( $(left) - 10 - ${TRITON_S:-0} - ${REPEAT_S:-0} - PIPE_S - TC_S - KEPT_S ))
  [ "$budget" -gt "$ENERGY_S" ] && budget=$ENERGY_S
  # its estimates count each 1 s energy window (bench/harness/budget.py)
  rm -rf $WORK/bench_cuda/energy  # no stale report from an earlier run on this machine
  if [ "$budget" -ge "${STEP_FLOOR_S:-30}" ]; then
    timeout -k 10 "$budget" "$PY" -m bench run --suite kernels --device "${BENCH_DEVICE:-cuda}" \
      --preset "${BENCH_PRESET:-default}" --sweeps heads \
      --heads "${ENERGY_HEADS:-A1,A2,C1,B1}" --batches "${ENERGY_BATCHES:-16}" \
      --dtypes float32 --passes "${ENERGY_PASSES:-forward,train,both}" --peers none \
      --backends "${BENCH_BACKENDS:-einsum,torch,cuda}" --rounds 3 --min-time 0.05 \
      --energy-window 1 --time-limit $(( budget - BACKSTOP_S )) --out $WORK/bench_cuda/energy \
      --no-history --no-plots >>"$OUT/bench.log" 2>&1
    echo "energy rc=$?" | tee -a "$OUT/steps.txt"
    "$PY" -m bench.tools.lease_summaries energy $WORK/bench_cuda/energy/results.csv \
      >>"$OUT/bench.log" 2>&1
  else
    skipped energy "$budget" "${STEP_FLOOR_S:-30}"
  fi
fi
if [ "$TC_S" -gt 0 ]; then
  # tensor cores (issue 38): TF32 is a process-wide torch setting, so a run of its own; the
  # oracle judges those float32 rows at TF32's tolerance (bench/harness/oracle.py)
  step "tensor cores: TF32, float16, bfloat16 at ${TC_HEADS:-A1,A2,C1,C2}, B ${TC_BATCHES:-4096,256}" \
    | tee -a "$OUT/steps.txt"
  budget=$(( $(left) - 10 - ${TRITON_S:-0} - ${REPEAT_S:-0} - PIPE_S - KEPT_S ))
  [ "$budget" -gt "$TC_S" ] && budget=$TC_S
  rm -rf $WORK/bench_cuda/tensor_cores
  if [ "$budget" -ge "${STEP_FLOOR_S:-30}" ]; then
    timeout -k 10 "$budget" "$PY" -m bench run --suite kernels --device "${BENCH_DEVICE:-cuda}" \
      --preset "${TC_PRESET:-full}" --sweeps heads --matmul-precision high \
      --heads "${TC_HEADS:-A1,A2,C1,C2}" --batches "${TC_BATCHES:-4096,256}" \
      --dtypes "${TC_DTYPES:-float32,float16,bfloat16}" --passes forward,both --peers none \
      --backends "${TC_BACKENDS:-torch,cuda}" --rounds 3 --min-time 0.05 --energy-window 0 \
      --time-limit $(( budget - BACKSTOP_S )) --out $WORK/bench_cuda/tensor_cores \
      --no-history --no-plots >>"$OUT/bench.log" 2>&1
    echo "tensor cores rc=$?" | tee -a "$OUT/steps.txt"
  else
    skipped "tensor cores" "$budget" "${STEP_FLOOR_S:-30}"
  fi
fi
if [ "$PIPE_S" -gt 0 ]; then
  # one seed of the six heads (or PIPE_HEADS'); a unit past its limit is stopped and named in
  # the report, one that could not finish before the step's end is not started (named too),
  # and the report is rewritten after every unit
  step "pipeline: ${PIPE_PRESET:-quick}, one seed" | tee -a "$OUT/steps.txt"
  budget=$(( $(left) - 10 - ${TRITON_S:-0} - ${REPEAT_S:-0} - KEPT_S ))
  rm -rf $WORK/pipeline
  if [ "$budget" -ge "${STEP_FLOOR_S:-30}" ]; then
    timeout -k 10 "$budget" "$PY" -m bench pipeline --preset "${PIPE_PRESET:-quick}" \
      --seeds 1 --device "${BENCH_DEVICE:-cuda}" --jobs 1 ${PIPE_HEADS:+--heads "$PIPE_HEADS"} \
      --unit-time-limit "${PIPE_UNIT_S:-$(( budget / 6 ))}" \
      --time-limit $(( budget - BACKSTOP_S )) --no-progress --out $WORK/pipeline \
      >>"$OUT/bench.log" 2>&1
    echo "pipeline rc=$?" | tee -a "$OUT/steps.txt"
  else
    skipped pipeline "$budget" "${STEP_FLOOR_S:-30}"
  fi
fi
if [ "$KEPT_S" -gt 0 ]; then
  # the kept-fraction sweep's training-step pass: sparse `cuda` and `torch` on the K kept
  # values against dense `cuda`/`torch` on the masked weight and the replaced MLP, at each
  # head's matched μ (the pruned head) and the sweep's μ around it; its layout crossover table
  # is what prune(layout="auto") reads on this GPU kind (glai_kernels/dispatch/crossover.py).
  # Heads in the preset's order, each μ ascending: the time limit cuts the last ones.
  step "kept sweep: step pass" | tee -a "$OUT/steps.txt"
  budget=$(( $(left) - 10 - ${TRITON_S:-0} - ${REPEAT_S:-0} ))
  [ "$budget" -gt "$KEPT_S" ] && budget=$KEPT_S
  rm -rf $WORK/bench_cuda/kept_step
  if [ "$budget" -lt "${STEP_FLOOR_S:-30}" ]; then
    skipped "kept step" "$budget" "${STEP_FLOOR_S:-30}"
  else
  timeout -k 10 "$budget" "$PY" -m bench run --suite kernels --device "${BENCH_DEVICE:-cuda}" \
    --preset default --sweeps kept_fraction --passes step --batches 16,32 \
    ${KEPT_HEADS:+--heads "$KEPT_HEADS"} --dtypes float32 --peers none \
    --backends "${KEPT_BACKENDS:-torch,cuda,sparse:cuda,sparse:torch}" --rounds 3 \
    --min-time 0.05 --energy-window 0 --time-limit $(( budget - BACKSTOP_S )) \
    --out $WORK/bench_cuda/kept_step --no-history --no-plots >>"$OUT/bench.log" 2>&1
  echo "kept step rc=$?" | tee -a "$OUT/steps.txt"
  grep -H -m1 '"crossover"' $WORK/bench_cuda/kept_step/dispatch/*.layout_crossover.json \
    2>/dev/null | tee -a "$OUT/steps.txt" | grep -q . ||
    echo "no layout crossover table (too few step rows measured)" | tee -a "$OUT/steps.txt"
  fi
fi
if [ "${TRITON_S:-0}" -gt 0 ]; then
  # triton tunes each new shape (a few seconds, predicted; tens before issue 38): a few heads
  # of its own, its first call per shape a warm-up the suite does not time. It starts cold
  # (no kept choice of glai_kernels/triton_tuning.py, no compiled kernel), so each first call
  # is what a new shape costs on a fresh machine, tuning and compiling included
  step "triton at ${TRITON_HEADS:-A1,C2}, B ${TRITON_BATCHES:-16,256,4096}" \
    | tee -a "$OUT/steps.txt"
  budget=$(( $(left) - 10 - ${REPEAT_S:-0} ))
  rm -rf "$GLAI_KERNELS_CACHE/triton-autotune" $WORK/triton_cold $WORK/bench_cuda_triton
  if [ "$budget" -lt "${STEP_FLOOR_S:-30}" ]; then
    skipped triton "$budget" "${STEP_FLOOR_S:-30}"
  else
  TRITON_CACHE_DIR=$WORK/triton_cold timeout -k 10 "$budget" "$PY" -m bench run --suite kernels \
    --device "${BENCH_DEVICE:-cuda}" --preset "${TRITON_PRESET:-default}" --sweeps heads \
    --heads "${TRITON_HEADS:-A1,C2}" --batches "${TRITON_BATCHES:-16,256,4096}" --dtypes float32 \
    --passes "${TRITON_PASSES:-forward,train,both}" \
    --peers none --backends torch,cuda,triton --rounds 3 --min-time 0.05 --energy-window 0 \
    --time-limit $(( budget - BACKSTOP_S )) --out $WORK/bench_cuda_triton --no-history \
    --no-plots >>"$OUT/bench.log" 2>&1
  echo "triton rc=$?" | tee -a "$OUT/steps.txt"
  cp -r "$GLAI_KERNELS_CACHE/triton-autotune" $WORK/bench_cuda_triton/ 2>/dev/null
  "$PY" -m bench.tools.lease_summaries triton $WORK/bench_cuda_triton >>"$OUT/bench.log" 2>&1
  fi
fi
if [ "${REPEATS:-0}" -gt 0 ]; then
  # the host-bound small heads' medians move between runs (docs/notes/cuda.md, "An H200 lease"):
  # the same cells again, each run its own folder, for `glai-bench merge --repeats`
  for k in $(seq "$REPEATS"); do
    step "repeat $k of $REPEATS at ${REPEAT_HEADS:-A1,A2,C1,C2}" | tee -a "$OUT/steps.txt"
    budget=$(( ($(left) - 10) / (REPEATS - k + 1) ))
    if [ "$budget" -lt 40 ]; then skipped "repeat $k" "$budget" 40; break; fi
    timeout -k 10 "$budget" "$PY" -m bench run --suite kernels --device "${BENCH_DEVICE:-cuda}" \
      --sweeps heads --heads "${REPEAT_HEADS:-A1,A2,C1,C2}" --batches "${REPEAT_BATCHES:-16,32}" \
      --dtypes float32 --passes forward,both --peers einsum \
      --backends "${BENCH_BACKENDS:-einsum,torch,cuda}" --rounds 3 --min-time 0.05 \
      --energy-window 0 --time-limit $(( budget - BACKSTOP_S )) --out "$WORK/bench_repeat$k" \
      --no-history --no-plots >>"$OUT/bench.log" 2>&1
    echo "repeat $k rc=$?" | tee -a "$OUT/steps.txt"
  done
fi
# only the folders the steps left (a skipped step leaves none)
kept=$(ls -d "$WORK"/bench_cuda "$WORK"/bench_cuda_triton "$WORK"/bench_repeat* \
  "$WORK"/pipeline "$WORK"/anatomy 2>/dev/null | xargs -r -n1 basename)
if [ -n "$kept" ]; then
  tar -czf "$OUT/bench_cuda.tgz" -C "$WORK" $kept 2>>"$OUT/steps.txt"
else
  echo "no archive: no step left a report" | tee -a "$OUT/steps.txt"
fi

step done | tee -a "$OUT/steps.txt"
head -4 "$OUT/build.log"; tail -15 "$OUT/bench.log" 2>/dev/null
if [ -f $WORK/bench_cuda/summary.md ]; then sed -n 1,40p $WORK/bench_cuda/summary.md
else echo "no summary (step skipped/killed)"; fi
sed -n 1,12p $WORK/pipeline/table3.md 2>/dev/null; tail -25 "$OUT/tests.log" 2>/dev/null
head -c 4000 "$OUT/failures.txt" 2>/dev/null || true
