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
#include <torch/library.h>

#include "eager_node.h"

#include <string>
#include <tuple>
#include <vector>

namespace glai_ext {
namespace {

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

// The node the eager path records (eager_node.h: its plumbing, shared with the sparse op's):
// the backward op glai_ext::backward, or glai::estimator_backward for a graph.
struct EstimatorBackward : public eager::EagerBackward<EstimatorBackward> {
  std::vector<at::Tensor> graph_backward(const eager::BackwardArgs& a) {
    return call_backward_op(a.dy, a.x, a.act, a.weight, a.saved, a.need_x, a.need_act,
                            a.need_weight, backend);
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor> direct_backward(const eager::BackwardArgs& a) {
    return call_backward(a.dy.contiguous(), a.x, a.act, a.weight, a.saved, a.need_x, a.need_act,
                         a.need_weight);
  }

  std::string name() const override { return "glai::EstimatorBackward"; }
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
  eager::record<EstimatorBackward>(y, x, act, weight, bias, saved, backend);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, Autograd, m) { m.impl("estimator_eager", &estimator_eager); }

}  // namespace glai_ext
