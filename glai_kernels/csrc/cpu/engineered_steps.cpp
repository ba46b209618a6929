// The engineered protocol's training steps, both sides alike, each as two extension calls: one
// for the model's forward, one for its backward and the optimizer's update (issue 41;
// docs/ARCHITECTURE.md §4: "both with the fastest step this project can build"). The loss stays
// in Python (any loss, autograd over it alone, to the model's output y); what the two calls
// replace is the Python and the op dispatches around the same kernels:
//
//   GLAI (glai_kernels/glai/fused_step.py, FusedSparseStep's `native` path):
//     glai_ext::sparse_step_forward(x [B, n0], weight_t [n0, P'], sel_bias [P']?, paths,
//         values [K], index, bias [O]?, dropout, units [P]?, hidden)
//         -> (y [B, O], x_aug [B, n0 + 1], act [B, P])
//       act = the selector's 0/1 gates (glai_ext::linear with `gates`, its columns zero padded
//       to whole tiles, the first `paths` kept; with dropout > 0, the selector's dropout in
//       training: each times its unit's noise, drawn over all `hidden` units as F.dropout
//       draws it), x_aug = x with a column of ones,
//       y = glai_ext::sparse_forward(x_aug, act, values, index) + bias
//     glai_ext::sparse_step_update(dy [B, O], x_aug, act, values!, index, exp_avg!, exp_avg_sq!,
//         step!, bias!?, bias_exp_avg!?, bias_exp_avg_sq!?, bias_step!?, lr, beta1, beta2,
//         weight_decay, eps, decoupled) -> ()
//       each step count += 1 (torch.optim's 0-d float32 state["step"]), then
//       glai_ext::sparse_dvalues_adam on the values and glai_ext::bias_adam on the bias
//   MLP (glai_kernels/glai/mlp_step.py, HandFusedMLPStep's `native` path), a chain
//   Linear (ReLU Linear)* with biases:
//     glai_ext::mlp_step_forward(x [B, n0], weights [n_{l+1}, n_l], biases [n_{l+1}],
//         own_gemm, dropout [L]?)
//         -> [y [B, n_L], h_1 [B, n_1], ..., h_{L-1}, extra...]
//       h_l = relu(h_{l-1} W_l^T + b_l) (times its dropout noise where dropout[l] > 0), h_0 = x
//       (F.dropout(x) where dropout[0] > 0); extra, in the model's order: the dropped x, and
//       for each dropped hidden layer its ReLU output r_l and noise n_l (`input_dropout`,
//       `hidden_dropout` below)
//     glai_ext::mlp_step_update(dy [B, n_L], x, hidden, weights!, biases!, grads!, lr,
//         weight_decay, dampening, own_gemm, relus?, noise?) -> ()
//       dW_l = dy_l^T h_l and db_l = sum_b dy_l into the preallocated `grads` (W_0, b_0, W_1,
//       ...), dy_{l-1} = threshold_backward(dy_l W_l (* n_l), r_l, 0) (r_l = h_l without
//       dropout), then torch's own _fused_sgd_ (momentum 0) over the parameters
//
// Every call is the op the Python step calls, in the same order on the same tensors (at::addmm,
// at::relu, at::mm_out, at::sum_out, at::threshold_backward, at::_fused_sgd_ are the kernels
// F.linear, torch.relu, mm, sum and torch.optim's fused SGD run): the results are the Python
// steps' bit for bit (correctness/test_engineered_steps.py). With `own_gemm` the MLP's three
// products per Linear run instead on the register tile GLAI's selector runs on (kernels.inc's
// `product`: glai_ext::linear's tiles and sums, whole tiles stored in place), not torch's MKL
// GEMM (≈ 2.4x slower at the paper's B = 16 on the AMD CPUs measured; docs/notes/pipeline.md,
// "The engineered steps, both sides (issue 41, stop 46)"), W read in place as nn.Linear stores
// it [N, I]: the forward as y^T = W h^T (the batch along the tile's columns), dW = dy^T h and
// dh = dy W in the tile's wide form (docs/notes/pipeline.md, "The engineered MLP step on the
// selector's tile (issue 41, stop 47)"): the same arithmetic summed in another order, equal to
// rounding. Dropout draws the Python paths' random numbers, in their order, on the default
// generator (docs/notes/pipeline.md, "Family B's engineered steps, both sides native (issue 41,
// stop 48)"). With several model calls per loss, `sparse_step_update_calls` and
// `mlp_step_update_calls` (below) sum the calls' gradients in call order and run the Python
// paths' several-call updates. The callers check the arguments and take these paths only where
// they apply (fused optimizers, float32/float64 on CPU); the kernels called check again what
// they read.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "isa.h"      // the ISA ladder (GLAI_X86)
#include "kernels.h"  // glai_cpu::Problem, glai_cpu::isa(), the dense binding's task runner
#include "sparse_op_calls.h"

