// glai_ext::estimator_eager(x, act, weight, bias?, save, backend) -> y: the estimator with its
// autograd node in C++, the `cpp` backend's eager path (glai_kernels/op.py: eager calls on
// plain tensors whose inputs need gradients).
//
// The same bodies as op.py's Python Function: the forward is glai_ext::forward (Z kept when
// `save`) plus bias, the backward glai_ext::backward and dbias = dy summed over b in the
// accumulation dtype (contract.bias_gradient). With no Python in the node, a step at the
// paper's B = 16 is 20-45 us shorter (bench/NOTES.md, "The eager node in C++"). A backward that
// builds a graph (create_graph) calls the custom op glai::estimator_backward with `backend`,
// whose own autograd formula gives gradients of gradients, as the Python Function does.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "glai_ext.h"

#include <string>
#include <tuple>
#include <vector>

namespace glai_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

class EagerEstimator : public torch::autograd::Function<EagerEstimator> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& act,
                            const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                            bool save, const std::string& backend) {
    // below autograd: this node is the only one recorded (grad mode is off here already)
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, saved] = call_forward(x, act, weight, save);
    const bool has_bias = bias.has_value() && bias->defined();
    if (has_bias) y = y.add(*bias);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, act, weight, saved});
    ctx->saved_data["backend"] = backend;
    ctx->saved_data["has_bias"] = has_bias;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    variable_list out(6);
    if (!dy.defined()) return out;
    const auto saved = ctx->get_saved_variables();
    const bool need_x = ctx->needs_input_grad(0), need_act = ctx->needs_input_grad(1);
    const bool need_weight = ctx->needs_input_grad(2);
    // needs_input_grad counts tensor inputs only: bias is the fourth when given
    const bool need_bias = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(3);
    if (need_x || need_act || need_weight) {
      if (at::GradMode::is_enabled()) {
        auto g = call_backward_op(dy, saved[0], saved[1], saved[2], saved[3], need_x, need_act,
                                  need_weight, ctx->saved_data["backend"].toStringRef());
        out[0] = need_x ? g[0] : at::Tensor();
        out[1] = need_act ? g[1] : at::Tensor();
        out[2] = need_weight ? g[2] : at::Tensor();
      } else {
        at::AutoDispatchBelowADInplaceOrView below;
        auto [gx, gact, gw] = call_backward(dy.contiguous(), saved[0], saved[1], saved[2],
                                            saved[3], need_x, need_act, need_weight);
        out[0] = need_x ? gx : at::Tensor();
        out[1] = need_act ? gact : at::Tensor();
        out[2] = need_weight ? gw : at::Tensor();
      }
    }
    if (need_bias)
      out[3] = dy.sum(0, false, opmath(dy.scalar_type())).to(dy.scalar_type());
    return out;
  }
};

at::Tensor estimator_eager(const at::Tensor& x, const at::Tensor& act, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, bool save,
                           c10::string_view backend) {
  return EagerEstimator::apply(x, act, weight, bias, save, std::string(backend));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(glai_ext, m) {
  m.def(
      "estimator_eager(Tensor x, Tensor act, Tensor weight, Tensor? bias, bool save, "
      "str backend) -> Tensor");
}

TORCH_LIBRARY_IMPL(glai_ext, Autograd, m) { m.impl("estimator_eager", &estimator_eager); }

}  // namespace glai_ext
