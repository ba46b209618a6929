// glai_ext::estimator_eager(x, act, weight, bias?, save, backend) -> y: the estimator with its
// autograd node in C++, the `cpp` backend's eager path (glai_kernels/op.py: eager calls on
// plain tensors whose inputs need gradients).
//
// The same bodies as op.py's Python Function: the forward is glai_ext::forward (Z kept when
// `save`) plus bias, the backward glai_ext::backward and dbias = dy summed over b in the
// accumulation dtype (contract.bias_gradient). With no Python in the node, a step at the
// paper's B = 16 is 20-45 us shorter (docs/notes/cpu-kernels.md, "The eager node in C++"). A
// backward that builds a graph (create_graph) calls the custom op glai::estimator_backward with
// `backend`, whose own autograd formula gives gradients of gradients, as the Python Function does.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "glai_ext.h"

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace glai_ext {
namespace {

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

std::tuple<at::Tensor, at::Tensor> call_forward(const at::Tensor& x, const at::Tensor& act,
                                                const at::Tensor& weight, bool save) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, bool)>();
  return op.call(x, act, weight, save);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act, const at::Tensor& weight,
    const at::Tensor& saved, bool need_x, bool need_act, bool need_weight) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, bool, bool, bool)>();
  return op.call(dy, x, act, weight, saved, need_x, need_act, need_weight);
}

// glai::estimator_backward (registered from Python with its own autograd): for create_graph.
std::vector<at::Tensor> call_backward_op(const at::Tensor& dy, const at::Tensor& x,
                                         const at::Tensor& act, const at::Tensor& weight,
                                         const at::Tensor& saved, bool need_x, bool need_act,
                                         bool need_weight, const std::string& backend) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("glai::estimator_backward", "");
  std::vector<c10::IValue> stack{dy, x, act, weight, saved,
                                 c10::List<bool>({need_x, need_act, need_weight}), backend};
  op.callBoxed(&stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

// The node the eager path records: a plain autograd Node, as torch's generated nodes are, not
// a torch::autograd::Function (whose CppNode, context and saved_data map cost ~2-3 us a
// step at the paper's B = 16; docs/notes/cpu-kernels.md, "The eager node without CppNode"). Its
// next edges are x, act, weight and bias (an empty edge when there is no bias).
struct EstimatorBackward : public torch::autograd::Node {
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
      if (at::GradMode::is_enabled()) {
        auto g = call_backward_op(dy, x, act, weight, saved, need_x, need_act, need_weight,
                                  backend);
        for (int k = 0; k < 3; ++k) out[k] = g[k];
      } else {
        at::AutoDispatchBelowADInplaceOrView below;
        std::tie(out[0], out[1], out[2]) = call_backward(dy.contiguous(), x, act, weight, saved,
                                                         need_x, need_act, need_weight);
      }
      if (!need_x) out[0] = at::Tensor();
      if (!need_act) out[1] = at::Tensor();
      if (!need_weight) out[2] = at::Tensor();
    }
    if (need_bias) out[3] = dy.sum(0, false, opmath(dy.scalar_type())).to(dy.scalar_type());
    return out;
  }

  std::string name() const override { return "glai::EstimatorBackward"; }

  // after a backward without retain_graph: frees the saved tensors (a second backward then
  // fails with autograd's own message)
  void release_variables() override {
    x_.reset_data();
    act_.reset_data();
    weight_.reset_data();
    saved_.reset_data();
  }

  torch::autograd::SavedVariable x_, act_, weight_, saved_;
  std::string backend;
  bool has_bias = false;
};

at::Tensor estimator_eager(const at::Tensor& x, const at::Tensor& act, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, bool save,
                           c10::string_view backend) {
  const bool has_bias = bias.has_value() && bias->defined();
  at::Tensor y, saved;
  {
    // below autograd: this node is the only one recorded
    at::AutoDispatchBelowADInplaceOrView below;
    std::tie(y, saved) = call_forward(x, act, weight, save);
    if (has_bias) y = y.add(*bias);
  }
  if (!torch::autograd::compute_requires_grad(x, act, weight, bias)) return y;
  auto node = make_node<EstimatorBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, act, weight, bias));
  node->x_ = torch::autograd::SavedVariable(x, false);
  node->act_ = torch::autograd::SavedVariable(act, false);
  node->weight_ = torch::autograd::SavedVariable(weight, false);
  node->saved_ = torch::autograd::SavedVariable(saved, false);
  node->backend = std::string(backend);
  node->has_bias = has_bias;
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, Autograd, m) { m.impl("estimator_eager", &estimator_eager); }

}  // namespace glai_ext
