// The CPU implementation of the dense glai_ext ops (schemas: ../schema.cpp): forward,
// backward and linear on the kernels of cpu/kernels.h, and the control ops (the instruction
// set, the task runner, the thread threshold, the kept results of gradient_cache.h). Also the
// argument checks of glai_ext.h, which the CUDA binding shares.
//
// `saved` is Z [B, O, P] in the computation type (float for half inputs, never rounded to
// them) when `save` is true, else empty; the backward takes dact from it at B*O*P cost
// instead of a GEMM. The CUDA implementation of the same schemas is registered by
// cuda/cuda_dense_binding.cpp when it is built.
//
// Narrow ATen headers instead of torch/extension.h halve the first build
// (docs/notes/cpu-kernels.md).
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "gradient_cache.h"
#include "task_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cpu/kernels.h"
#include "glai_ext.h"

namespace glai_ext {

Sizes check_problem(const at::Tensor& x, const at::Tensor& act, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2, "glai_ext: x must be [B, I], got ", x.sizes());
  TORCH_CHECK(act.dim() == 2, "glai_ext: act must be [B, P], got ", act.sizes());
  TORCH_CHECK(weight.dim() == 3, "glai_ext: weight must be [O, I, P], got ", weight.sizes());
  TORCH_CHECK(act.scalar_type() == x.scalar_type() && weight.scalar_type() == x.scalar_type(),
              "glai_ext: x, act and weight must share a dtype, got ", x.scalar_type(), ", ",
              act.scalar_type(), ", ", weight.scalar_type());
  TORCH_CHECK(act.device() == x.device() && weight.device() == x.device(),
              "glai_ext: x, act and weight must be on one device");
  const Sizes s{x.size(0), x.size(1), act.size(1), weight.size(0)};
  TORCH_CHECK(act.size(0) == s.batch, "glai_ext: act has ", act.size(0), " rows, x has ",
              s.batch);
  TORCH_CHECK(weight.size(1) == s.inputs && weight.size(2) == s.paths,
              "glai_ext: weight must be [O, ", s.inputs, ", ", s.paths, "], got ",
              weight.sizes());
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              "glai_ext: dtype must be float32, float64, float16 or bfloat16, got ", t);
  return s;
}

void check_dy(const at::Tensor& dy, const at::Tensor& x, const Sizes& s) {
  TORCH_CHECK(dy.dim() == 2 && dy.size(0) == s.batch && dy.size(1) == s.outputs,
              "glai_ext: dy must be [", s.batch, ", ", s.outputs, "], got ", dy.sizes());
  TORCH_CHECK(dy.scalar_type() == x.scalar_type() && dy.device() == x.device(),
              "glai_ext: dy must match x's dtype and device");
}

// The computation type of a dtype: at::opmath_type (float for half types).
at::ScalarType opmath(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return at::kDouble;
    case at::kFloat: return at::kFloat;
    case at::kHalf: return c10::CppTypeToScalarType<at::opmath_type<at::Half>>::value;
    default: return c10::CppTypeToScalarType<at::opmath_type<at::BFloat16>>::value;
  }
}

