// The glai_ext operator library: every op's schema, dense and sparse, defined here once. The
// kernels are registered where they are written, by dispatch key:
//   CPU       cpu/cpu_dense_binding.cpp (forward, backward, linear),
//             cpu/cpu_sparse_binding.cpp (sparse_forward, sparse_backward,
//             sparse_dvalues_adam, bias_adam)
//   CUDA      cuda/cuda_dense_binding.cpp (forward, backward),
//             cuda/cuda_sparse_binding.cpp (sparse_forward, sparse_backward),
//             cuda/cuda_sparse_step_binding.cpp (sparse_dvalues_adam_t, bias_adam_t), when built
//   Autograd  eager_autograd.cpp (estimator_eager),
//             cpu/sparse_eager_autograd.cpp (sparse_estimator_eager)
//   CPU, with their schemas beside them: cpu/engineered_steps.cpp (sparse_step_forward,
//             sparse_step_update, mlp_step_forward, mlp_step_update: the engineered protocol's
//             steps, GLAI's and the MLP's, as one call for the forward and one for the update)
//   none      the control ops, which take no tensor (one kernel for every caller): in the CPU
//             binding of their kernels
// The dispatcher holds a kernel registered before its schema until the schema arrives, so
// the order in which the sources' static initialisers run does not matter.
//
// Dense:
//   glai_ext::forward(x [B, I], act [B, P], weight [O, I, P], save) -> (y [B, O], saved)
//   glai_ext::backward(dy, x, act, weight, saved, need_x, need_act, need_weight)
//       -> (dx [B, I], dact [B, P], dweight [O, I, P]), each empty [0] when not needed
//   glai_ext::linear(x [B, I], weight_t [I, N], bias [N]?, gates) -> [B, N]: a frozen layer
//       (x weight_t + bias, or its 0/1 gates when `gates`), float32/float64, CPU only
//   glai_ext::estimator_eager(x, act, weight, bias?, save, backend) -> y [B, O]: the forward
//       plus bias with its autograd node in C++ (eager_autograd.cpp)
// `saved` is Z [B, O, P] (Z[b, o, s] = sum_i x[b, i] weight[o, i, s]) when `save` is true,
// in the computation type (float for half inputs, never rounded to them), else empty; the
// backward takes dact from it at B*O*P cost instead of a GEMM.
//
// Sparse (the kept-path layout):
//   glai_ext::sparse_forward(x [B, I], act [B, P], values [K], index, save) -> (y [B, O], zg)
//   glai_ext::sparse_backward(dy [B, O], x, act, values, index, saved, needs [3])
//       -> (dx [B, I], dact [B, P], dvalues [K]), each empty [0] when not needed
//   glai_ext::sparse_estimator_eager(x, act, values, index, bias?, save, backend, ones) -> y:
//       the forward plus bias with its autograd node in C++ (cpu/sparse_eager_autograd.cpp)
//   glai_ext::sparse_dvalues_adam(dy, x, act, values!, index, exp_avg!, exp_avg_sq!, lr, beta1,
//       beta2, weight_decay, eps, step, decoupled) -> (): dvalues and one Adam / AdamW update
//       of values and its moments in place (CPU)
//   glai_ext::bias_adam(dy, bias!, exp_avg!, exp_avg_sq!, lr, beta1, beta2, weight_decay, eps,
//       step, decoupled) -> (): the same update of bias [O] from dy summed over the batch (CPU)
//   glai_ext::sparse_dvalues_adam_t, glai_ext::bias_adam_t: the same two with `step` a tensor
//       (one float32 on the parameter's device, the optimizer's advanced state["step"]) that the
//       kernel reads, so neither the host waits for it nor a CUDA graph freezes it (CUDA)
// `index` is the ten KeptIndex tensors in field order (glai_kernels/sparse/layout.py); `zg`,
// the group sums Zg^T in the accumulation type, when `save`, else empty.
//
// Control (no tensor):
//   glai_ext::cpu_isa(name="") -> the CPU instruction set in use (name selects one)
//   glai_ext::cpu_runner(name="") -> who runs the kernels' tasks: "pool" or "openmp"
//   glai_ext::parallel_threads(tasks) -> threads that ran the tasks (a test hook)
//   glai_ext::min_flops_per_thread(flops=-1) -> the dense kernels' threshold (a test hook)
//   glai_ext::release_cached_results() -> bytes freed of the large results kept for reuse
//       (gradient_cache.h); glai_ext::cached_result_bytes() -> bytes kept now;
//       glai_ext::cached_result_limit(bytes=-1) -> the limit before (sets it when >= 0)
//   glai_ext::sparse_min_work(work=-1) -> the multiply-adds per thread below which the sparse
//       kernels use fewer threads (work >= 0 sets it; returns the value before)
#include <torch/library.h>

