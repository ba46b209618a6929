// The CUDA implementation of the fused sparse step's glai_ext ops (schemas: ../schema.cpp):
//   sparse_dvalues_adam_t  dvalues and the Adam/AdamW update of the kept values in one kernel
//   bias_adam_t            dbias = dy summed over the batch and the same update of the bias
// Both take the step count as a tensor (float32, one element, on the parameter's device: the
// optimizer's state["step"], already advanced): the kernel reads it, so the host never waits
// for the device to learn it and a CUDA graph replays with each replay's count. Kernels:
// sparse_step_kernels.cuh. Checks every argument's dtype, device, layout and size; the index's
// contents were validated where the SparsePathWeight was built (glai_kernels/sparse/layout.py).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <array>

#include "cuda/sparse_step_kernels.cuh"
#include "cuda/torch_dtype.h"

namespace glai_ext {
namespace {

constexpr std::array<const char*, 10> kIndexFields = {
    "inputs", "group_ptr", "group_outputs", "group_paths", "output_ptr",
    "input_ptr", "input_entries", "entry_groups", "path_ptr", "path_groups"};

// A parameter updated in place: float32 or float64, contiguous, 1-D, on CUDA.
void check_param(const at::Tensor& t, const char* who, const char* name) {
  const auto type = t.scalar_type();
  TORCH_CHECK(t.dim() == 1 && (type == at::kFloat || type == at::kDouble) && t.is_cuda() &&
                  t.is_contiguous(),
              who, ": ", name, " must be a contiguous 1-D float32 or float64 CUDA tensor (it is "
              "updated in place), got ", type, " ", t.sizes(), " on ", t.device(),
              t.is_contiguous() ? "" : " (strided)");
}

// A moment of `owner`: its shape, dtype and device, contiguous.
void check_state(const at::Tensor& t, const char* who, const char* name, const at::Tensor& owner,
                 const char* owner_name) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == owner.size(0) &&
                  t.scalar_type() == owner.scalar_type() && t.device() == owner.device() &&
                  t.is_contiguous(),
              who, ": ", name, " must be a contiguous tensor of ", owner_name,
              "'s shape, dtype and device ([", owner.size(0), "], ", owner.scalar_type(), ", ",
              owner.device(), "), got ", t.scalar_type(), " ", t.sizes(), " on ", t.device(),
              t.is_contiguous() ? "" : " (strided)");
}

glai_adam_step hyper(const char* who, const at::Tensor& step, const at::Tensor& owner,
                     double lr, double beta1, double beta2, double weight_decay, double eps,
                     bool decoupled) {
  TORCH_CHECK(step.numel() == 1 && step.scalar_type() == at::kFloat &&
                  step.device() == owner.device(),
              who, ": step must be a one-element float32 tensor on ", owner.device(),
              " (the optimizer's state[\"step\"], advanced), got ", step.scalar_type(), " ",
              step.sizes(), " on ", step.device());
  TORCH_CHECK(lr >= 0 && eps >= 0 && weight_decay >= 0 && 0 <= beta1 && beta1 < 1 &&
                  0 <= beta2 && beta2 < 1,
              who, ": need lr, eps, weight_decay >= 0 and betas in [0, 1), got lr=", lr,
              ", betas=(", beta1, ", ", beta2, "), weight_decay=", weight_decay, ", eps=", eps);
  return {lr, beta1, beta2, weight_decay, eps, 1.0, step.const_data_ptr<float>(),
          decoupled ? 1 : 0};
}

void checked(cudaError_t error, const char* who) {
  TORCH_CHECK(error == cudaSuccess, who, ": CUDA kernel failed: ", cudaGetErrorString(error));
}

