// A task runner for the CPU kernels whose end waits for tasks, not for threads.
//
// at::parallel_for (OpenMP) ends a region when every worker has arrived, so a worker the
// scheduler has not started yet holds the caller back for as long as another process keeps
// its core: on this shared 2-core machine, milliseconds for a pass of 0.1 ms (bench/NOTES.md,
// "Small batch", item 4). Here the caller publishes a job, runs tasks from a shared counter
// itself, and returns once every task is done: a helper that wakes after the counter ran out
// does nothing, and nothing waits for it. Results do not depend on which thread ran a task
// (each kernel task owns its outputs), so the same bits for any thread count or schedule.
#pragma once

#include <cstdint>

namespace glai_pool {

using Task = void (*)(void* ctx, int64_t task);

// Runs task(ctx, t) once for every t in [0, n), on the calling thread and up to `helpers`
// pool threads (0: the caller alone). Returns how many distinct threads ran at least one task.
int run(int64_t n, int helpers, Task task, void* ctx);

// How many threads a job of `n` tasks and `work` units should use, of `available`: fewer for
// small work (one per `min_work_per_thread`), never more than the tasks, at least one.
int64_t threads_for(int64_t n, int64_t work, int64_t min_work_per_thread, int64_t available);

}  // namespace glai_pool