TORCH_LIBRARY(glai_ext, m) {
  // dense
  m.def("forward(Tensor x, Tensor act, Tensor weight, bool save) -> (Tensor, Tensor)");
  m.def(
      "backward(Tensor dy, Tensor x, Tensor act, Tensor weight, Tensor saved, bool need_x, "
      "bool need_act, bool need_weight) -> (Tensor, Tensor, Tensor)");
  m.def("linear(Tensor x, Tensor weight_t, Tensor? bias, bool gates) -> Tensor");
  m.def(
      "estimator_eager(Tensor x, Tensor act, Tensor weight, Tensor? bias, bool save, "
      "str backend) -> Tensor");
  // sparse
  m.def(
      "sparse_estimator_eager(Tensor x, Tensor act, Tensor values, Tensor[] index, Tensor? bias,"
      " bool save, str backend, bool ones=False) -> Tensor");
  m.def(
      "sparse_forward(Tensor x, Tensor act, Tensor values, Tensor[] index, bool save)"
      " -> (Tensor, Tensor)");
  m.def(
      "sparse_backward(Tensor dy, Tensor x, Tensor act, Tensor values, Tensor[] index,"
      " Tensor saved, bool[] needs) -> (Tensor, Tensor, Tensor)");
  // the eager node's pair for x without its constant-1 last input (CPU; sparse_op_calls.h)
  m.def(
      "sparse_forward_ones(Tensor x, Tensor act, Tensor values, Tensor[] index, bool save)"
      " -> (Tensor, Tensor, Tensor)");
  m.def(
      "sparse_backward_xt(Tensor dy, Tensor x, Tensor xt, Tensor act, Tensor values,"
      " Tensor[] index, Tensor saved, bool[] needs) -> (Tensor, Tensor, Tensor)");
  m.def("sparse_dvalues_adam(Tensor dy, Tensor x, Tensor act, Tensor(a!) values, Tensor[] index,"
        " Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, float lr, float beta1, float beta2,"
        " float weight_decay, float eps, float step, bool decoupled) -> ()");
  m.def("bias_adam(Tensor dy, Tensor(a!) bias, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq,"
        " float lr, float beta1, float beta2, float weight_decay, float eps, float step,"
        " bool decoupled) -> ()");
  m.def("sparse_dvalues_adam_t(Tensor dy, Tensor x, Tensor act, Tensor(a!) values,"
        " Tensor[] index, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, Tensor step, float lr,"
        " float beta1, float beta2, float weight_decay, float eps, bool decoupled) -> ()");
  m.def("bias_adam_t(Tensor dy, Tensor(a!) bias, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq,"
        " Tensor step, float lr, float beta1, float beta2, float weight_decay, float eps,"
        " bool decoupled) -> ()");
  // control
  m.def("cpu_isa(str name=\"\") -> str");
  m.def("cpu_runner(str name=\"\") -> str");
  m.def("parallel_threads(int tasks) -> int");
  m.def("min_flops_per_thread(int flops=-1) -> int");
  m.def("release_cached_results() -> int");
  m.def("cached_result_bytes() -> int");
  m.def("cached_result_limit(int bytes=-1) -> int");
  m.def("sparse_min_work(int work=-1) -> int");
}