// kernels.inc's `product` (linear's register tile, whole tiles stored in place), compiled and
// instantiated once per instruction set by cpu_dispatch.cpp; the set in use is the one
// glai_cpu::isa() names, as for the extension's other kernels.
#if GLAI_X86
namespace glai_cpu::avx512 {
template <typename T>
int product(const Problem<T>& p, T* out);
}  // namespace glai_cpu::avx512
namespace glai_cpu::avx2 {
template <typename T>
int product(const Problem<T>& p, T* out);
}  // namespace glai_cpu::avx2
#endif  // GLAI_X86
namespace glai_cpu::portable {
template <typename T>
int product(const Problem<T>& p, T* out);
}  // namespace glai_cpu::portable

namespace glai_ext {
namespace {

at::Tensor call_linear(const at::Tensor& x, const at::Tensor& weight_t,
                       const std::optional<at::Tensor>& bias, bool gates) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, bool)>();
  return op.call(x, weight_t, bias, gates);
}

void call_dvalues_adam(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act,
                       at::Tensor& values, at::TensorList index, at::Tensor& exp_avg,
                       at::Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                       double weight_decay, double eps, double step, bool decoupled) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::sparse_dvalues_adam", "")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                      at::TensorList, at::Tensor&, at::Tensor&, double, double, double, double,
                      double, double, bool)>();
  op.call(dy, x, act, values, index, exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps,
          step, decoupled);
}

void call_bias_adam(const at::Tensor& dy, at::Tensor& bias, at::Tensor& exp_avg,
                    at::Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                    double weight_decay, double eps, double step, bool decoupled) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("glai_ext::bias_adam", "")
          .typed<void(const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, double, double,
                      double, double, double, double, bool)>();
  op.call(dy, bias, exp_avg, exp_avg_sq, lr, beta1, beta2, weight_decay, eps, step, decoupled);
}

// torch.optim's step count: a 0-d float32 tensor advanced by one before the update, read as
// the float the update's scalars are computed from (FusedSparseStep._kernel_update_args). The
// float addition is add_(1)'s (one exact IEEE add), without its two op dispatches (≈ 1 µs each)
double advance(at::Tensor& step) {
  TORCH_CHECK(step.dim() == 0 && step.scalar_type() == at::kFloat && step.is_cpu(),
              "glai_ext::sparse_step_update: a step count must be a 0-d float32 CPU tensor, "
              "got ", step.scalar_type(), " ", step.sizes(), " on ", step.device());
  float* count = step.mutable_data_ptr<float>();
  *count += 1.0f;
  return static_cast<double>(*count);
}

// The forward's small copies as plain loops (each an op dispatch of ≈ 1 µs otherwise, three of
// them around the kernels): x_aug = [x, 1], act = the gates' first `paths` columns, y += bias.
// Each element is copied, or added once in IEEE arithmetic: F.pad's, narrow().contiguous()'s
// and y + bias's bits.
template <class T>
void augment_rows(const at::Tensor& x, at::Tensor& x_aug, const at::Tensor& gates,
                  at::Tensor& act) {
  const int64_t batch = x.size(0), inputs = x.size(1);
  const T* xs = x.const_data_ptr<T>();
  T* xa = x_aug.mutable_data_ptr<T>();
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(xs + b * inputs, xs + (b + 1) * inputs, xa + b * (inputs + 1));
    xa[b * (inputs + 1) + inputs] = T(1);
  }
  if (act.is_same(gates)) return;
  const int64_t width = gates.size(1), paths = act.size(1);
  const T* g = gates.const_data_ptr<T>();
  T* a = act.mutable_data_ptr<T>();
  for (int64_t b = 0; b < batch; ++b)
    std::copy(g + b * width, g + b * width + paths, a + b * paths);
}

// The selector's dropout in training (PathSelector.forward's: F.dropout over every hidden
// unit's gates [B, n1], then the path columns selected): the noise [B, n1] drawn as at::dropout
// draws it on the CPU (bernoulli_(1 - p) on the default generator, then / (1 - p); at p = 1 no
// draw, the gates times 0), and act[b, s] *= noise[b, units[s]]: the Python path's products,
// each a 0/1 gate times its unit's noise, so the same bits and the same random numbers.
template <class T>
void drop_gates(at::Tensor& act, const at::Tensor& units, int64_t hidden, double p) {
  const int64_t batch = act.size(0), paths = act.size(1);
  T* a = act.mutable_data_ptr<T>();
  if (p == 1.0) {
    for (int64_t e = 0; e < batch * paths; ++e) a[e] *= T(0);
    return;
  }
  at::Tensor noise = at::empty({batch, hidden}, act.options()).bernoulli_(1 - p).div_(1 - p);
  const T* n = noise.const_data_ptr<T>();
  const int64_t* u = units.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < paths; ++s) a[b * paths + s] *= n[b * hidden + u[s]];
}

