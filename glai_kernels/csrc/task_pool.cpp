// glai_pool::run (task_pool.h): helper threads watch for the next job for a while, then sleep
// on a condition variable.
#include "task_pool.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

namespace glai_pool {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct Job {
  Task task;
  void* ctx;
  int64_t n;
  std::atomic<int64_t> next{0};   // the next task to claim
  std::atomic<int64_t> done{0};   // tasks finished
  std::atomic<int> slots{0};      // helpers still allowed to join
  std::atomic<int> runners{0};    // threads that ran at least one task
  std::mutex lock;                // with `finished`: the caller sleeps until the last task ends
  std::condition_variable finished;
};

// Claims and runs tasks until none is left; whoever finishes the last task wakes the caller.
void work(Job& job) {
  bool counted = false;
  for (int64_t t = job.next.fetch_add(1); t < job.n; t = job.next.fetch_add(1)) {
    // counted before its first task ends, so the caller, once every task is done, sees it
    if (!counted) {
      job.runners.fetch_add(1, std::memory_order_relaxed);
      counted = true;
    }
    job.task(job.ctx, t);
    if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.n) {
      const std::lock_guard<std::mutex> guard(job.lock);
      job.finished.notify_all();
    }
  }
}

// The caller's wait for tasks still running on helpers: a short spin, then sleep. Sleeping,
// not yielding, matters: it leaves the caller's core idle, so the scheduler moves a helper
// that is waiting for a core there, e.g. behind an OpenMP worker of torch's that spins after
// its own parallel region (docs/notes/cpu-kernels.md, "Two threads without waiting ...").
void wait_done(Job& job) {
  for (int spins = 0; spins < 1000; ++spins)
    if (job.done.load(std::memory_order_acquire) >= job.n) return;
  std::unique_lock<std::mutex> guard(job.lock);
  job.finished.wait(guard, [&] { return job.done.load(std::memory_order_acquire) >= job.n; });
}

class Pool {
 public:
  // The job goes to the helpers by shared_ptr: a helper that wakes late keeps it alive
  // itself, so the caller may return (and its job die) whenever the tasks are done.
  int run(int64_t n, int helpers, Task task, void* ctx) {
    auto job = std::make_shared<Job>();
    job->task = task;
    job->ctx = ctx;
    job->n = n;
    job->slots.store(helpers);
    {
      const std::lock_guard<std::mutex> guard(lock_);
      while (started_ < helpers) {
        std::thread(&Pool::loop, this).detach();
        ++started_;
      }
      job_ = job;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    work(*job);
    wait_done(*job);
    {
      const std::lock_guard<std::mutex> guard(lock_);
      if (job_ == job) job_.reset();
    }
    return job->runners.load();
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      spin_for_next(seen);
      {
        std::unique_lock<std::mutex> guard(lock_);
        wake_.wait(guard, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      // more helpers than this job asked for exist when the thread count went down
      if (job && job->slots.fetch_sub(1) > 0) work(*job);
    }
  }

  // After a job a helper watches for the next one for kSpin before it sleeps: the calls of
  // a training step come tens of µs apart, and a sleeping helper took about as long as a
  // whole pass to wake (at the paper's B = 16 a pass is 25-150 µs; docs/notes/cpu-kernels.md, "The
  // paper's batch at two threads").
  static constexpr std::chrono::microseconds kSpin{200};
  void spin_for_next(uint64_t seen) const {
    if (seen == 0) return;
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (published_.load(std::memory_order_acquire) != seen) return;
        cpu_relax();
      }
      if (std::chrono::steady_clock::now() >= until) return;
    }
  }

  std::atomic<uint64_t> published_{0};  // generation_, readable without the lock
  std::mutex lock_;
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  int started_ = 0;
};

// The same job on torch's OpenMP team: one region of helpers + 1 threads, each claiming
// tasks from a shared counter until none is left (the region's end waits for its threads).
int run_on_openmp(int64_t n, int helpers, Task task, void* ctx) {
  std::atomic<int64_t> next{0};
  std::atomic<int> runners{0};
  at::parallel_for(0, helpers + 1, 1, [&](int64_t, int64_t) {
    int64_t t = next.fetch_add(1, std::memory_order_relaxed);
    if (t < n) runners.fetch_add(1, std::memory_order_relaxed);
    for (; t < n; t = next.fetch_add(1, std::memory_order_relaxed)) task(ctx, t);
  });
  return runners.load();
}

Runner runner_from_environment() {
  Runner r = kDefaultRunner;
  const char* name = std::getenv("GLAI_KERNELS_RUNNER");
  if (name != nullptr) runner_named(name, &r);
  return r;
}

std::atomic<Runner> g_runner{runner_from_environment()};
const pid_t g_loaded_by = getpid();  // the process that loaded the library

}  // namespace

bool runner_named(const char* name, Runner* out) {
  if (std::strcmp(name, "pool") == 0) *out = Runner::kPool;
  else if (std::strcmp(name, "openmp") == 0) *out = Runner::kOpenMP;
  else return false;
  return true;
}
const char* runner_name(Runner r) { return r == Runner::kPool ? "pool" : "openmp"; }

Runner runner() { return g_runner.load(); }
void select_runner(Runner r) { g_runner.store(r); }

int run(int64_t n, int helpers, Task task, void* ctx) {
  if (helpers <= 0 || n <= 1) {
    for (int64_t t = 0; t < n; ++t) task(ctx, t);
    return n > 0 ? 1 : 0;
  }
  if (g_runner.load() == Runner::kOpenMP) {
    // GNU OpenMP's team does not survive fork(): a child of a process that used it hangs in
    // its first region, so a forked child runs its jobs on a pool of its own (below)
    if (getpid() == g_loaded_by) return run_on_openmp(n, helpers, task, ctx);
  }
  // a forked child has the parent's pool object but none of its threads (nor, maybe, a
  // usable lock): it starts a pool of its own, the old one left as it is
  static std::atomic<Pool*> pool{nullptr};
  static std::atomic<pid_t> owner{0};
  const pid_t pid = getpid();
  Pool* current = pool.load();
  if (current == nullptr || owner.load() != pid) {
    static std::mutex creating;
    const std::lock_guard<std::mutex> guard(creating);
    current = pool.load();
    if (current == nullptr || owner.load() != pid) {
      current = new Pool();  // never freed: helpers sleep in it until the process ends
      pool.store(current);
      owner.store(pid);
    }
  }
  return current->run(n, helpers, task, ctx);
}

int64_t threads_for(int64_t n, int64_t work, int64_t min_work_per_thread, int64_t available) {
  const int64_t by_work = std::max<int64_t>(1, work / std::max<int64_t>(1, min_work_per_thread));
  return std::max<int64_t>(1, std::min<int64_t>({available, n, by_work}));
}

}  // namespace glai_pool
