// glai_ext::sparse_estimator_eager(x, act, values, index, bias?, save, backend) -> y: the sparse
// kept-path estimator with its autograd node in C++, the sparse `cpp` backend's eager path
// (glai_kernels/sparse/op.py through glai_kernels/calls.py's `record`: eager calls on plain
// tensors whose inputs need gradients). The dense op's twin is ../eager_autograd.cpp.
//
// The same bodies as calls.py's Python Function (calls.EagerFunction) on the sparse `cpp`
// backend: the forward is glai_ext::sparse_forward (the group sums Zg^T kept when `save`) plus
// bias, the backward glai_ext::sparse_backward for the gradients asked for and dbias = dy summed
// over b in the accumulation dtype (contract.bias_gradient). The Python Function's apply, its
// context and the engine's call back into Python for its backward cost ≈ 0.1 ms of an ordinary
// training step at A1, A2 and C1 at the paper's B = 16 (predicted 20-30 µs; see
// docs/notes/pipeline.md, "A cheaper ordinary GLAI step (issue 41 item 2, stop 45)"). A
// backward that builds a graph (create_graph) calls the custom op
// glai::sparse_estimator_backward with `backend`, whose own autograd formula gives gradients of
// gradients, as the Python Function does.
//
// Schema (defined here, not in ../schema.cpp, beside its only kernel):
//   glai_ext::sparse_estimator_eager(Tensor x, Tensor act, Tensor values, Tensor[] index,
//       Tensor? bias, bool save, str backend) -> Tensor
// `index` is the ten KeptIndex tensors in glai_kernels/sparse/layout.py's order; the caller has
// checked every argument and the index (glai_kernels/sparse/contract.py), and the kernels check
// again what they read.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace glai_ext {
namespace {

using torch::autograd::variable_list;

// as ../eager_autograd.cpp: a node made the way this torch's Edge holds one (c10::intrusive_ptr
// in torch 2.13, std::shared_ptr in earlier releases)
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
                                                const at::Tensor& values,
                                                at::TensorList index, bool save) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::sparse_forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, at::TensorList, bool)>();
  return op.call(x, act, values, index, save);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(
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

// glai::sparse_estimator_backward (registered from Python with its own autograd): for
// create_graph. `saved` is an empty [0] when the forward kept nothing, as the Python Function
// passes it.
std::vector<at::Tensor> call_backward_op(const at::Tensor& dy, const at::Tensor& x,
                                         const at::Tensor& act, const at::Tensor& values,
                                         const std::vector<at::Tensor>& index,
                                         const at::Tensor& saved, bool need_x, bool need_act,
                                         bool need_values, const std::string& backend) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("glai::sparse_estimator_backward", "");
  std::vector<c10::IValue> stack{dy, x, act, values, c10::List<at::Tensor>(index), saved,
                                 c10::List<bool>({need_x, need_act, need_values}), backend};
  op.callBoxed(&stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

// The node the eager path records: a plain autograd Node, as ../eager_autograd.cpp's (a
// torch::autograd::Function's CppNode, context and saved_data map cost more). Its next edges
// are x, act, values and bias (an empty edge when there is no bias); the index gets none.
struct SparseEstimatorBackward : public torch::autograd::Node {
  variable_list apply(variable_list&& grads) override {
    variable_list out(4);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;  // no gradient reached y: none for its inputs
    const bool need_x = task_should_compute_output(0), need_act = task_should_compute_output(1);
    const bool need_values = task_should_compute_output(2);
    const bool need_bias = has_bias && task_should_compute_output(3);
    if (need_x || need_act || need_values) {
      // unpacking checks the saved versions: an input changed in place since the forward
      // fails here, as for any autograd node
      const at::Tensor x = x_.unpack(), act = act_.unpack(), values = values_.unpack();
      at::Tensor saved = saved_.unpack();
      if (at::GradMode::is_enabled()) {
        if (!saved.defined()) saved = at::empty({0}, x.options());
        auto g = call_backward_op(dy, x, act, values, index, saved, need_x, need_act,
                                  need_values, backend);
        for (int k = 0; k < 3; ++k) out[k] = g[k];
      } else {
        at::AutoDispatchBelowADInplaceOrView below;
        // nothing kept: the kernels recompute the group sums if dact needs them
        if (!saved.defined()) saved = at::empty({0}, x.options());
        std::tie(out[0], out[1], out[2]) =
            call_backward(dy.contiguous(), x.contiguous(), act.contiguous(),
                          values.contiguous(), index, saved,
                          c10::List<bool>({need_x, need_act, need_values}));
      }
      if (!need_x) out[0] = at::Tensor();
      if (!need_act) out[1] = at::Tensor();
      if (!need_values) out[2] = at::Tensor();
    }
    if (need_bias) {
      const auto t = dy.scalar_type();
      const auto acc = t == at::kDouble ? at::kDouble : at::kFloat;  // accumulation_dtype
      out[3] = dy.sum(0, false, acc).to(t);
    }
    return out;
  }

  std::string name() const override { return "glai::SparseEstimatorBackward"; }

  // after a backward without retain_graph: frees the saved tensors (a second backward then
  // fails with autograd's own message)
  void release_variables() override {
    x_.reset_data();
    act_.reset_data();
    values_.reset_data();
    saved_.reset_data();
    index.clear();
  }

  torch::autograd::SavedVariable x_, act_, values_, saved_;
  std::vector<at::Tensor> index;  // contiguous (the caller's), never differentiated
  std::string backend;
  bool has_bias = false;
};

at::Tensor sparse_estimator_eager(const at::Tensor& x, const at::Tensor& act,
                                  const at::Tensor& values, at::TensorList index_list,
                                  const c10::optional<at::Tensor>& bias, bool save,
                                  c10::string_view backend) {
  const bool has_bias = bias.has_value() && bias->defined();
  std::vector<at::Tensor> index;
  index.reserve(index_list.size());
  for (const at::Tensor& t : index_list) index.push_back(t.contiguous());
  at::Tensor y, saved;
  {
    // below autograd: this node is the only one recorded
    at::AutoDispatchBelowADInplaceOrView below;
    std::tie(y, saved) =
        call_forward(x.contiguous(), act.contiguous(), values.contiguous(), index, save);
    if (has_bias) y = y.add(*bias);
  }
  if (!torch::autograd::compute_requires_grad(x, act, values, bias)) return y;
  auto node = make_node<SparseEstimatorBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, act, values, bias));
  // the inputs as the caller gave them (their versions checked at the backward), made
  // contiguous there as the Python Function's backward does
  node->x_ = torch::autograd::SavedVariable(x, false);
  node->act_ = torch::autograd::SavedVariable(act, false);
  node->values_ = torch::autograd::SavedVariable(values, false);
  node->saved_ = torch::autograd::SavedVariable(save ? saved : at::Tensor(), false);
  node->index = std::move(index);
  node->backend = std::string(backend);
  node->has_bias = has_bias;
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, Autograd, m) {
  m.impl("sparse_estimator_eager", &sparse_estimator_eager);
}

}  // namespace glai_ext
