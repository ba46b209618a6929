// CPU emulation of the nvcuda::wmma subset estimator_kernels.cu uses (tests only).
//
// A fragment holds the whole 16x16 tile as floats in every thread of the warp (the API's
// contract, not the hardware's distribution); mma_sync multiplies exactly and accumulates in
// float. The real API's pointer and leading-dimension rules are checked, and a violation
// fails the launch as a misaligned address would on the device: pointers 256-bit aligned,
// ldm a multiple of 16 bytes.
#pragma once

#include <cstdint>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {
  static constexpr bool is_col = false;
};
struct col_major {
  static constexpr bool is_col = true;
};
enum layout_t { mem_row_major, mem_col_major };

// m16n16k16 for every element type the kernels use (__half and __nv_bfloat16 operands, float
// accumulators); each element is held as the float it converts to exactly
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation covers m16n16k16");
  static constexpr int num_elements = 16 * 16;
  float x[16 * 16];
};

inline float value(float v) { return v; }
inline float value(__half v) { return __half2float(v); }
inline float value(__nv_bfloat16 v) { return __bfloat162float(v); }

// pointers 256-bit aligned, ldm a multiple of 16 bytes; a violation fails the launch
template <typename T>
void check_layout(const T* p, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0)
    glai_emulation::sticky_error = cudaErrorMisalignedAddress;
}

// any fragment, m16n16k16 or TF32's m16n16k8 (mma_tf32.h)
template <typename Use, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, K, T, Layout>& f, float v) {
  for (float& e : f.x) e = v;
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  check_layout(p, ldm);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = value(Layout::is_col ? p[c * ldm + r] : p[r * ldm + c]);
}

template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[16 * 16];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float sum = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k) sum += a.x[r * 16 + k] * b.x[k * 16 + n];
      out[r * 16 + n] = sum;
    }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

// Every lane holds the same tile; lane 0 writes it (the kernel synchronises before reading).
// K: 16, or TF32's 8 (mma_tf32.h); the accumulator is 16 x 16 either way.
template <int K>
void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, K, float>& f, unsigned ldm,
                       layout_t layout) {
  check_layout(p, ldm);
  if (threadIdx.x % 32 != 0) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

}  // namespace nvcuda::wmma

#include "mma_tf32.h"  // precision::tf32 and m16n16k8 (issue 38)