template <class T>
void add_bias(at::Tensor& y, const at::Tensor& bias) {
  const int64_t batch = y.size(0), outputs = y.size(1);
  const T* bv = bias.const_data_ptr<T>();
  T* yv = y.mutable_data_ptr<T>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t o = 0; o < outputs; ++o) yv[b * outputs + o] += bv[o];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_step_forward(
    const at::Tensor& x, const at::Tensor& weight_t, const std::optional<at::Tensor>& sel_bias,
    int64_t paths, const at::Tensor& values, at::TensorList index,
    const std::optional<at::Tensor>& bias, double dropout,
    const std::optional<at::Tensor>& units, int64_t hidden) {
  TORCH_CHECK(x.dim() == 2, "glai_ext::sparse_step_forward: x must be [B, n0], got ",
              x.sizes());
  TORCH_CHECK(dropout >= 0 && dropout <= 1, "glai_ext::sparse_step_forward: dropout must be "
              "in [0, 1], got ", dropout);
  const at::Tensor gates = call_linear(x, weight_t, sel_bias, true);  // checks x's dtype
  TORCH_CHECK(paths >= 0 && paths <= gates.size(1), "glai_ext::sparse_step_forward: paths "
              "must be in [0, ", gates.size(1), "], got ", paths);
  const at::Tensor rows = x.contiguous();
  const bool dbl = x.scalar_type() == at::kDouble;
  at::Tensor x_aug = at::empty({x.size(0), x.size(1) + 1}, x.options());
  at::Tensor act = gates.size(1) == paths ? gates : at::empty({x.size(0), paths}, x.options());
  if (dbl)
    augment_rows<double>(rows, x_aug, gates, act);
  else
    augment_rows<float>(rows, x_aug, gates, act);
  if (dropout > 0) {
    TORCH_CHECK(units.has_value() && units->dim() == 1 && units->size(0) == paths &&
                    units->scalar_type() == at::kLong && units->is_contiguous() &&
                    units->is_cpu() && hidden > 0,
                "glai_ext::sparse_step_forward: dropout needs units, the paths' hidden units "
                "(a contiguous [", paths, "] int64 CPU tensor), and hidden > 0, their count");
    const int64_t* u = units->const_data_ptr<int64_t>();
    for (int64_t s = 0; s < paths; ++s)  // a plain loop: min()/max() are op dispatches
      TORCH_CHECK(u[s] >= 0 && u[s] < hidden, "glai_ext::sparse_step_forward: units must be "
                  "in [0, hidden = ", hidden, "), got ", u[s], " at ", s);
    if (dbl)
      drop_gates<double>(act, *units, hidden, dropout);
    else
      drop_gates<float>(act, *units, hidden, dropout);
  }
  at::Tensor y = std::get<0>(sparse_forward_call(x_aug, act, values, index, false));
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == y.size(1) &&
                    bias->scalar_type() == y.scalar_type() && bias->is_contiguous() &&
                    y.is_contiguous(),
                "glai_ext::sparse_step_forward: bias must be a contiguous [", y.size(1),
                "] tensor of y's dtype, got ", bias->scalar_type(), " ", bias->sizes());
    if (dbl)
      add_bias<double>(y, *bias);
    else
      add_bias<float>(y, *bias);
  }
  return {y, x_aug, act};
}

void sparse_step_update(const at::Tensor& dy, const at::Tensor& x_aug, const at::Tensor& act,
                        at::Tensor& values, at::TensorList index, at::Tensor& exp_avg,
                        at::Tensor& exp_avg_sq, at::Tensor& step,
                        const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& bias_exp_avg,
                        const std::optional<at::Tensor>& bias_exp_avg_sq,
                        const std::optional<at::Tensor>& bias_step, double lr, double beta1,
                        double beta2, double weight_decay, double eps, bool decoupled) {
  const bool with_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!with_bias || (bias_exp_avg.has_value() && bias_exp_avg_sq.has_value() &&
                             bias_step.has_value()),
              "glai_ext::sparse_step_update: a bias needs its exp_avg, exp_avg_sq and step");
  const at::Tensor rows = dy.contiguous();
  call_dvalues_adam(rows, x_aug, act, values, index, exp_avg, exp_avg_sq, lr, beta1, beta2,
                    weight_decay, eps, advance(step), decoupled);
  if (!with_bias) return;
  at::Tensor b = *bias, m = *bias_exp_avg, v = *bias_exp_avg_sq, s = *bias_step;
  call_bias_adam(rows, b, m, v, lr, beta1, beta2, weight_decay, eps, advance(s), decoupled);
}

