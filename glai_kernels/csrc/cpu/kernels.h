// The CPU kernels' interface: raw pointers and sizes, no torch headers.
//
// One problem is x [B, I], act [B, P], weight [O, I, P], all contiguous, computed in T
// (float or double: the binding converts half inputs to float, their opmath type).
// Each kernel is compiled once per instruction set (kernels.inc, included by
// cpu_dispatch.cpp); `kernels<T>()` returns the set chosen for this CPU at run time.
#pragma once

#include <cstdint>

namespace glai_cpu {

// Runs fn(ctx, begin, end) over contiguous chunks of [0, n), possibly on several threads;
// `flops` (the work of all n tasks) lets the runner keep small jobs on one thread. The binding
// implements it with its task pool (task_pool.h) on up to torch.get_num_threads() threads.
using TaskFn = void (*)(void* ctx, int64_t begin, int64_t end);
using ParallelFn = void (*)(int64_t n, int64_t flops, TaskFn fn, void* ctx);

// A bfloat16 dweight of this many bytes or more stores its full tiles past the caches (storing
// it through them would read every line before overwriting it); the float and double dweight
// streams from kernels.inc's kDweightStreamBytes (32 MiB, this machine's last-level cache).
constexpr int64_t kStreamBytes = int64_t{64} << 20;

template <typename T>
struct Problem {
  const T* x;       // [B, I]
  const T* act;     // [B, P]
  const T* weight;  // [O, I, P]
  int64_t batch, inputs, paths, outputs;
  int64_t threads;  // how many threads will run tasks: only shapes the task split
  ParallelFn parallel;
};

template <typename T>
struct Kernels {
  // y [B, O] = sum_{i,s} x act weight; z [B, O, P] (Z-form partials, kept for dact) if not null.
  // Returns 0, or 1 when scratch memory could not be allocated.
  int (*forward)(const Problem<T>& p, T* y, T* z);
  // Writes each gradient whose pointer is not null: dx [B, I], dact [B, P], dweight [O, I, P].
  // z is the forward's saved [B, O, P] or null (then dact is recomputed).
  int (*backward)(const Problem<T>& p, const T* dy, const T* z, T* dx, T* dact, T* dweight);
  // out [B, P] = bias + x weight[0] for a one-output problem (act unused, bias [P] or null),
  // or its 0/1 gates [> 0] when `gates`: a frozen layer (the path selector's).
  int (*linear)(const Problem<T>& p, const T* bias, T* out, bool gates);
};

template <typename T>
const Kernels<T>& kernels();

// bfloat16 problems (raw bf16 bits) on CPUs with AVX512_BF16, whose vdpbf16ps dot products run
// at twice the float rate; other CPUs convert bfloat16 to float and use kernels<float>().
// Z is float [B, O, P]: a kept partial sum is never rounded to bfloat16.
struct Bf16Kernels {
  int (*forward)(const Problem<uint16_t>& p, uint16_t* y, float* z);
  // also returns 2 when dact is wanted without a saved Z (the caller uses the float path)
  int (*backward)(const Problem<uint16_t>& p, const uint16_t* dy, const float* z,
                  uint16_t* dx, uint16_t* dact, uint16_t* dweight);
};

// The bfloat16 kernels if the instruction set in use is avx512 and the CPU has AVX512_BF16.
const Bf16Kernels* bf16_kernels();

// Scratch that outlives the call: `bytes` (a multiple of 64, 64-byte aligned) from the blocks
// kept for reuse (gradient_cache.cpp) when it is at least their 256 KiB bound, so a per-call
// buffer the size of the weight is not faulted in afresh every call; null when out of memory.
// Values are not cleared. Given back with free_kept and the same size.
void* alloc_kept(int64_t bytes);
void free_kept(void* p, int64_t bytes);

// dx at B within one vector takes the form along s for weights of at most this many bytes, the
// tall tile above (kernels.inc, dx_along_s). Measured per CPU vendor, since it is where the
// last-level cache stops feeding the form along s's scattered rows faster than the tall
// tile's contiguous blocks: 16 MiB on AMD (Zen 5), 4 MiB on Intel (a Xeon with a 300 MiB mesh
// L3); docs/notes/cpu-kernels.md, "dx along s on an Intel Xeon".
int64_t dx_along_s_max_weight_bytes();

// The dense binding's task runner (cpu_dense_binding.cpp: the task pool on up to
// torch.get_num_threads() threads, small jobs on one), for a Problem built outside the binding:
// the engineered MLP step's products on `linear` (engineered_steps.cpp).
ParallelFn dense_parallel();

// The instruction set in use ("avx512", "avx2", "portable").
const char* isa();
// Select an instruction set by name; returns false if unknown or unsupported by this CPU.
bool select_isa(const char* name);
// Comma-separated instruction sets this CPU can run, best first.
const char* supported_isas();

}  // namespace glai_cpu
