// The sparse kept-path estimator's glai_ext ops: their schemas, defined once per library.
//
//   glai_ext::sparse_forward(x [B, I], act [B, P], values [K], index, save)
//       -> (y [B, O], saved): saved is Zg^T [G, B] in the accumulation type (float32 for
//          float16/bfloat16, else the inputs' dtype) when `save`, else empty
//   glai_ext::sparse_backward(dy [B, O], x, act, values, index, saved, needs [3])
//       -> (dx [B, I], dact [B, P], dvalues [K]), each empty [0] when not in needs
//
// `index` is the ten KeptIndex tensors in field order (glai_kernels/sparse/layout.py).
//
// Every source that implements these ops (CPU or CUDA) calls define_sparse_schemas() from a
// static initialiser instead of m.def-ing them: the function-local statics of an inline
// function are one object per shared library, so the schemas are defined exactly once
// whichever sources are built and in whatever order their initialisers run (an impl
// registered before its schema is held by the dispatcher until the schema arrives).
#pragma once

#include <torch/library.h>

namespace glai_ext {

inline constexpr const char* kSparseForwardSchema =
    "sparse_forward(Tensor x, Tensor act, Tensor values, Tensor[] index, bool save)"
    " -> (Tensor, Tensor)";
inline constexpr const char* kSparseBackwardSchema =
    "sparse_backward(Tensor dy, Tensor x, Tensor act, Tensor values, Tensor[] index,"
    " Tensor saved, bool[] needs) -> (Tensor, Tensor, Tensor)";

inline bool define_sparse_schemas() {
  static torch::Library library(torch::Library::FRAGMENT, "glai_ext", std::nullopt, __FILE__,
                                __LINE__);
  static const bool defined = [] {
    library.def(kSparseForwardSchema);
    library.def(kSparseBackwardSchema);
    return true;
  }();
  return defined;
}

}  // namespace glai_ext
