// glai_ext::sparse_estimator_eager(x, act, values, index, bias?, save, backend, ones) -> y: the sparse
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
//       Tensor? bias, bool save, str backend, bool ones=False) -> Tensor
// `index` is the ten KeptIndex tensors in glai_kernels/sparse/layout.py's order; the caller has
// checked every argument and the index (glai_kernels/sparse/contract.py), and the kernels check
// again what they read. `ones`: x is [B, I - 1], the index's last input being the constant 1 (a
// GLAI head's, carrying its hidden biases): on CPU the forward transposes x with a row of ones
// (glai_ext::sparse_forward_ones) and the node keeps that xt for the backward
// (glai_ext::sparse_backward_xt), so no x with a column of ones is ever made; elsewhere x is
// padded here (at::constant_pad_nd, recorded by autograd) and the call runs as without `ones`
// (docs/notes/pipeline.md, "The constant-1 row written by the transpose, x^T kept for the
// backward (issue 41, stop 50)").
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "eager_node.h"
#include "sparse_op_calls.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace glai_ext {
namespace {

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

// The node the eager path records (../eager_node.h: its plumbing, shared with the dense op's):
// the backward op glai_ext::sparse_backward, or glai::sparse_estimator_backward for a graph.
// The index gets no edge. `saved` is an empty [0] for the backward when the forward kept
// nothing, as the Python Function passes it (the kernels then recompute the group sums if
// dact needs them).
struct SparseEstimatorBackward : public eager::EagerBackward<SparseEstimatorBackward> {
  // the weight of eager::BackwardArgs is the values [K]
  std::vector<at::Tensor> graph_backward(const eager::BackwardArgs& a) {
    if (!xt.defined())
      return call_backward_op(a.dy, a.x, a.act, a.weight, index, kept(a), a.need_x, a.need_act,
                              a.need_weight, backend);
    // x without its ones column: the backward op on x padded (differentiably), dx narrowed
    const at::Tensor x_aug = at::constant_pad_nd(a.x, {0, 1}, 1.0);
    auto g = call_backward_op(a.dy, x_aug, a.act, a.weight, index, kept(a), a.need_x,
                              a.need_act, a.need_weight, backend);
    if (a.need_x) g[0] = g[0].narrow(1, 0, a.x.size(1));
    return g;
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor> direct_backward(const eager::BackwardArgs& a) {
    const c10::List<bool> needs({a.need_x, a.need_act, a.need_weight});
    if (xt.defined())
      return sparse_backward_xt_call(a.dy.contiguous(), a.x, xt, a.act.contiguous(),
                                     a.weight.contiguous(), index, kept(a), needs);
    return sparse_backward_call(a.dy.contiguous(), a.x.contiguous(), a.act.contiguous(),
                                a.weight.contiguous(), index, kept(a), needs);
  }

  static at::Tensor kept(const eager::BackwardArgs& a) {
    return a.saved.defined() ? a.saved : at::empty({0}, a.x.options());
  }

  std::string name() const override { return "glai::SparseEstimatorBackward"; }

  void release_own() {
    index.clear();
    xt.reset();
  }

  std::vector<at::Tensor> index;  // contiguous (the caller's), never differentiated
  at::Tensor xt;  // `ones` on CPU: the forward's x^T [I, ld] with its ones row; else undefined
};

at::Tensor sparse_estimator_eager(const at::Tensor& x_given, const at::Tensor& act,
                                  const at::Tensor& values, at::TensorList index_list,
                                  const c10::optional<at::Tensor>& bias, bool save,
                                  c10::string_view backend, bool ones) {
  const bool has_bias = bias.has_value() && bias->defined();
  const bool kept_xt = ones && x_given.is_cpu();
  const at::Tensor x =
      ones && !kept_xt ? at::constant_pad_nd(x_given, {0, 1}, 1.0) : x_given;
  std::vector<at::Tensor> index;
  index.reserve(index_list.size());
  for (const at::Tensor& t : index_list) index.push_back(t.contiguous());
  at::Tensor y, saved, xt;
  {
    // below autograd: this node is the only one recorded
    at::AutoDispatchBelowADInplaceOrView below;
    if (kept_xt)
      std::tie(y, saved, xt) = sparse_forward_ones_call(x, act.contiguous(), values.contiguous(),
                                                        index, save);
    else
      std::tie(y, saved) =
          sparse_forward_call(x.contiguous(), act.contiguous(), values.contiguous(), index, save);
    if (has_bias) y = y.add(*bias);
  }
  // the inputs as the caller gave them (their versions checked at the backward), made
  // contiguous there as the Python Function's backward does
  auto node = eager::record<SparseEstimatorBackward>(y, x, act, values, bias,
                                                      save ? saved : at::Tensor(), backend);
  if (node) {
    node->index = std::move(index);
    node->xt = std::move(xt);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, Autograd, m) {
  m.impl("sparse_estimator_eager", &sparse_estimator_eager);
}

}  // namespace glai_ext