namespace {

// Work below this many FLOPs per thread stays on fewer threads: ~8 us of one core here.
// Tasks are claimed from a shared counter, so a helper that starts late holds no work
// (task_pool.h); with OpenMP regions of one static chunk per thread this had to be 256 MFLOP,
// with the pool's sleeping helpers 16 MFLOP (docs/notes/cpu-kernels.md, "Two threads without
// waiting for a thread that never started", "The paper's batch at two threads").
// glai_ext::min_flops_per_thread sets it (0: every call on all threads; a test hook).
std::atomic<int64_t> g_min_flops_per_thread{int64_t{2} << 20};

struct TaskRange {
  glai_cpu::TaskFn fn;
  void* ctx;
};

// Task t of n, one at a time from the pool's shared counter: each output element belongs to one
// task whatever thread runs it, so results stay the same bits for any thread count or schedule.
int run_tasks(int64_t n, int64_t threads, glai_cpu::TaskFn fn, void* ctx) {
  TaskRange range{fn, ctx};
  return glai_pool::run(
      n, static_cast<int>(threads - 1),
      [](void* c, int64_t t) {
        const auto* r = static_cast<TaskRange*>(c);
        r->fn(r->ctx, t, t + 1);
      },
      &range);
}

void run_parallel(int64_t n, int64_t flops, glai_cpu::TaskFn fn, void* ctx) {
  // torch.set_num_threads governs the kernels; one thread inside a parallel region of torch's
  const int64_t threads = glai_pool::threads_for(
      n, flops, g_min_flops_per_thread.load(), at::in_parallel_region() ? 1 : at::get_num_threads());
  if (threads <= 1) {
    fn(ctx, 0, n);
    return;
  }
  run_tasks(n, threads, fn, ctx);
}

// A contiguous tensor in the computation type (a no-op for float and double inputs).
at::Tensor in_opmath(const at::Tensor& t) { return t.to(opmath(t.scalar_type())).contiguous(); }

template <typename T>
glai_cpu::Problem<T> problem(const at::Tensor& x, const at::Tensor& act, const at::Tensor& w,
                             const Sizes& s) {
  return {x.const_data_ptr<T>(), act.const_data_ptr<T>(), w.const_data_ptr<T>(),
          s.batch, s.inputs, s.paths, s.outputs,
          static_cast<int64_t>(at::get_num_threads()), run_parallel};
}

bool empty_problem(const Sizes& s) {
  return s.batch == 0 || s.inputs == 0 || s.paths == 0 || s.outputs == 0;
}

template <typename T>
void forward_typed(const at::Tensor& x, const at::Tensor& act, const at::Tensor& w,
                   const Sizes& s, at::Tensor& y, at::Tensor* z) {
  const int status = glai_cpu::kernels<T>().forward(problem<T>(x, act, w, s),
                                                    y.mutable_data_ptr<T>(),
                                                    z ? z->mutable_data_ptr<T>() : nullptr);
  TORCH_CHECK(status == 0, "glai_ext: out of memory for the CPU kernels' scratch buffers");
}

// bfloat16 problems run on their own kernels where the CPU has AVX512_BF16 (null otherwise).
const glai_cpu::Bf16Kernels* bf16_kernels_for(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 ? glai_cpu::bf16_kernels() : nullptr;
}

const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}
uint16_t* mutable_bits(at::Tensor& t) {
  return t.defined() ? reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()) : nullptr;
}

glai_cpu::Problem<uint16_t> bf16_problem(const at::Tensor& x, const at::Tensor& act,
                                         const at::Tensor& w, const Sizes& s) {
  return {bits(x), bits(act), bits(w), s.batch, s.inputs, s.paths, s.outputs,
          static_cast<int64_t>(at::get_num_threads()), run_parallel};
}

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& x_in, const at::Tensor& act_in,
                                               const at::Tensor& w_in, bool save) {
  const Sizes s = check_problem(x_in, act_in, w_in);
  if (const auto* bf16 = bf16_kernels_for(x_in); bf16 != nullptr && !empty_problem(s)) {
    const at::Tensor x = x_in.contiguous(), act = act_in.contiguous(), w = w_in.contiguous();
    at::Tensor y = at::empty({s.batch, s.outputs}, x.options());
    at::Tensor z = at::empty({save ? s.batch : 0, s.outputs, s.paths},
                             x.options().dtype(at::kFloat));
    const int status = bf16->forward(bf16_problem(x, act, w, s), mutable_bits(y),
                                     save ? z.mutable_data_ptr<float>() : nullptr);
    TORCH_CHECK(status == 0, "glai_ext: out of memory for the CPU kernels' scratch buffers");
    return {y, save ? z : at::empty({0}, x.options())};
  }
  const at::Tensor x = in_opmath(x_in), act = in_opmath(act_in), w = in_opmath(w_in);
  const auto opts = x.options();
  // the kernels write every element: no zero fill (a second pass over dweight-sized memory)
  at::Tensor y = at::empty({s.batch, s.outputs}, opts);
  at::Tensor z = at::empty({save ? s.batch : 0, s.outputs, s.paths}, opts);
  if (empty_problem(s)) y.zero_();
  if (!empty_problem(s)) {
    if (x.scalar_type() == at::kDouble) {
      forward_typed<double>(x, act, w, s, y, save ? &z : nullptr);
    } else {
      forward_typed<float>(x, act, w, s, y, save ? &z : nullptr);
    }
  }
  // Z stays in the computation type: a kept partial sum of half inputs is float, so it
  // cannot overflow (float16) or lose bits (both) before the backward reads it.
  const auto out = x_in.scalar_type();
  return {y.to(out), save ? z : at::empty({0}, x_in.options())};
}