void sparse_dvalues_adam_t_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act,
                                at::Tensor& values, at::TensorList index, at::Tensor& exp_avg,
                                at::Tensor& exp_avg_sq, const at::Tensor& step, double lr,
                                double beta1, double beta2, double weight_decay, double eps,
                                bool decoupled) {
  constexpr const char* who = "glai_ext::sparse_dvalues_adam_t";
  check_param(values, who, "values");
  check_state(exp_avg, who, "exp_avg", values, "values");
  check_state(exp_avg_sq, who, "exp_avg_sq", values, "values");
  const auto type = values.scalar_type();
  TORCH_CHECK(x.dim() == 2 && act.dim() == 2 && dy.dim() == 2, who,
              ": x, act and dy must be [B, I], [B, P] and [B, O], got ", x.sizes(), ", ",
              act.sizes(), ", ", dy.sizes());
  for (const at::Tensor* t : {&x, &act, &dy}) {
    TORCH_CHECK(t->scalar_type() == type && t->device() == values.device(), who,
                ": x, act and dy must be ", type, " on ", values.device(), " like values, got ",
                t->scalar_type(), " on ", t->device());
  }
  TORCH_CHECK(index.size() == kIndexFields.size(), who, ": index must hold ",
              kIndexFields.size(), " tensors (the KeptIndex fields), got ", index.size());
  for (size_t f = 0; f < kIndexFields.size(); ++f) {
    const at::Tensor& t = index[f];
    TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kInt && t.is_contiguous() &&
                    t.device() == values.device(),
                who, ": index.", kIndexFields[f], " must be a contiguous 1-d int32 tensor on ",
                values.device(), ", got ", t.scalar_type(), " ", t.sizes(), " on ", t.device());
  }
  const int64_t batch = x.size(0), inputs = index[5].numel() - 1, paths = index[8].numel() - 1,
                outputs = index[4].numel() - 1, nnz = values.numel(),
                groups = index[2].numel();
  TORCH_CHECK(inputs >= 0 && paths >= 0 && outputs >= 0, who,
              ": index.output_ptr, input_ptr and path_ptr need at least one entry");
  const std::array<int64_t, 10> lengths = {nnz, groups + 1, groups, groups, outputs + 1,
                                           inputs + 1, nnz, nnz, paths + 1, groups};
  for (size_t f = 0; f < kIndexFields.size(); ++f) {
    TORCH_CHECK(index[f].numel() == lengths[f], who, ": index.", kIndexFields[f], " must have ",
                lengths[f], " entries (K = ", nnz, ", G = ", groups, "), got ",
                index[f].numel());
  }
  TORCH_CHECK(x.size(1) == inputs && act.size(0) == batch && act.size(1) == paths &&
                  dy.size(0) == batch && dy.size(1) == outputs,
              who, ": x, act and dy must be [", batch, ", ", inputs, "], [", batch, ", ", paths,
              "] and [", batch, ", ", outputs, "] (the index's I, P, O), got ", x.sizes(), ", ",
              act.sizes(), ", ", dy.sizes());
  const glai_adam_step a = hyper(who, step, values, lr, beta1, beta2, weight_decay, eps,
                                 decoupled);
  if (nnz == 0) return;
  const c10::cuda::CUDAGuard guard(values.device());
  // the kernel's threads run over the batch: [B, n] -> [n, B] contiguous
  const at::Tensor xt = x.t().contiguous(), actt = act.t().contiguous(),
                   dyt = dy.t().contiguous();
  auto ptr = [&](size_t f) { return index[f].const_data_ptr<int32_t>(); };
  const glai_sparse_problem p{xt.const_data_ptr(), actt.const_data_ptr(), nullptr,
                              dyt.const_data_ptr(), ptr(0), ptr(1), ptr(2), ptr(3), ptr(4),
                              ptr(5), ptr(6), ptr(7), ptr(8), ptr(9), batch, inputs, paths,
                              outputs, nnz, groups, to_glai(type, who)};
  checked(glai_sparse_dvalues_adam(&p, values.data_ptr(), exp_avg.data_ptr(),
                                   exp_avg_sq.data_ptr(), &a,
                                   c10::cuda::getCurrentCUDAStream().stream()),
          who);
}

void bias_adam_t_cuda(const at::Tensor& dy, at::Tensor& bias, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, const at::Tensor& step, double lr, double beta1,
                      double beta2, double weight_decay, double eps, bool decoupled) {
  constexpr const char* who = "glai_ext::bias_adam_t";
  check_param(bias, who, "bias");
  check_state(exp_avg, who, "exp_avg", bias, "bias");
  check_state(exp_avg_sq, who, "exp_avg_sq", bias, "bias");
  TORCH_CHECK(dy.dim() == 2 && dy.size(1) == bias.size(0) &&
                  dy.scalar_type() == bias.scalar_type() && dy.device() == bias.device(),
              who, ": dy must be a [B, ", bias.size(0), "] tensor of bias's dtype and device (",
              bias.scalar_type(), ", ", bias.device(), "), got ", dy.scalar_type(), " ",
              dy.sizes(), " on ", dy.device());
  const glai_adam_step a = hyper(who, step, bias, lr, beta1, beta2, weight_decay, eps,
                                 decoupled);
  const c10::cuda::CUDAGuard guard(bias.device());
  const at::Tensor rows = dy.contiguous();
  checked(glai_bias_adam(rows.const_data_ptr(), rows.size(0), rows.size(1),
                         to_glai(bias.scalar_type(), who), bias.data_ptr(), exp_avg.data_ptr(),
                         exp_avg_sq.data_ptr(), &a, c10::cuda::getCurrentCUDAStream().stream()),
          who);
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, CUDA, m) {
  m.impl("sparse_dvalues_adam_t", &sparse_dvalues_adam_t_cuda);
  m.impl("bias_adam_t", &bias_adam_t_cuda);
}

}  // namespace glai_ext
