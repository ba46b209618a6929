// The plumbing of the eager autograd nodes, stated once: the dense op's (eager_autograd.cpp,
// glai_ext::estimator_eager) and the sparse op's (cpu/sparse_eager_autograd.cpp,
// glai_ext::sparse_estimator_eager). Each records one plain autograd Node, as torch's
// generated nodes are, not a torch::autograd::Function (whose CppNode, context and saved_data
// map cost ~2-3 us a step at the paper's B = 16;
// docs/notes/cpu-kernels.md, "The eager node without CppNode"). Its next edges are x, act, the
// weight (the dense [O, I, P] or the sparse values [K]) and bias (an empty edge when there is
// no bias).
//
// `EagerBackward<Op>` is that node's backward: for the gradients asked for, Op's
// `graph_backward` (the backward custom op, whose own autograd formula gives gradients of
// gradients: a backward that builds a graph) or, below autograd, Op's `direct_backward` (the
// kernels); dbias = dy summed over b in the accumulation dtype (contract.bias_gradient).
// `record<Op>` makes one for y and hangs it on y when an input needs a gradient.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include "glai_ext.h"

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace glai_ext {
namespace eager {

using torch::autograd::variable_list;

// torch 2.13 holds autograd nodes in c10::intrusive_ptr, earlier releases (2.11 checked)
// in std::shared_ptr; a node is made the way this torch's Edge holds one, so the
// extension builds against every torch the package's requirement admits.
using NodeHandle = decltype(torch::autograd::Edge::function);

template <class N>
auto make_node() {
  if constexpr (std::is_same_v<NodeHandle, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<N>();
  } else {
    return c10::make_intrusive<N>();
  }
}

// What a node's backward works on: dy [B, O], the inputs saved at the forward, what the
// forward kept (`saved`; undefined: nothing) and the gradients asked for.
struct BackwardArgs {
  const at::Tensor& dy;
  const at::Tensor& x;
  const at::Tensor& act;
  const at::Tensor& weight;
  const at::Tensor& saved;
  bool need_x, need_act, need_weight;
};

// The node of y = op(x, act, weight) + bias. `Op` (deriving from EagerBackward<Op>) gives
//   name();
//   graph_backward(const BackwardArgs&) -> std::vector<at::Tensor> {dx, dact, dweight},
//     through the backward custom op;
//   direct_backward(const BackwardArgs&) -> std::tuple of the three, the kernels (called
//     below autograd);
//   release_own(), to free what it saved beyond these (nothing by default).
// A gradient not asked for comes back undefined whatever Op returns for it.
template <class Op>
struct EagerBackward : public torch::autograd::Node {
  variable_list apply(variable_list&& grads) override {
    variable_list out(4);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;  // no gradient reached y: none for its inputs
    const bool need_x = task_should_compute_output(0), need_act = task_should_compute_output(1);
    const bool need_weight = task_should_compute_output(2);
    const bool need_bias = has_bias && task_should_compute_output(3);
    if (need_x || need_act || need_weight) {
      // unpacking checks the saved versions: an input changed in place since the forward
      // fails here, as for any autograd node
      const at::Tensor x = x_.unpack(), act = act_.unpack(), weight = weight_.unpack();
      const at::Tensor saved = saved_.unpack();
      Op& op = static_cast<Op&>(*this);
      const BackwardArgs args{dy, x, act, weight, saved, need_x, need_act, need_weight};
      if (at::GradMode::is_enabled()) {
        auto g = op.graph_backward(args);
        for (int k = 0; k < 3; ++k) out[k] = g[k];
      } else {
        at::AutoDispatchBelowADInplaceOrView below;
        std::tie(out[0], out[1], out[2]) = op.direct_backward(args);
      }
      if (!need_x) out[0] = at::Tensor();
      if (!need_act) out[1] = at::Tensor();
      if (!need_weight) out[2] = at::Tensor();
    }
    if (need_bias) out[3] = dy.sum(0, false, opmath(dy.scalar_type())).to(dy.scalar_type());
    return out;
  }

  // after a backward without retain_graph: frees the saved tensors (a second backward then
  // fails with autograd's own message)
  void release_variables() override {
    x_.reset_data();
    act_.reset_data();
    weight_.reset_data();
    saved_.reset_data();
    static_cast<Op&>(*this).release_own();
  }

  void release_own() {}

  torch::autograd::SavedVariable x_, act_, weight_, saved_;
  std::string backend;  // the backend's name, for the backward custom op
  bool has_bias = false;
};

// Records an `Op` node for y (the forward plus bias, computed below autograd by the caller)
// when x, act, weight or bias needs a gradient, saving the inputs as given (their versions are
// checked at the backward) and `saved` (what the forward kept; undefined: nothing). Returns the
// node, for the caller's own fields, or a null handle when nothing needs a gradient.
template <class Op>
auto record(const at::Tensor& y, const at::Tensor& x, const at::Tensor& act,
            const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
            const at::Tensor& saved, c10::string_view backend) -> decltype(make_node<Op>()) {
  if (!torch::autograd::compute_requires_grad(x, act, weight, bias)) return {};
  auto node = make_node<Op>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, act, weight, bias));
  node->x_ = torch::autograd::SavedVariable(x, false);
  node->act_ = torch::autograd::SavedVariable(act, false);
  node->weight_ = torch::autograd::SavedVariable(weight, false);
  node->saved_ = torch::autograd::SavedVariable(saved, false);
  node->backend = std::string(backend);
  node->has_bias = bias.has_value() && bias->defined();
  torch::autograd::set_history(y, node);
  return node;
}

}  // namespace eager
}  // namespace glai_ext