template <typename T>
void backward_typed(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act,
                    const at::Tensor& w, const at::Tensor& z, const Sizes& s, at::Tensor& dx,
                    at::Tensor& dact, at::Tensor& dw) {
  auto ptr = [](at::Tensor& t) { return t.defined() ? t.mutable_data_ptr<T>() : nullptr; };
  const int status = glai_cpu::kernels<T>().backward(
      problem<T>(x, act, w, s), dy.const_data_ptr<T>(),
      z.defined() ? z.const_data_ptr<T>() : nullptr, ptr(dx), ptr(dact), ptr(dw));
  TORCH_CHECK(status == 0, "glai_ext: out of memory for the CPU kernels' scratch buffers");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& act_in,
    const at::Tensor& w_in, const at::Tensor& saved, bool need_x, bool need_act,
    bool need_weight) {
  const Sizes s = check_problem(x_in, act_in, w_in);
  check_dy(dy_in, x_in, s);
  const bool has_z = saved.numel() > 0;
  if (has_z) {
    TORCH_CHECK(saved.dim() == 3 && saved.size(0) == s.batch && saved.size(1) == s.outputs &&
                    saved.size(2) == s.paths,
                "glai_ext: saved must be the forward's Z [B, O, P], got ", saved.sizes());
    TORCH_CHECK(saved.scalar_type() == opmath(x_in.scalar_type()),
                "glai_ext: saved must be the forward's Z in ", opmath(x_in.scalar_type()),
                ", got ", saved.scalar_type());
  }
  const auto* bf16 = bf16_kernels_for(x_in);
  if (bf16 != nullptr && !empty_problem(s) && (has_z || !need_act)) {
    const at::Tensor x = x_in.contiguous(), act = act_in.contiguous(), w = w_in.contiguous();
    const at::Tensor dy = dy_in.contiguous();
    const at::Tensor z = (has_z && need_act) ? saved.contiguous() : at::Tensor();
    const auto opts = x.options();
    at::Tensor dx = need_x ? at::empty({s.batch, s.inputs}, opts) : at::Tensor();
    at::Tensor dact = need_act ? at::empty({s.batch, s.paths}, opts) : at::Tensor();
    at::Tensor dw = need_weight ? glai_cache::empty_result({s.outputs, s.inputs, s.paths}, opts)
                                : at::Tensor();
    if (need_x || need_act || need_weight) {
      const int status = bf16->backward(bf16_problem(x, act, w, s), bits(dy),
                                        z.defined() ? z.const_data_ptr<float>() : nullptr,
                                        mutable_bits(dx),
                                        mutable_bits(dact), mutable_bits(dw));
      TORCH_CHECK(status == 0, "glai_ext: out of memory for the CPU kernels' scratch buffers");
    }
    auto result = [&](const at::Tensor& t) { return t.defined() ? t : at::empty({0}, opts); };
    return {result(dx), result(dact), result(dw)};
  }
  const at::Tensor x = in_opmath(x_in), act = in_opmath(act_in), w = in_opmath(w_in);
  const at::Tensor dy = in_opmath(dy_in);
  const at::Tensor z = (has_z && need_act) ? in_opmath(saved) : at::Tensor();
  const auto opts = x.options();
  auto grad = [&](bool need, at::IntArrayRef shape) {
    if (!need) return at::Tensor();
    // the kernels write every element; an empty problem's gradients are sums of nothing
    return empty_problem(s) ? at::zeros(shape, opts) : glai_cache::empty_result(shape, opts);
  };
  at::Tensor dx = grad(need_x, {s.batch, s.inputs});
  at::Tensor dact = grad(need_act, {s.batch, s.paths});
  at::Tensor dw = grad(need_weight, {s.outputs, s.inputs, s.paths});
  if (!empty_problem(s) && (need_x || need_act || need_weight)) {
    if (x.scalar_type() == at::kDouble) {
      backward_typed<double>(dy, x, act, w, z, s, dx, dact, dw);
    } else {
      backward_typed<float>(dy, x, act, w, z, s, dx, dact, dw);
    }
  }
  const auto out = x_in.scalar_type();
  auto result = [&](const at::Tensor& t) {
    return t.defined() ? t.to(out) : at::empty({0}, x_in.options());
  };
  return {result(dx), result(dact), result(dw)};
}

