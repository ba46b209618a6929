// Asynchronous global -> shared copies (cp.async, sm_80+) behind three calls, so a kernel's
// pipeline reads the same on every architecture and the CPU emulation can replace them
// (correctness/cuda_emulation/async_copy_emulation.h, under GLAI_CUDA_EMULATION):
//   copy16(dst, src, valid)  16 bytes src -> dst (both 16-byte aligned); zeros when !valid
//   commit()                 closes the copies issued since the last commit into one group
//   wait<N>()                returns once at most N committed groups are still in flight
// Below sm_80 copy16 is a plain 16-byte load and store (complete on return) and commit/wait do
// nothing: the same pipeline then runs without overlap. A kernel drains with wait<0>() before
// it reuses a stage's memory for anything else, and before it returns.
#pragma once

#ifdef GLAI_CUDA_EMULATION
#include <async_copy_emulation.h>
#else

#include <cuda_runtime.h>

namespace glai_async {

__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned shared = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  // src-size 0 reads nothing and fills the 16 bytes with zeros (a tile's edge)
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(src),
               "r"(bytes)
               : "memory");
#else
  *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace glai_async

#endif  // GLAI_CUDA_EMULATION