// Several model calls per loss (FusedSparseStep's Python path for them): each call's dvalues by
// glai_ext::sparse_backward and its dbias = dy summed over the batch (torch's sum), summed over
// the calls in their order, then each step count += 1 and torch's own _fused_adam_ (AdamW's
// when `decoupled`) over [values, bias]: the Python path's ops on its tensors, so its bits.
void sparse_step_update_calls(
    at::TensorList dys, at::TensorList x_augs, at::TensorList acts, at::Tensor& values,
    at::TensorList index, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, at::Tensor& step,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& bias_exp_avg,
    const std::optional<at::Tensor>& bias_exp_avg_sq, const std::optional<at::Tensor>& bias_step,
    double lr, double beta1, double beta2, double weight_decay, double eps, bool decoupled) {
  constexpr const char* who = "glai_ext::sparse_step_update_calls";
  const bool with_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!with_bias || (bias_exp_avg.has_value() && bias_exp_avg_sq.has_value() &&
                             bias_step.has_value()),
              who, ": a bias needs its exp_avg, exp_avg_sq and step");
  TORCH_CHECK(!dys.empty() && x_augs.size() == dys.size() && acts.size() == dys.size(), who,
              ": one dy, x_aug and act per call, got ", dys.size(), ", ", x_augs.size(), ", ",
              acts.size());
  static const at::Tensor nothing_saved = at::empty({0});  // extension.py's _NOTHING_SAVED
  const c10::List<bool> dvalues_only({false, false, true});
  at::Tensor dvalues, dbias;
  for (size_t c = 0; c < dys.size(); ++c) {
    const at::Tensor dy = dys[c].contiguous();
    at::Tensor dv = std::get<2>(sparse_backward_call(dy, x_augs[c], acts[c], values, index,
                                                     nothing_saved, dvalues_only));
    TORCH_CHECK(dv.sizes() == values.sizes() && dv.scalar_type() == values.scalar_type(), who,
                ": sparse_backward's dvalues must be values' shape and dtype");
    dvalues = c == 0 ? dv : at::add(dvalues, dv);
    if (!with_bias) continue;
    at::Tensor db = at::sum(dy, at::IntArrayRef{0}, false, dy.scalar_type());
    dbias = c == 0 ? db : at::add(dbias, db);
  }
  std::vector<at::Tensor> params{values}, grads{dvalues}, avgs{exp_avg}, sqs{exp_avg_sq},
      steps{step};
  advance(step);
  if (with_bias) {
    at::Tensor s = *bias_step;
    advance(s);
    params.push_back(*bias);
    grads.push_back(dbias);
    avgs.push_back(*bias_exp_avg);
    sqs.push_back(*bias_exp_avg_sq);
    steps.push_back(s);
  }
  if (decoupled)
    at::_fused_adamw_(params, grads, avgs, sqs, {}, steps, lr, beta1, beta2, weight_decay, eps,
                      false, false);
  else
    at::_fused_adam_(params, grads, avgs, sqs, {}, steps, lr, beta1, beta2, weight_decay, eps,
                     false, false);
}

template <class T>
using ProductFn = int (*)(const glai_cpu::Problem<T>&, T*);

template <class T>
ProductFn<T> pick_product() {
  const char* isa = glai_cpu::isa();
#if GLAI_X86
  if (std::strcmp(isa, "avx512") == 0) return &glai_cpu::avx512::product<T>;
  if (std::strcmp(isa, "avx2") == 0) return &glai_cpu::avx2::product<T>;
#endif
  (void)isa;
  return &glai_cpu::portable::product<T>;
}

// out [m, n] = a [m, k] b [k, n] on the extension's register tile (glai_ext::linear's:
// kernels.inc's `micro`, 8 rows x 3 vectors where the sizes allow), a and b contiguous rows;
// each element sums its k terms in order, one task per element block, so the same bits on any
// thread count (the dense binding's task pool, small products on one thread).
template <class T>
void tile(const T* a, const T* b, int64_t m, int64_t k, int64_t n, T* out) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum is zero (the kernel's scratch wants k > 0)
    std::fill(out, out + m * n, T(0));
    return;
  }
  const glai_cpu::Problem<T> p{a, nullptr, b, m, k, n, 1,
                               static_cast<int64_t>(at::get_num_threads()),
                               glai_cpu::dense_parallel()};
  TORCH_CHECK(pick_product<T>()(p, out) == 0,
              "glai_ext: out of memory for the CPU kernels' scratch buffers");
}

// dst [cols, rows] = src [rows, cols]^T: the operands the tile reads as rows (x^T for the
// forward, dy^T for dW), B x width elements a layer, each copied.
template <class T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * rows + r] = src[r * cols + c];
}