// glai_ext::linear: a frozen layer, out [B, N] = x weight_t + bias, or its 0/1 gates
// [out > 0] when `gates` (the path selector's layer); float32 and float64.
at::Tensor linear_cpu(const at::Tensor& x_in, const at::Tensor& w_in,
                      const std::optional<at::Tensor>& bias_in, bool gates) {
  TORCH_CHECK(x_in.dim() == 2, "glai_ext::linear: x must be [B, I], got ", x_in.sizes());
  TORCH_CHECK(w_in.dim() == 2 && w_in.size(0) == x_in.size(1),
              "glai_ext::linear: weight_t must be [I = ", x_in.size(1), ", N], got ",
              w_in.sizes());
  const auto t = x_in.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble,
              "glai_ext::linear: x must be float32 or float64, got ", t);
  TORCH_CHECK(w_in.scalar_type() == t && w_in.device() == x_in.device(),
              "glai_ext::linear: weight_t must match x's dtype and device");
  const int64_t n = w_in.size(1);
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    bias = bias_in->contiguous();
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == n, "glai_ext::linear: bias must be [", n,
                "], got ", bias.sizes());
    TORCH_CHECK(bias.scalar_type() == t && bias.device() == x_in.device(),
                "glai_ext::linear: bias must match x's dtype and device");
  }
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Sizes s{x.size(0), x.size(1), n, 1};
  if (s.batch == 0 || s.paths == 0 || s.inputs == 0) {  // an empty sum is zero
    at::Tensor pre = at::zeros({s.batch, n}, x.options());
    if (bias.defined()) pre.add_(bias);
    return gates ? pre.gt(0).to(t) : pre;
  }
  at::Tensor out = at::empty({s.batch, n}, x.options());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const glai_cpu::Problem<T> p{x.const_data_ptr<T>(), nullptr, w.const_data_ptr<T>(),
                                 s.batch, s.inputs, s.paths, s.outputs,
                                 static_cast<int64_t>(at::get_num_threads()), run_parallel};
    return glai_cpu::kernels<T>().linear(p, bias.defined() ? bias.const_data_ptr<T>() : nullptr,
                                         out.mutable_data_ptr<T>(), gates);
  };
  const int status = t == at::kDouble ? run(double{}) : run(float{});
  TORCH_CHECK(status == 0, "glai_ext: out of memory for the CPU kernels' scratch buffers");
  return out;
}

std::string cpu_runner(const std::string& name) {
  glai_pool::Runner chosen;
  if (glai_pool::runner_named(name.c_str(), &chosen)) glai_pool::select_runner(chosen);
  else TORCH_CHECK(name.empty(), "glai_ext: runner must be 'pool' or 'openmp', got '", name, "'");
  return glai_pool::runner_name(glai_pool::runner());
}

std::string cpu_isa(const std::string& name) {
  if (!name.empty()) {
    TORCH_CHECK(glai_cpu::select_isa(name.c_str()), "glai_ext: CPU instruction set '", name,
                "' is unknown or unsupported here; this CPU supports ",
                glai_cpu::supported_isas());
  }
  return glai_cpu::isa();
}

// How many distinct threads ran `tasks` tasks through the kernels' task pool, after checking
// that each task ran exactly once: lets a test check that torch.set_num_threads governs them.
// Each task sleeps long enough that every helper wakes and takes one before the counter runs
// out.
int64_t parallel_threads(int64_t tasks) {
  TORCH_CHECK(tasks >= 0, "glai_ext::parallel_threads: tasks must be >= 0, got ", tasks);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks);
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  const glai_cpu::TaskFn count = [](void* ctx, int64_t begin, int64_t end) {
    auto* r = static_cast<std::atomic<int>*>(ctx);
    for (int64_t t = begin; t < end; ++t) r[t].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  int seen = tasks > 0 ? 1 : 0;
  if (threads <= 1) {
    count(runs.data(), 0, tasks);
  } else {
    seen = run_tasks(tasks, threads, count, runs.data());
  }
  for (int64_t t = 0; t < tasks; ++t)
    TORCH_CHECK(runs[t].load() == 1, "glai_ext::parallel_threads: task ", t, " ran ",
                runs[t].load(), " times");
  return seen;
}

int64_t release_cached_results() { return glai_cache::release(); }
int64_t cached_result_bytes() { return glai_cache::held_bytes(); }
int64_t cached_result_limit(int64_t bytes) { return glai_cache::held_limit(bytes); }

// The FLOPs per thread below which a dense kernel call uses fewer threads; returns the old
// value (a negative `flops` only reads it).
int64_t min_flops_per_thread(int64_t flops) {
  return flops >= 0 ? g_min_flops_per_thread.exchange(flops) : g_min_flops_per_thread.load();
}

}  // namespace

// No dispatch key: one kernel for every caller, as a schema's own (these ops take no tensor).
TORCH_LIBRARY_FRAGMENT(glai_ext, m) {
  m.impl("cpu_isa", &cpu_isa);
  m.impl("cpu_runner", &cpu_runner);
  m.impl("parallel_threads", &parallel_threads);
  m.impl("min_flops_per_thread", &min_flops_per_thread);
  m.impl("release_cached_results", &release_cached_results);
  m.impl("cached_result_bytes", &cached_result_bytes);
  m.impl("cached_result_limit", &cached_result_limit);
}

TORCH_LIBRARY_IMPL(glai_ext, CPU, m) {
  m.impl("forward", &forward_cpu);
  m.impl("backward", &backward_cpu);
  m.impl("linear", &linear_cpu);
}

}  // namespace glai_ext

namespace glai_cpu {

ParallelFn dense_parallel() { return &glai_ext::run_parallel; }

}  // namespace glai_cpu
