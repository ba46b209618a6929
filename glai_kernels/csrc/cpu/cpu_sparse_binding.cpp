// The sparse kept-path estimator's ops in the glai_ext library, CPU implementation (schemas:
// ../schema.cpp).
//
//   glai_ext::sparse_forward(x [B, I], act [B, P], values [K], index, save) -> (y [B, O], zg)
//   glai_ext::sparse_backward(dy [B, O], x, act, values, index, saved, needs [3])
//       -> (dx [B, I], dact [B, P], dvalues [K]), each empty [0] when not needed
//   glai_ext::sparse_dvalues_adam(dy, x, act, values!, index, exp_avg!, exp_avg_sq!, lr, beta1,
//       beta2, weight_decay, eps, step, decoupled) -> (): dvalues and one Adam / AdamW update
//       of values and its moments in place, chunk by chunk of groups (float32/float64)
//   glai_ext::bias_adam(dy, bias!, exp_avg!, exp_avg_sq!, lr, beta1, beta2, weight_decay, eps,
//       step, decoupled) -> (): the same update of bias [O] from dy summed over the batch
//   glai_ext::sparse_min_work(work=-1) -> the multiply-adds per thread below which the sparse
//       kernels use fewer threads (work >= 0 sets it; returns the value before)
//
// `index` is the ten KeptIndex tensors in glai_kernels/sparse/layout.py's order. `zg` is the
// group sums Zg^T [G, ld] (ld = B rounded up to 16, the padding lanes zero) in float32 for
// float16/bfloat16 inputs, else the inputs' dtype, when `save` is true, else empty; the
// backward takes dact from it as `saved` instead of recomputing the group sums. Half inputs are
// widened to float32 once, on their way into the kernels' transposed operands, and every sum
// runs in float32: no half intermediate.
//
// Every argument is checked here (ranks, dtypes, devices, contiguity of the index, sizes,
// the ptr arrays' end points) and every offset and index by the kernels as they use it
// (sparse_kernels.h), so a direct call with a corrupt index raises instead of touching memory
// outside its tensors.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu/sparse_kernels.h"
#include "task_pool.h"

