// A task runner for the CPU kernels: the caller and its helpers claim tasks one at a time from
// a shared counter, so a thread that starts late holds no work, and results do not depend on
// which thread ran a task (each kernel task owns its outputs): the same bits for any thread
// count or schedule.
//
// The helpers are torch's OpenMP team by default (one region per job): its workers are awake
// after torch's own parallel ops and take our tasks at once, measured 8-22% faster per step at
// the paper's B = 16 than this file's own pool, and no slower at large sizes
// (docs/notes/cpu-kernels.md, "The kernels' tasks on torch's OpenMP team"). The pool (a caller that
// returns once every task is done, never waiting for a helper that has not started; helpers that
// watch for the next job for 200 us) stays for forked children, where GNU OpenMP's team hangs, and
// on request ($GLAI_KERNELS_RUNNER=pool, glai_ext::cpu_runner).
#pragma once

#include <cstdint>

namespace glai_pool {

using Task = void (*)(void* ctx, int64_t task);

// Who runs a job's tasks besides the caller: the pool's own helper threads, or torch's OpenMP
// team (one parallel region; docs/notes/cpu-kernels.md, "The kernels' tasks on torch's OpenMP
// team"). $GLAI_KERNELS_RUNNER ("pool" or "openmp") picks at load; glai_ext::cpu_runner switches.
enum class Runner { kPool, kOpenMP };
constexpr Runner kDefaultRunner = Runner::kOpenMP;
Runner runner();
void select_runner(Runner r);
// The runner called `name` ("pool" or "openmp") into *out; false, *out untouched, otherwise.
bool runner_named(const char* name, Runner* out);
const char* runner_name(Runner r);

// Runs task(ctx, t) once for every t in [0, n), on the calling thread and up to `helpers`
// pool threads (0: the caller alone). Returns how many distinct threads ran at least one task.
int run(int64_t n, int helpers, Task task, void* ctx);

// How many threads a job of `n` tasks and `work` units should use, of `available`: fewer for
// small work (one per `min_work_per_thread`), never more than the tasks, at least one.
int64_t threads_for(int64_t n, int64_t work, int64_t min_work_per_thread, int64_t available);

}  // namespace glai_pool
