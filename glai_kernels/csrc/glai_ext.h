// Shared by the CPU and CUDA bindings: the argument checks of the glai_ext ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glai_ext {

struct Sizes {
  int64_t batch, inputs, paths, outputs;
};

// Ranks, dtypes, devices and sizes of (x [B, I], act [B, P], weight [O, I, P]).
Sizes check_problem(const at::Tensor& x, const at::Tensor& act, const at::Tensor& weight);
// dy [B, O] of x's dtype and device.
void check_dy(const at::Tensor& dy, const at::Tensor& x, const Sizes& s);
// The computation (and accumulation) type of a dtype: float for half types, else itself.
at::ScalarType opmath(at::ScalarType t);

}  // namespace glai_ext