namespace glai_ext {
namespace {

using glai_cpu::sparse::kBatchPad;

constexpr const char* kWho = "glai_ext sparse";
// KeptIndex's fields, in order (layout.py)
constexpr const char* kIndexNames[] = {"inputs",    "group_ptr",     "group_outputs",
                                       "group_paths", "output_ptr",  "input_ptr",
                                       "input_entries", "entry_groups", "path_ptr",
                                       "path_groups"};
constexpr size_t kIndexCount = sizeof(kIndexNames) / sizeof(kIndexNames[0]);

// Below this many multiply-adds per thread a call uses fewer threads: starting and joining a
// parallel region costs tens of microseconds, more on a loaded machine (docs/notes/sparse.md).
std::atomic<int64_t> g_min_work{int64_t{1} << 19};

struct Sizes {
  int64_t batch, inputs, paths, outputs, nnz, groups, ld;
};

int64_t padded(int64_t batch) { return (batch + kBatchPad - 1) / kBatchPad * kBatchPad; }

at::ScalarType accumulation(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

int32_t at_index(const at::Tensor& t, int64_t i) { return t.const_data_ptr<int32_t>()[i]; }

// `ones`: x is [B, I - 1], the index's last input being the constant 1 (sparse_forward_ones).
Sizes check(const at::Tensor& x, const at::Tensor& act, const at::Tensor& values,
            const std::vector<at::Tensor>& index, bool ones = false) {
  TORCH_CHECK(x.dim() == 2, kWho, ": x must be [B, I], got ", x.sizes());
  TORCH_CHECK(act.dim() == 2, kWho, ": act must be [B, P], got ", act.sizes());
  TORCH_CHECK(values.dim() == 1, kWho, ": values must be [K], got ", values.sizes());
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              kWho, ": x must be float32, float64, float16 or bfloat16, got ", t);
  TORCH_CHECK(act.scalar_type() == t && values.scalar_type() == t, kWho,
              ": x, act and values must share a dtype, got ", t, ", ", act.scalar_type(), ", ",
              values.scalar_type());
  TORCH_CHECK(x.is_cpu() && act.is_cpu() && values.is_cpu(), kWho,
              ": x, act and values must be CPU tensors, got ", x.device(), ", ", act.device(),
              ", ", values.device());
  TORCH_CHECK(index.size() == kIndexCount, kWho, ": index must hold ", kIndexCount,
              " tensors (the KeptIndex fields), got ", index.size());
  for (size_t f = 0; f < kIndexCount; ++f) {
    const at::Tensor& ix = index[f];
    TORCH_CHECK(ix.dim() == 1 && ix.scalar_type() == at::kInt && ix.is_cpu() &&
                    ix.is_contiguous(),
                kWho, ": index.", kIndexNames[f],
                " must be a contiguous 1-d int32 CPU tensor, got ", ix.scalar_type(), " ",
                ix.sizes(), " on ", ix.device(), ix.is_contiguous() ? "" : " (strided)");
  }
  const at::Tensor &inputs = index[0], &group_ptr = index[1], &group_outputs = index[2],
                   &group_paths = index[3], &output_ptr = index[4], &input_ptr = index[5],
                   &input_entries = index[6], &entry_groups = index[7], &path_ptr = index[8],
                   &path_groups = index[9];
  TORCH_CHECK(output_ptr.numel() >= 1 && input_ptr.numel() >= 1 && path_ptr.numel() >= 1 &&
                  group_ptr.numel() >= 1,
              kWho, ": index.group_ptr, output_ptr, input_ptr and path_ptr need at least one "
              "entry each");
  Sizes s{x.size(0), input_ptr.numel() - 1, path_ptr.numel() - 1, output_ptr.numel() - 1,
          values.numel(), group_outputs.numel(), padded(x.size(0))};
  TORCH_CHECK(x.size(1) + ones == s.inputs, kWho, ": x must be [B, I", ones ? " - 1" : "",
              "] with I = ", s.inputs, " (index.input_ptr has I + 1 entries), got ", x.sizes());
  TORCH_CHECK(act.size(0) == s.batch && act.size(1) == s.paths, kWho, ": act must be [",
              s.batch, ", ", s.paths, "] (B from x, P from index.path_ptr), got ", act.sizes());
  for (const auto* k : {&inputs, &input_entries, &entry_groups})
    TORCH_CHECK(k->numel() == s.nnz, kWho, ": index.inputs, input_entries and entry_groups "
                "must have K = ", s.nnz, " entries (values [K]), got ", inputs.numel(), ", ",
                input_entries.numel(), ", ", entry_groups.numel());
  TORCH_CHECK(group_ptr.numel() == s.groups + 1 && group_paths.numel() == s.groups &&
                  path_groups.numel() == s.groups,
              kWho, ": index.group_ptr, group_paths and path_groups must have G + 1, G, G "
              "entries with G = ", s.groups, " (index.group_outputs), got ", group_ptr.numel(),
              ", ", group_paths.numel(), ", ", path_groups.numel());
  // with the kernels' check that each range is non-decreasing and inside, these make the
  // ranges a partition, so every result element is written
  const struct {
    const char* name;
    const at::Tensor* ptr;
    int64_t rows, total;
  } ptrs[] = {{"group_ptr", &group_ptr, s.groups, s.nnz},
              {"output_ptr", &output_ptr, s.outputs, s.groups},
              {"input_ptr", &input_ptr, s.inputs, s.nnz},
              {"path_ptr", &path_ptr, s.paths, s.groups}};
  for (const auto& p : ptrs)
    TORCH_CHECK(at_index(*p.ptr, 0) == 0 && at_index(*p.ptr, p.rows) == p.total, kWho,
                ": index.", p.name, " must run from 0 to ", p.total, ", got ",
                at_index(*p.ptr, 0), " to ", at_index(*p.ptr, p.rows));
  return s;
}

void check_dy(const at::Tensor& dy, const at::Tensor& x, const Sizes& s) {
  TORCH_CHECK(dy.dim() == 2 && dy.size(0) == s.batch && dy.size(1) == s.outputs, kWho,
              ": dy must be [", s.batch, ", ", s.outputs, "], got ", dy.sizes());
  TORCH_CHECK(dy.scalar_type() == x.scalar_type() && dy.is_cpu(), kWho,
              ": dy must be a CPU tensor of x's dtype (", x.scalar_type(), "), got ",
              dy.scalar_type(), " on ", dy.device());
}

// t [B, n] as [n, ld] in the accumulation dtype, the padding columns zero. `ones`: one row
// more, [n + 1, ld], the last the constant-1 input (ones for b < B, zeros past B:
// sparse_forward_ones).
at::Tensor transposed(const at::Tensor& t, const Sizes& s, bool ones = false) {
  const int64_t n = t.size(1);
  const auto acc = accumulation(t.scalar_type());
  at::Tensor out = at::empty({n + ones, s.ld}, t.options().dtype(acc));
  // the kernels' vector blocks: torch's strided copy_ took ≈ 17 µs for B1's x [16, 1281],
  // and a training step transposes x twice, act twice and dy once (docs/notes/sparse.md,
  // "Training step ≤ MLP", second pass)
  const bool direct = t.scalar_type() == acc && t.is_contiguous();
  auto fill = [&](auto* o) {
    using T = std::remove_pointer_t<decltype(o)>;
    if (direct)
      glai_cpu::sparse::kernels<T>().transpose(t.const_data_ptr<T>(), o, s.batch, n, s.ld);
    if (ones)
      for (int64_t b = 0; b < s.ld; ++b) o[n * s.ld + b] = b < s.batch ? T(1) : T(0);
  };
  if (acc == at::kDouble)
    fill(out.mutable_data_ptr<double>());
  else
    fill(out.mutable_data_ptr<float>());
  if (!direct) {
    at::Tensor rows = out.narrow(0, 0, n);
    if (s.ld > s.batch) rows.narrow(1, s.batch, s.ld - s.batch).zero_();
    rows.narrow(1, 0, s.batch).copy_(t.t());
  }
  return out;
}

// Runs fn(begin, end) over chunks of [0, n) on up to torch's intra-op thread count (fewer
// for small work), chunks taken one at a time from the task pool's shared counter, which never
// waits for a helper that has not started (task_pool.h). Returns whether any chunk was bad.
template <typename F>
bool run_items(int64_t n, int64_t work, const F& fn) {
  const int64_t threads = glai_pool::threads_for(
      n, work, g_min_work.load(), at::in_parallel_region() ? 1 : at::get_num_threads());
  if (threads <= 1) return fn(int64_t{0}, n) != 0;
  struct Chunks {
    const F* fn;
    int64_t n, chunks;
    std::atomic<int> bad{0};
  } job{&fn, n, std::min<int64_t>(n, threads * 8)};
  glai_pool::run(job.chunks, static_cast<int>(threads - 1),
                 [](void* ctx, int64_t c) {
                   auto* j = static_cast<Chunks*>(ctx);
                   if ((*j->fn)(j->n * c / j->chunks, j->n * (c + 1) / j->chunks) != 0)
                     j->bad.store(1);
                 },
                 &job);
  return job.bad.load() != 0;
}

template <typename T>
glai_cpu::sparse::Problem<T> problem(const Sizes& s, const at::Tensor& xt, const at::Tensor& actt,
                                     const at::Tensor& dyt, const at::Tensor& values,
                                     const std::vector<at::Tensor>& index) {
  auto ix = [&](size_t f) { return index[f].const_data_ptr<int32_t>(); };
  auto ptr = [](const at::Tensor& t) { return t.defined() ? t.const_data_ptr<T>() : nullptr; };
  return {s.batch, s.ld, s.inputs, s.paths, s.outputs, s.nnz, s.groups,
          ptr(xt), ptr(actt), ptr(dyt), ptr(values),
          ix(0), ix(1), ix(2), ix(3), ix(4), ix(5), ix(6), ix(7), ix(8), ix(9)};
}

void check_index_contents(bool bad, const char* op) {
  TORCH_CHECK(!bad, "glai_ext::", op, ": the index is corrupt (an offset or index out of "
              "range, or offsets that decrease); build it with glai_kernels.sparse.from_dense "
              "or from_entries");
}

// y [B, O] and/or the group sums Zg^T [G, ld] by the forward kernel, after the index checks
// it relies on.
template <typename T>
bool forward_kernel(const glai_cpu::sparse::Problem<T>& p, at::Tensor* y, at::Tensor* zg) {
  if (zg == nullptr && !glai_cpu::sparse::groups_in_range(p)) return true;
  const auto& k = glai_cpu::sparse::kernels<T>();
  T* yp = y != nullptr ? y->mutable_data_ptr<T>() : nullptr;
  T* zp = zg != nullptr ? zg->mutable_data_ptr<T>() : nullptr;
  return run_items(p.outputs, p.ld * (p.nnz + p.groups), [&](int64_t b, int64_t e) {
    return k.forward(p, yp, zp, b, e);
  });
}

template <typename T>
void forward_typed(const Sizes& s, const at::Tensor& xt, const at::Tensor& act,
                   const at::Tensor& values, const std::vector<at::Tensor>& index, at::Tensor& y,
                   at::Tensor* zg) {
  const at::Tensor actt = transposed(act, s);
  const at::Tensor v = values.to(y.scalar_type()).contiguous();
  const auto p = problem<T>(s, xt, actt, at::Tensor(), v, index);
  check_index_contents(forward_kernel<T>(p, &y, zg), "sparse_forward");
}

// (y, Zg^T or empty, xt); `ones`: x is [B, I - 1], the index's last input being the constant 1
// (a GLAI head's), and xt [I, ld] carries it as its last row.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cpu(const at::Tensor& x,
                                                           const at::Tensor& act,
                                                           const at::Tensor& values,
                                                           at::TensorList index_list, bool save,
                                                           bool ones) {
  const std::vector<at::Tensor> index(index_list.begin(), index_list.end());
  const Sizes s = check(x, act, values, index, ones);
  const auto acc = x.options().dtype(accumulation(x.scalar_type()));
  // the kernel writes every element of both (the index checks make its ranges a partition)
  at::Tensor y = at::empty({s.batch, s.outputs}, acc);
  at::Tensor zg = at::empty({save ? s.groups : 0, save ? s.ld : 0}, acc);
  const at::Tensor xt = transposed(x, s, ones);
  if (s.batch > 0) {
    if (x.scalar_type() == at::kDouble) {
      forward_typed<double>(s, xt, act, values, index, y, save ? &zg : nullptr);
    } else {
      forward_typed<float>(s, xt, act, values, index, y, save ? &zg : nullptr);
    }
  }
  return {y.to(x.scalar_type()), zg, xt};
}

std::tuple<at::Tensor, at::Tensor> sparse_forward_cpu(const at::Tensor& x,
                                                      const at::Tensor& act,
                                                      const at::Tensor& values,
                                                      at::TensorList index, bool save) {
  auto [y, zg, xt] = forward_cpu(x, act, values, index, save, false);
  return {y, zg};
}

// sparse_forward for x [B, I - 1] whose index's last input is the constant 1 (a GLAI head's):
// (y, Zg^T or empty, xt [I, ld] with the ones row), xt for sparse_backward_xt. The eager node
// builds no x with a column of ones (docs/notes/pipeline.md, "The constant-1 row written by the
// transpose, x^T kept for the backward (issue 41, stop 50)").
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_forward_ones_cpu(
    const at::Tensor& x, const at::Tensor& act, const at::Tensor& values, at::TensorList index,
    bool save) {
  return forward_cpu(x, act, values, index, save, true);
}

template <typename T>
void backward_typed(const Sizes& s, const at::Tensor& dy, const at::Tensor& x,
                    const at::Tensor& act, const at::Tensor& values,
                    const std::vector<at::Tensor>& index, const at::Tensor& saved,
                    at::Tensor& dx, at::Tensor& dact, at::Tensor& dv,
                    const at::Tensor& kept_xt = at::Tensor()) {
  const bool recompute = dact.defined() && !saved.defined();
  const at::Tensor xt = kept_xt.defined()                    ? kept_xt
                        : (dv.defined() || recompute) ? transposed(x, s)
                                                      : at::Tensor();
  const at::Tensor actt = transposed(act, s), dyt = transposed(dy, s);
  const at::Tensor v = values.to(actt.scalar_type()).contiguous();
  const auto p = problem<T>(s, xt, actt, dyt, v, index);
  const auto& k = glai_cpu::sparse::kernels<T>();
  bool bad = false;
  if (dx.defined()) {
    check_index_contents(!glai_cpu::sparse::groups_in_range(p), "sparse_backward");
    T* out = dx.mutable_data_ptr<T>();
    bad |= run_items(s.inputs, s.ld * s.nnz,
                     [&](int64_t b, int64_t e) { return k.dx(p, out, b, e); });
  }
  if (dv.defined()) {
    T* out = dv.mutable_data_ptr<T>();
    bad |= run_items(s.groups, s.ld * (s.nnz + s.groups),
                     [&](int64_t b, int64_t e) { return k.dvalues(p, out, b, e); });
  }
  if (dact.defined()) {
    at::Tensor zg = saved;
    if (recompute) {
      zg = at::empty({s.groups, s.ld}, actt.options());
      bad |= forward_kernel<T>(p, nullptr, &zg);
    }
    const T* z = zg.const_data_ptr<T>();
    T* out = dact.mutable_data_ptr<T>();
    bad |= run_items(s.paths, s.ld * s.groups,
                     [&](int64_t b, int64_t e) { return k.dact(p, z, out, b, e); });
  }
  check_index_contents(bad, "sparse_backward");
}

// `kept_xt` (sparse_backward_xt): the forward's xt [I, ld] with its ones row, x [B, I - 1]
// (checked against x and the index; dx comes back without the ones column).
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_backward_cpu(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act, const at::Tensor& values,
    at::TensorList index_list, const at::Tensor& saved_in, bool need_x, bool need_act,
    bool need_values, const at::Tensor& kept_xt = at::Tensor()) {
  const std::vector<at::Tensor> index(index_list.begin(), index_list.end());
  const bool ones = kept_xt.defined();
  const Sizes s = check(x, act, values, index, ones);
  check_dy(dy, x, s);
  const auto acc = accumulation(x.scalar_type());
  if (ones)
    TORCH_CHECK(kept_xt.dim() == 2 && kept_xt.size(0) == s.inputs && kept_xt.size(1) == s.ld &&
                    kept_xt.scalar_type() == acc && kept_xt.is_cpu() && kept_xt.is_contiguous(),
                kWho, ": xt must be the forward's contiguous [I, ld] = [", s.inputs, ", ", s.ld,
                "] of dtype ", acc, ", got ", kept_xt.scalar_type(), " ", kept_xt.sizes());
  at::Tensor saved;
  if (saved_in.numel() > 0 && need_act) {
    TORCH_CHECK(saved_in.dim() == 2 && saved_in.size(0) == s.groups && saved_in.size(1) == s.ld,
                kWho, ": saved must be the forward's Zg^T [G, ld] = [", s.groups, ", ", s.ld,
                "], got ", saved_in.sizes());
    TORCH_CHECK(saved_in.scalar_type() == acc && saved_in.is_cpu(), kWho,
                ": saved must be a CPU tensor of dtype ", acc, ", got ", saved_in.scalar_type(),
                " on ", saved_in.device());
    saved = saved_in.contiguous();
  }
  const auto opts = x.options().dtype(acc);
  // the kernels write every element; with B = 0 every gradient is an empty sum
  auto grad = [&](bool need, at::IntArrayRef shape) {
    if (!need) return at::Tensor();
    return s.batch == 0 ? at::zeros(shape, opts) : at::empty(shape, opts);
  };
  at::Tensor dx = grad(need_x, {s.batch, s.inputs});
  at::Tensor dact = grad(need_act, {s.batch, s.paths});
  at::Tensor dv = grad(need_values, {s.nnz});
  if (s.batch > 0 && (need_x || need_act || need_values)) {
    if (acc == at::kDouble) {
      backward_typed<double>(s, dy, x, act, values, index, saved, dx, dact, dv, kept_xt);
    } else {
      backward_typed<float>(s, dy, x, act, values, index, saved, dx, dact, dv, kept_xt);
    }
  }
  if (ones && dx.defined()) dx = dx.narrow(1, 0, s.inputs - 1).contiguous();
  auto result = [&](const at::Tensor& t) {
    return t.defined() ? t.to(x.scalar_type()) : at::empty({0}, x.options());
  };
  return {result(dx), result(dact), result(dv)};
}

// The ops' `needs` list, checked: [need_x, need_act, need_values].
std::array<bool, 3> needs_of(const c10::List<bool>& needs) {
  TORCH_CHECK(needs.size() == 3, kWho, ": needs must be [need_x, need_act, need_values], got ",
              needs.size(), " entries");
  return {needs.get(0), needs.get(1), needs.get(2)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_backward_cpu_needs(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act, const at::Tensor& values,
    at::TensorList index, const at::Tensor& saved, c10::List<bool> needs) {
  const auto [need_x, need_act, need_values] = needs_of(needs);
  return sparse_backward_cpu(dy, x, act, values, index, saved, need_x, need_act, need_values);
}

// sparse_backward from the xt that sparse_forward_ones kept, for x [B, I - 1] (the checks):
// dx [B, I - 1] (the ones column has no gradient), dact, dvalues.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_backward_xt_cpu(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& xt, const at::Tensor& act,
    const at::Tensor& values, at::TensorList index, const at::Tensor& saved,
    c10::List<bool> needs) {
  const auto [need_x, need_act, need_values] = needs_of(needs);
  return sparse_backward_cpu(dy, x, act, values, index, saved, need_x, need_act, need_values,
                             xt);
}

// dvalues then Adam over groups of about this many entries at a time, so that each chunk's
// gradient, values and moments are still in L1/L2 when the update reads them (a separate
// optimizer pass re-reads all four arrays from L3: docs/notes/sparse.md, "Adam inside dvalues").
constexpr int64_t kAdamChunk = 4096;

template <typename T>
bool dvalues_adam_typed(const Sizes& s, const at::Tensor& dy, const at::Tensor& x,
                        const at::Tensor& act, at::Tensor& values,
                        const std::vector<at::Tensor>& index, at::Tensor& exp_avg,
                        at::Tensor& exp_avg_sq, const glai_cpu::sparse::AdamStep<T>& a) {
  const at::Tensor xt = transposed(x, s), actt = transposed(act, s), dyt = transposed(dy, s);
  const auto p = problem<T>(s, xt, actt, dyt, values, index);
  const auto& k = glai_cpu::sparse::kernels<T>();
  T* w = values.mutable_data_ptr<T>();
  T* m = exp_avg.mutable_data_ptr<T>();
  T* v = exp_avg_sq.mutable_data_ptr<T>();
  const int32_t* ptr = p.group_ptr;
  return run_items(s.groups, s.ld * (s.nnz + s.groups), [&](int64_t b, int64_t e) {
    // one chunk's gradient at a time, never all of dv [K]: a [K] tensor per step cost a
    // fresh allocation (its pages faulted in on first touch) and its write-back to memory
    std::vector<T> grad;
    int bad = 0;
    for (int64_t g0 = b; g0 < e;) {
      int64_t g1 = g0 + 1;
      while (g1 < e && ptr[g1 + 1] - ptr[g0] <= kAdamChunk) ++g1;
      const int64_t k0 = ptr[g0], k1 = ptr[g1];
      // a chunk whose offsets or inputs are bad is not updated (the op then raises)
      if (!(0 <= k0 && k0 <= k1 && k1 <= s.nnz)) {
        bad = 1;
      } else {
        if (static_cast<int64_t>(grad.size()) < k1 - k0) grad.resize(k1 - k0);
        // the kernel writes dv[k] for the chunk's k in [k0, k1): its base is k0 before ours
        if (k.dvalues(p, grad.data() - k0, g0, g1) != 0)
          bad = 1;
        else
          k.adam(a, w + k0, m + k0, v + k0, grad.data(), k1 - k0);
      }
      g0 = g1;
    }
    return bad;
  });
}

template <typename T>
glai_cpu::sparse::AdamStep<T> adam_step(double lr, double beta1, double beta2,
                                        double weight_decay, double eps, double step,
                                        bool decoupled) {
  // torch.optim's fused Adam: the scalars in double, rounded to the parameter's dtype
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  return {T(beta1),          T(beta2),
          T(1 - beta1),      T(1 - beta2),
          T(weight_decay),   T(eps),
          T(lr / bias_correction1), T(std::sqrt(bias_correction2)),
          T(1 - lr * weight_decay), decoupled};
}

// A moment of `owner` (the kept values [K] or the bias [O]): its shape, dtype and layout.
void check_state(const at::Tensor& t, const char* name, const at::Tensor& owner,
                 const char* owner_name = "values") {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == owner.size(0) && t.scalar_type() ==
                  owner.scalar_type() && t.is_cpu() && t.is_contiguous(),
              kWho, ": ", name, " must be a contiguous CPU tensor of ", owner_name,
              "'s shape and dtype ([", owner.size(0), "], ", owner.scalar_type(), "), got ",
              t.scalar_type(), " ", t.sizes(), " on ", t.device(),
              t.is_contiguous() ? "" : " (strided)");
}

void check_hyper(double lr, double beta1, double beta2, double weight_decay, double eps,
                 double step) {
  TORCH_CHECK(step >= 1, kWho, ": step must be >= 1 (the count after this update), got ", step);
  TORCH_CHECK(lr >= 0 && eps >= 0 && weight_decay >= 0 && 0 <= beta1 && beta1 < 1 &&
                  0 <= beta2 && beta2 < 1,
              kWho, ": need lr, eps, weight_decay >= 0 and betas in [0, 1), got lr=", lr,
              ", betas=(", beta1, ", ", beta2, "), weight_decay=", weight_decay, ", eps=", eps);
}

void sparse_dvalues_adam_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act,
                             at::Tensor& values, at::TensorList index_list, at::Tensor& exp_avg,
                             at::Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                             double weight_decay, double eps, double step, bool decoupled) {
  const std::vector<at::Tensor> index(index_list.begin(), index_list.end());
  const Sizes s = check(x, act, values, index);
  check_dy(dy, x, s);
  const auto t = values.scalar_type();
  TORCH_CHECK((t == at::kFloat || t == at::kDouble) && values.is_contiguous(), kWho,
              ": values must be a contiguous float32 or float64 tensor (it is updated in "
              "place), got ", t, values.is_contiguous() ? "" : " (strided)");
  check_state(exp_avg, "exp_avg", values);
  check_state(exp_avg_sq, "exp_avg_sq", values);
  check_hyper(lr, beta1, beta2, weight_decay, eps, step);
  if (s.nnz == 0) return;
  if (s.batch == 0) {
    // every gradient is an empty sum: the update with g = 0
    at::Tensor zero = at::zeros({s.nnz}, values.options());
    auto run = [&](auto* w) {
      using T = std::remove_pointer_t<decltype(w)>;
      glai_cpu::sparse::kernels<T>().adam(
          adam_step<T>(lr, beta1, beta2, weight_decay, eps, step, decoupled), w,
          exp_avg.mutable_data_ptr<T>(), exp_avg_sq.mutable_data_ptr<T>(),
          zero.const_data_ptr<T>(), s.nnz);
    };
    t == at::kDouble ? run(values.mutable_data_ptr<double>())
                     : run(values.mutable_data_ptr<float>());
    return;
  }
  const bool bad =
      t == at::kDouble
          ? dvalues_adam_typed<double>(s, dy, x, act, values, index, exp_avg, exp_avg_sq,
                                       adam_step<double>(lr, beta1, beta2, weight_decay, eps,
                                                         step, decoupled))
          : dvalues_adam_typed<float>(s, dy, x, act, values, index, exp_avg, exp_avg_sq,
                                      adam_step<float>(lr, beta1, beta2, weight_decay, eps,
                                                       step, decoupled));
  TORCH_CHECK(!bad, "glai_ext::sparse_dvalues_adam: the index is corrupt (an offset or index "
              "out of range, or offsets that decrease); the groups before the bad one were "
              "updated. Build it with glai_kernels.sparse.from_dense or from_entries");
}

