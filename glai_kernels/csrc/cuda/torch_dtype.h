// The kernels' glai_dtype for a torch scalar type: shared by the dense and sparse CUDA
// bindings (the kernels' own headers know nothing of torch).
#pragma once

#include <ATen/core/Tensor.h>

#include "cuda/estimator_kernels.cuh"

namespace glai_ext {

// `op` names the caller in the error for a dtype no kernel takes (the Python layer refuses
// those first; this keeps a direct call of the op from reaching a kernel with one).
inline glai_dtype to_glai(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return GLAI_FLOAT32;
    case at::kDouble: return GLAI_FLOAT64;
    case at::kHalf: return GLAI_FLOAT16;
    case at::kBFloat16: return GLAI_BFLOAT16;
    default:
      TORCH_CHECK(false, op, ": dtype must be float32, float64, float16 or bfloat16, got ", t);
  }
}

}  // namespace glai_ext
