// The sparse op's two kernels called through the dispatcher from C++ (the eager autograd node,
// sparse_eager_autograd.cpp, and the engineered steps, engineered_steps.cpp): one typed handle
// each, looked up once, so the calls take the registered CPU kernels' checks and bodies.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>
#include <utility>

namespace glai_ext {

// glai_ext::sparse_forward: (y, the group sums Zg^T when `save`, else empty)
inline std::tuple<at::Tensor, at::Tensor> sparse_forward_call(const at::Tensor& x,
                                                              const at::Tensor& act,
                                                              const at::Tensor& values,
                                                              at::TensorList index, bool save) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::sparse_forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, at::TensorList, bool)>();
  return op.call(x, act, values, index, save);
}

// glai_ext::sparse_backward: (dx, dact, dvalues), those `needs` asks for
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_backward_call(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act, const at::Tensor& values,
    at::TensorList index, const at::Tensor& saved, c10::List<bool> needs) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::sparse_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              at::TensorList, const at::Tensor&, c10::List<bool>)>();
  return op.call(dy, x, act, values, index, saved, std::move(needs));
}

// glai_ext::sparse_forward_ones (CPU): x [B, I - 1] without the index's constant-1 last input:
// (y, Zg^T when `save`, xt [I, ld] with the ones row, for sparse_backward_xt_call)
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_forward_ones_call(
    const at::Tensor& x, const at::Tensor& act, const at::Tensor& values, at::TensorList index,
    bool save) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::sparse_forward_ones", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList, bool)>();
  return op.call(x, act, values, index, save);
}

// glai_ext::sparse_backward_xt (CPU): sparse_backward from the forward's xt; dx [B, I - 1]
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_backward_xt_call(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& xt, const at::Tensor& act,
    const at::Tensor& values, at::TensorList index, const at::Tensor& saved,
    c10::List<bool> needs) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::sparse_backward_xt", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, at::TensorList, const at::Tensor&, c10::List<bool>)>();
  return op.call(dy, x, xt, act, values, index, saved, std::move(needs));
}

}  // namespace glai_ext