// bias [O] -= Adam / AdamW of g[o] = sum_b dy[b, o] (b in order), moments in place: the fused
// step's bias update in one call instead of torch's sum, step count and _fused_adam_ (each an
// op dispatch, ≈ 17 µs together inside a B1 step: docs/notes/sparse.md, "The bias's update in one
// call, and the selector's tiles").
void bias_adam_cpu(const at::Tensor& dy, at::Tensor& bias, at::Tensor& exp_avg,
                   at::Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                   double weight_decay, double eps, double step, bool decoupled) {
  constexpr const char* who = "glai_ext::bias_adam";
  const auto t = bias.scalar_type();
  TORCH_CHECK(bias.dim() == 1 && (t == at::kFloat || t == at::kDouble) && bias.is_cpu() &&
                  bias.is_contiguous(),
              who, ": bias must be a contiguous 1-D float32 or float64 CPU tensor (it is "
              "updated in place), got ", t, " ", bias.sizes(), " on ", bias.device(),
              bias.is_contiguous() ? "" : " (strided)");
  TORCH_CHECK(dy.dim() == 2 && dy.size(1) == bias.size(0) && dy.scalar_type() == t &&
                  dy.is_cpu(),
              who, ": dy must be a [B, ", bias.size(0), "] CPU tensor of bias's dtype (", t,
              "), got ", dy.scalar_type(), " ", dy.sizes(), " on ", dy.device());
  check_state(exp_avg, "exp_avg", bias, "bias");
  check_state(exp_avg_sq, "exp_avg_sq", bias, "bias");
  check_hyper(lr, beta1, beta2, weight_decay, eps, step);
  const at::Tensor rows = dy.contiguous();
  auto run = [&](auto* w) {
    using T = std::remove_pointer_t<decltype(w)>;
    const int64_t batch = rows.size(0), n = bias.size(0);
    const T* d = rows.const_data_ptr<T>();
    std::vector<T> grad(n, T(0));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t o = 0; o < n; ++o) grad[o] += d[b * n + o];
    glai_cpu::sparse::kernels<T>().adam(
        adam_step<T>(lr, beta1, beta2, weight_decay, eps, step, decoupled), w,
        exp_avg.mutable_data_ptr<T>(), exp_avg_sq.mutable_data_ptr<T>(), grad.data(), n);
  };
  t == at::kDouble ? run(bias.mutable_data_ptr<double>()) : run(bias.mutable_data_ptr<float>());
}

int64_t sparse_min_work(int64_t work) {
  return work >= 0 ? g_min_work.exchange(work) : g_min_work.load();
}

}  // namespace

// No dispatch key: one kernel for every caller, as a schema's own (it takes no tensor).
TORCH_LIBRARY_FRAGMENT(glai_ext, m) { m.impl("sparse_min_work", &sparse_min_work); }

TORCH_LIBRARY_IMPL(glai_ext, CPU, m) {
  m.impl("sparse_forward", &sparse_forward_cpu);
  m.impl("sparse_backward", &sparse_backward_cpu_needs);
  m.impl("sparse_forward_ones", &sparse_forward_ones_cpu);
  m.impl("sparse_backward_xt", &sparse_backward_xt_cpu);
  m.impl("sparse_dvalues_adam", &sparse_dvalues_adam_cpu);
  m.impl("bias_adam", &bias_adam_cpu);
}

}  // namespace glai_ext