// One Linear's forward on the tile: y^T [N, B] = W [N, I] h^T [I, B], then, element by element,
// v = y^T + b (ReLU'd when `relu`: 0 where v <= 0, torch.relu's, NaN stays NaN), written to
// y [B, N] and back over y^T, which is the next layer's h^T. Returns (y, y^T).
template <class T>
std::pair<at::Tensor, at::Tensor> tile_linear(const at::Tensor& ht, int64_t batch,
                                              const at::Tensor& weight, const at::Tensor& bias,
                                              bool relu) {
  const int64_t inputs = weight.size(1), n = weight.size(0);
  at::Tensor yt = at::empty({n, batch}, ht.options());
  at::Tensor y = at::empty({batch, n}, ht.options());
  T* ytp = yt.mutable_data_ptr<T>();
  tile<T>(weight.const_data_ptr<T>(), ht.const_data_ptr<T>(), n, inputs, batch, ytp);
  const T* bp = bias.const_data_ptr<T>();
  T* yp = y.mutable_data_ptr<T>();
  for (int64_t o = 0; o < n; ++o)
    for (int64_t b = 0; b < batch; ++b) {
      T v = ytp[o * batch + b] + bp[o];
      if (relu && v <= T(0)) v = T(0);
      ytp[o * batch + b] = v;
      yp[b * n + o] = v;
    }
  return {y, yt};
}

// The MLP's dropout in training, as HandFusedMLPStep's Python path draws it (glai/mlp_step.py,
// `_forward`), in the model's order, on the default generator: before the first Linear
// F.dropout's own call (at::dropout: x * noise on the CPU), after a hidden layer's ReLU the
// noise drawn as `torch.empty_like(h).bernoulli_(1 - p).div_(1 - p)` and h * noise. `dropout`
// holds one rate per Linear, for its input (empty: none). What the backward needs is appended
// to `extra` in the model's order: the dropped x (the first Linear's input), and for a hidden
// layer its ReLU output (threshold_backward's mask) and its noise.
double rate(at::ArrayRef<double> dropout, size_t l) {
  return l < dropout.size() ? dropout[l] : 0.0;
}

at::Tensor input_dropout(const at::Tensor& x, at::ArrayRef<double> dropout,
                         std::vector<at::Tensor>& extra) {
  if (rate(dropout, 0) <= 0) return x;
  at::Tensor dropped = at::dropout(x, dropout[0], true).contiguous();
  extra.push_back(dropped);
  return dropped;
}

at::Tensor hidden_dropout(const at::Tensor& h, double p, std::vector<at::Tensor>& extra) {
  if (p <= 0) return h;
  at::Tensor noise = at::empty_like(h).bernoulli_(1 - p).div_(1 - p);
  extra.push_back(h);
  extra.push_back(noise);
  return at::mul(h, noise);
}

