// CPU emulation of the CUDA runtime subset estimator_kernels.cu uses, for tests only
// (correctness/test_cuda_emulated.py). Each block runs its threads as std::threads with a
// std::barrier for __syncthreads; blocks run one after another, so `__shared__` can be a
// function-local static. Kernels are launched through glai_emulated_launch (the .cu's
// GLAI_LAUNCH macro under GLAI_CUDA_EMULATION).
#pragma once

#include <atomic>
#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>

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
inline thread_local uint3 thread_index{}, block_index{};
inline thread_local dim3 block_dim{}, grid_dim{};
inline thread_local std::barrier<>* block_barrier = nullptr;
inline int compute_capability = 80;
// what a kernel did wrong, reported by the next cudaGetLastError as the device would
inline std::atomic<int> sticky_error{cudaSuccess};
}  // namespace glai_emulation

#define threadIdx (glai_emulation::thread_index)
#define blockIdx (glai_emulation::block_index)
#define blockDim (glai_emulation::block_dim)
#define gridDim (glai_emulation::grid_dim)

inline void __syncthreads() { glai_emulation::block_barrier->arrive_and_wait(); }

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

// Runs kernel(args...) for every block of `grid`, each block's threads concurrently.
template <typename... Params, typename... Args>
void glai_emulated_launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t,
                          Args... args) {
  const unsigned threads = block.x * block.y * block.z;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> barrier(threads);
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (unsigned t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            glai_emulation::thread_index = {t % block.x, (t / block.x) % block.y,
                                            t / (block.x * block.y)};
            glai_emulation::block_index = {x, y, z};
            glai_emulation::block_dim = block;
            glai_emulation::grid_dim = grid;
            glai_emulation::block_barrier = &barrier;
            kernel(args...);
          });
        }
        for (auto& th : pool) th.join();
      }
}

extern "C" void glai_emulation_set_compute_capability(int cc) {  // one TU includes this
  glai_emulation::compute_capability = cc;
}
