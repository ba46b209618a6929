// Num<T>: a storage type's accumulation type (at::opmath_type's rule: float for the half
// types) and its conversions in and out, shared by estimator_kernels.cu and sparse_kernels.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace glai_cuda_num {

template <typename T>
struct Num;
template <>
struct Num<float> {
  using acc = float;
  __device__ static float in(float v) { return v; }
  __device__ static float out(float v) { return v; }
};
template <>
struct Num<double> {
  using acc = double;
  __device__ static double in(double v) { return v; }
  __device__ static double out(double v) { return v; }
};
template <>
struct Num<__half> {
  using acc = float;
  __device__ static float in(__half v) { return __half2float(v); }
  __device__ static __half out(float v) { return __float2half_rn(v); }
};
template <>
struct Num<__nv_bfloat16> {
  using acc = float;
  __device__ static float in(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 out(float v) { return __float2bfloat16_rn(v); }
};

}  // namespace glai_cuda_num