template <class T>
std::vector<at::Tensor> tile_forward(const at::Tensor& x, at::TensorList weights,
                                     at::TensorList biases, at::ArrayRef<double> dropout) {
  const int64_t batch = x.size(0);
  std::vector<at::Tensor> out(1), extra;
  const at::Tensor h = input_dropout(x, dropout, extra);
  at::Tensor ht = at::empty({h.size(1), batch}, h.options());
  transpose<T>(h.const_data_ptr<T>(), batch, h.size(1), ht.mutable_data_ptr<T>());
  const size_t last = weights.size() - 1;
  for (size_t l = 0; l <= last; ++l) {
    auto [y, yt] = tile_linear<T>(ht, batch, weights[l], biases[l], l < last);
    if (l == last) {
      out[0] = y;
      break;
    }
    const at::Tensor dropped = hidden_dropout(y, rate(dropout, l + 1), extra);
    out.push_back(dropped);
    if (dropped.is_same(y)) {
      ht = yt;
    } else {  // the next layer reads the dropped rows, transposed
      ht = at::empty({dropped.size(1), batch}, dropped.options());
      transpose<T>(dropped.const_data_ptr<T>(), batch, dropped.size(1),
                   ht.mutable_data_ptr<T>());
    }
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// The backward of the chain on the tile, last Linear first: dW_l = dy_l^T h_l into grads[2l]
// (the tile over dy^T [N, B] and h [B, I], depth B), db_l = sum_b dy_l (torch's sum), and for
// l > 0 dy_{l-1} = dy_l W_l [B, I] (the tile over dy and W as stored, depth N), 0 where
// h_l <= 0 (threshold_backward's).
template <class T>
void tile_backward(at::Tensor dy, const at::Tensor& x, at::TensorList hidden,
                   at::TensorList weights, at::TensorList grads, at::TensorList relus,
                   const c10::List<std::optional<at::Tensor>>& noise) {
  const int64_t batch = x.size(0);
  at::Tensor dyt = at::empty({dy.size(1), batch}, dy.options());
  transpose<T>(dy.const_data_ptr<T>(), batch, dy.size(1), dyt.mutable_data_ptr<T>());
  for (size_t l = weights.size(); l-- > 0;) {
    const at::Tensor& input = l == 0 ? x : hidden[l - 1];
    const int64_t n = weights[l].size(0), inputs = weights[l].size(1);
    at::Tensor gw = grads[2 * l], gb = grads[2 * l + 1];
    tile<T>(dyt.const_data_ptr<T>(), input.const_data_ptr<T>(), n, batch, inputs,
            gw.mutable_data_ptr<T>());
    at::sum_out(gb, dy, at::IntArrayRef{0});
    if (l == 0) break;
    at::Tensor dh = at::empty({batch, inputs}, dy.options());
    T* p = dh.mutable_data_ptr<T>();
    tile<T>(dy.const_data_ptr<T>(), weights[l].const_data_ptr<T>(), batch, n, inputs, p);
    const std::optional<at::Tensor> kept = noise.empty() ? std::nullopt : noise.get(l - 1);
    if (kept.has_value() && kept->defined()) {  // dropout's backward: dy * noise, autograd's
      const T* k = kept->const_data_ptr<T>();
      for (int64_t e = 0; e < batch * inputs; ++e) p[e] = p[e] * k[e];
    }
    const T* h = (relus.empty() ? input : relus[l - 1]).const_data_ptr<T>();
    for (int64_t e = 0; e < batch * inputs; ++e)
      if (h[e] <= T(0)) p[e] = T(0);
    dyt = at::empty({inputs, batch}, dy.options());
    transpose<T>(p, batch, inputs, dyt.mutable_data_ptr<T>());
    dy = dh;
  }
}

void check_chain(const char* who, at::TensorList weights, at::TensorList biases) {
  TORCH_CHECK(!weights.empty() && weights.size() == biases.size(), who,
              ": weights and biases must be one per Linear (at least one), got ",
              weights.size(), " and ", biases.size());
  for (size_t l = 1; l < weights.size(); ++l)
    TORCH_CHECK(weights[l].dim() == 2 && weights[l].size(1) == weights[l - 1].size(0), who,
                ": weights[", l, "] must be [n, ", weights[l - 1].size(0), "], got ",
                weights[l].sizes());
}

// What the tile reads as raw rows: contiguous float32/float64 CPU tensors of x's dtype
void check_own(const char* who, const at::Tensor& x, at::TensorList weights,
               at::TensorList biases) {
  const auto t = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_cpu() && x.is_contiguous() &&
                  (t == at::kFloat || t == at::kDouble) && x.size(1) == weights[0].size(1),
              who, ": x must be a contiguous [B, ", weights[0].size(1),
              "] float32/float64 CPU tensor for own_gemm, got ", t, " ", x.sizes());
  for (size_t l = 0; l < weights.size(); ++l)
    TORCH_CHECK(weights[l].is_contiguous() && biases[l].is_contiguous() &&
                    weights[l].scalar_type() == t && biases[l].scalar_type() == t &&
                    weights[l].is_cpu() && biases[l].dim() == 1 &&
                    biases[l].size(0) == weights[l].size(0),
                who, ": weights[", l, "] and biases[", l, "] must be contiguous CPU tensors of "
                "x's dtype, bias [", weights[l].size(0), "]");
}

// t is a contiguous [rows, cols] CPU tensor of x's dtype (what the backward reads raw)
void check_rows(const char* who, const char* name, size_t index, const at::Tensor& t,
                const at::Tensor& x, int64_t rows, int64_t cols) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols && t.is_contiguous() &&
                  t.is_cpu() && t.scalar_type() == x.scalar_type(),
              who, ": ", name, "[", index, "] must be a contiguous [", rows, ", ", cols,
              "] CPU tensor of x's dtype for own_gemm, got ", t.scalar_type(), " ", t.sizes());
}

