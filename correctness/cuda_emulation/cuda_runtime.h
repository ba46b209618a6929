// CPU emulation of the CUDA runtime subset estimator_kernels.cu uses, for tests only
// (correctness/test_cuda_emulated.py). A block's threads are fibers (ucontext) on the calling
// thread: each runs until it reaches __syncthreads or ends, then the next one runs, so a
// barrier is one round over the block; blocks run one after another, so `__shared__` can be
// a function-local static. One OS thread: no load on other processes, no data races. Kernels
// are launched through glai_emulated_launch (the .cu's GLAI_LAUNCH under GLAI_CUDA_EMULATION).
#pragma once

#include <ucontext.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 800  // the device code under test is the sm_80 one
#endif

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMisalignedAddress = 716 };
enum cudaDeviceAttr {
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMultiProcessorCount = 16,
};
typedef struct CUstream_st* cudaStream_t;

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace glai_emulation {
inline uint3 thread_index{}, block_index{};
inline dim3 block_dim{}, grid_dim{};
inline int compute_capability = 80;
// what a kernel did wrong, reported by the next cudaGetLastError as the device would
inline std::atomic<int> sticky_error{0};

struct Fiber {
  ucontext_t context;
  bool done;
};
inline ucontext_t scheduler;
inline Fiber* fibers = nullptr;
inline unsigned current = 0;
inline void (*body)(void*) = nullptr;
inline void* body_argument = nullptr;

inline void run_fiber() {
  body(body_argument);
  fibers[current].done = true;  // returning resumes the scheduler (uc_link)
}
}  // namespace glai_emulation

#define threadIdx (glai_emulation::thread_index)
#define blockIdx (glai_emulation::block_index)
#define blockDim (glai_emulation::block_dim)
#define gridDim (glai_emulation::grid_dim)

inline void __syncthreads() {
  using namespace glai_emulation;
  swapcontext(&fibers[current].context, &scheduler);
}

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  const int cc = glai_emulation::compute_capability;
  *value = attr == cudaDevAttrComputeCapabilityMajor ? cc / 10
           : attr == cudaDevAttrComputeCapabilityMinor ? cc % 10 : 132;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  return static_cast<cudaError_t>(glai_emulation::sticky_error.exchange(cudaSuccess));
}
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "ok" : "error"; }

// Runs kernel(args...) for every block of `grid`, the block's threads as fibers in rounds.
template <typename... Params, typename... Args>
void glai_emulated_launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t,
                          Args... args) {
  using namespace glai_emulation;
  constexpr size_t kStack = 128 * 1024;
  const unsigned threads = block.x * block.y * block.z;
  auto call = [&] { kernel(args...); };
  body = [](void* f) { (*static_cast<decltype(call)*>(f))(); };
  body_argument = &call;
  Fiber* pool = static_cast<Fiber*>(std::calloc(threads, sizeof(Fiber)));
  char* stacks = static_cast<char*>(std::malloc(threads * kStack));
  fibers = pool;
  block_dim = block;
  grid_dim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_index = {x, y, z};
        for (unsigned t = 0; t < threads; ++t) {
          getcontext(&pool[t].context);
          pool[t].context.uc_stack.ss_sp = stacks + t * kStack;
          pool[t].context.uc_stack.ss_size = kStack;
          pool[t].context.uc_link = &scheduler;
          makecontext(&pool[t].context, run_fiber, 0);
          pool[t].done = false;
        }
        for (bool running = true; running;) {  // one round = every thread to its next barrier
          running = false;
          for (unsigned t = 0; t < threads; ++t) {
            if (pool[t].done) continue;
            current = t;
            thread_index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            swapcontext(&scheduler, &pool[t].context);
            running |= !pool[t].done;
          }
        }
      }
  std::free(stacks);
  std::free(pool);
}

extern "C" void glai_emulation_set_compute_capability(int cc) {  // one TU includes this
  glai_emulation::compute_capability = cc;
}