std::vector<at::Tensor> mlp_step_forward(const at::Tensor& x, at::TensorList weights,
                                         at::TensorList biases, bool own_gemm,
                                         at::ArrayRef<double> dropout) {
  constexpr const char* who = "glai_ext::mlp_step_forward";
  check_chain(who, weights, biases);
  TORCH_CHECK(dropout.empty() || dropout.size() == weights.size(), who, ": dropout must hold "
              "one rate per Linear (", weights.size(), ") or none, got ", dropout.size());
  for (double p : dropout)
    TORCH_CHECK(p >= 0 && p <= 1, who, ": dropout rates must be in [0, 1], got ", p);
  if (own_gemm) {
    check_own(who, x, weights, biases);
    return x.scalar_type() == at::kDouble ? tile_forward<double>(x, weights, biases, dropout)
                                          : tile_forward<float>(x, weights, biases, dropout);
  }
  std::vector<at::Tensor> out(1), extra;
  at::Tensor h = input_dropout(x, dropout, extra);
  const size_t last = weights.size() - 1;
  for (size_t l = 0; l <= last; ++l) {
    at::Tensor pre = at::addmm(biases[l], h, weights[l].t());  // F.linear's call on 2-D input
    if (l == last) {
      out[0] = pre;
      break;
    }
    h = hidden_dropout(at::relu(pre), rate(dropout, l + 1), extra);
    out.push_back(h);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// One model call's backward: the gradients into `grads` (mlp_step_update's, without the update)
void mlp_backward(const char* who, const at::Tensor& dy_in, const at::Tensor& x,
                  at::TensorList hidden, at::TensorList weights, at::TensorList biases,
                  at::TensorList grads, bool own_gemm, at::TensorList relus,
                  const c10::List<std::optional<at::Tensor>>& noise) {
  const size_t layers = weights.size();
  TORCH_CHECK(hidden.size() + 1 == layers && grads.size() == 2 * layers, who,
              ": hidden must hold ", layers - 1, " tensors and grads ", 2 * layers, ", got ",
              hidden.size(), " and ", grads.size());
  TORCH_CHECK((relus.empty() || relus.size() == hidden.size()) &&
                  (noise.empty() || noise.size() == hidden.size()),
              who, ": relus and noise must hold ", layers - 1, " tensors each or none, got ",
              relus.size(), " and ", noise.size());
  if (own_gemm) {
    check_own(who, x, weights, biases);
    const at::Tensor dy = dy_in.contiguous();
    check_rows(who, "dy", 0, dy, x, x.size(0), weights[layers - 1].size(0));
    for (size_t l = 0; l < layers; ++l) {
      if (l > 0) check_rows(who, "hidden", l - 1, hidden[l - 1], x, x.size(0),
                            weights[l].size(1));
      check_rows(who, "grads", 2 * l, grads[2 * l], x, weights[l].size(0), weights[l].size(1));
    }
    for (size_t l = 0; l < hidden.size(); ++l) {
      const int64_t width = weights[l + 1].size(1);
      if (!relus.empty()) check_rows(who, "relus", l, relus[l], x, x.size(0), width);
      const std::optional<at::Tensor> kept = noise.empty() ? std::nullopt : noise.get(l);
      if (kept.has_value() && kept->defined())
        check_rows(who, "noise", l, *kept, x, x.size(0), width);
    }
    if (x.scalar_type() == at::kDouble)
      tile_backward<double>(dy, x, hidden, weights, grads, relus, noise);
    else
      tile_backward<float>(dy, x, hidden, weights, grads, relus, noise);
  } else {
    at::Tensor dy = dy_in;
    for (size_t l = layers; l-- > 0;) {
      const at::Tensor& input = l == 0 ? x : hidden[l - 1];
      at::Tensor gw = grads[2 * l], gb = grads[2 * l + 1];
      at::mm_out(gw, dy.t(), input);
      at::sum_out(gb, dy, at::IntArrayRef{0});
      if (l == 0) break;
      at::Tensor dh = dy.mm(weights[l]);
      const std::optional<at::Tensor> kept = noise.empty() ? std::nullopt : noise.get(l - 1);
      if (kept.has_value() && kept->defined()) dh = at::mul(dh, *kept);  // dropout's backward
      dy = at::threshold_backward(dh, relus.empty() ? input : relus[l - 1], 0);
    }
  }
}

void fused_sgd(at::TensorList weights, at::TensorList biases, at::TensorList grads, double lr,
               double weight_decay, double dampening) {
  const size_t layers = weights.size();
  std::vector<at::Tensor> params, gradients;
  for (size_t l = 0; l < layers; ++l) {
    params.push_back(weights[l]);
    params.push_back(biases[l]);
    gradients.push_back(grads[2 * l]);
    gradients.push_back(grads[2 * l + 1]);
  }
  at::_fused_sgd_(params, gradients, {}, weight_decay, 0.0, lr, dampening, false, false, false);
}

void mlp_step_update(const at::Tensor& dy, const at::Tensor& x, at::TensorList hidden,
                     at::TensorList weights, at::TensorList biases, at::TensorList grads,
                     double lr, double weight_decay, double dampening, bool own_gemm,
                     at::TensorList relus, const c10::List<std::optional<at::Tensor>>& noise) {
  constexpr const char* who = "glai_ext::mlp_step_update";
  check_chain(who, weights, biases);
  mlp_backward(who, dy, x, hidden, weights, biases, grads, own_gemm, relus, noise);
  fused_sgd(weights, biases, grads, lr, weight_decay, dampening);
}

// Several model calls per loss (HandFusedMLPStep's Python path: each call's backward, the
// gradients summed over the calls in their order, g_0 + g_1 + ..., then one update): call c's
// hidden, relus and noise are entries [c (L - 1), (c + 1) (L - 1)) of the flat lists; call 0's
// gradients go into `grads`, each later call's into scratch, added in place (the same sums).
void mlp_step_update_calls(at::TensorList dys, at::TensorList xs, at::TensorList hidden,
                           at::TensorList weights, at::TensorList biases, at::TensorList grads,
                           double lr, double weight_decay, double dampening, bool own_gemm,
                           at::TensorList relus,
                           const c10::List<std::optional<at::Tensor>>& noise) {
  constexpr const char* who = "glai_ext::mlp_step_update_calls";
  check_chain(who, weights, biases);
  const size_t calls = dys.size(), depth = weights.size() - 1;
  TORCH_CHECK(calls >= 1 && xs.size() == calls && hidden.size() == calls * depth &&
                  (relus.empty() || relus.size() == calls * depth) &&
                  (noise.empty() || noise.size() == calls * depth),
              who, ": one dy and x per call, and ", depth, " hidden (relus, noise: or none) "
              "per call, got ", dys.size(), ", ", xs.size(), ", ", hidden.size(), ", ",
              relus.size(), ", ", noise.size());
  std::vector<at::Tensor> scratch;
  for (size_t c = 0; c < calls; ++c) {
    c10::List<std::optional<at::Tensor>> kept;
    for (size_t l = 0; !noise.empty() && l < depth; ++l) kept.push_back(noise.get(c * depth + l));
    if (c == 1)
      for (const at::Tensor& g : grads) scratch.push_back(at::empty_like(g));
    mlp_backward(who, dys[c], xs[c], hidden.slice(c * depth, depth), weights, biases,
                 c == 0 ? grads : at::TensorList(scratch), own_gemm,
                 relus.empty() ? relus : relus.slice(c * depth, depth), kept);
    if (c > 0)
      for (size_t k = 0; k < grads.size(); ++k) {
        at::Tensor g = grads[k];
        g.add_(scratch[k]);
      }
  }
  fused_sgd(weights, biases, grads, lr, weight_decay, dampening);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(glai_ext, m) {
  m.def(
      "sparse_step_forward(Tensor x, Tensor weight_t, Tensor? sel_bias, int paths, "
      "Tensor values, Tensor[] index, Tensor? bias, float dropout=0., Tensor? units=None, "
      "int hidden=0) -> (Tensor, Tensor, Tensor)");
  m.def(
      "sparse_step_update(Tensor dy, Tensor x_aug, Tensor act, Tensor(a!) values, "
      "Tensor[] index, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, Tensor(d!) step, "
      "Tensor(e!)? bias, Tensor(f!)? bias_exp_avg, Tensor(g!)? bias_exp_avg_sq, "
      "Tensor(h!)? bias_step, float lr, float beta1, float beta2, float weight_decay, "
      "float eps, bool decoupled) -> ()");
  m.def(
      "sparse_step_update_calls(Tensor[] dys, Tensor[] x_augs, Tensor[] acts, "
      "Tensor(a!) values, Tensor[] index, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, "
      "Tensor(d!) step, Tensor(e!)? bias, Tensor(f!)? bias_exp_avg, "
      "Tensor(g!)? bias_exp_avg_sq, Tensor(h!)? bias_step, float lr, float beta1, float beta2, "
      "float weight_decay, float eps, bool decoupled) -> ()");
  m.def(
      "mlp_step_forward(Tensor x, Tensor[] weights, Tensor[] biases, bool own_gemm, "
      "float[] dropout=[]) -> Tensor[]");
  m.def(
      "mlp_step_update(Tensor dy, Tensor x, Tensor[] hidden, Tensor(a!)[] weights, "
      "Tensor(b!)[] biases, Tensor(c!)[] grads, float lr, float weight_decay, "
      "float dampening, bool own_gemm, Tensor[] relus, Tensor?[] noise) -> ()");
  m.def(
      "mlp_step_update_calls(Tensor[] dys, Tensor[] xs, Tensor[] hidden, Tensor(a!)[] weights, "
      "Tensor(b!)[] biases, Tensor(c!)[] grads, float lr, float weight_decay, "
      "float dampening, bool own_gemm, Tensor[] relus, Tensor?[] noise) -> ()");
}

TORCH_LIBRARY_IMPL(glai_ext, CPU, m) {
  m.impl("sparse_step_forward", &sparse_step_forward);
  m.impl("sparse_step_update", &sparse_step_update);
  m.impl("sparse_step_update_calls", &sparse_step_update_calls);
  m.impl("mlp_step_forward", &mlp_step_forward);
  m.impl("mlp_step_update", &mlp_step_update);
  m.impl("mlp_step_update_calls", &mlp_step_update_calls);
}

}  // namespace glai_ext
