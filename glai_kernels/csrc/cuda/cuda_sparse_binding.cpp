// The CUDA implementation of the sparse glai_ext ops (schemas: ../schema.cpp): checks the
// arguments, transposes x, act and dy to the kernels' batch-fastest layout ([rows, B]) and
// launches sparse_kernels.cuh's passes on torch's current stream.
//
// The index's contents (sortedness, ranges) are not re-read per call: they are validated
// once where a SparsePathWeight is built (glai_kernels/sparse/layout.py); every size they
// imply is checked here.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "cuda/sparse_kernels.cuh"
#include "cuda/torch_dtype.h"

namespace glai_ext {
namespace {

constexpr std::array<const char*, 10> kIndexFields = {
    "inputs", "group_ptr", "group_outputs", "group_paths", "output_ptr",
    "input_ptr", "input_entries", "entry_groups", "path_ptr", "path_groups"};

at::ScalarType accumulation(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

struct Sparse {
  int64_t batch, inputs, paths, outputs, nnz, groups;
};

// Ranks, dtypes, devices and every size of (x, act, values, index).
Sparse check(const at::Tensor& x, const at::Tensor& act, const at::Tensor& values,
             at::TensorList index) {
  TORCH_CHECK(x.dim() == 2, "glai_ext sparse: x must be [B, I], got ", x.sizes());
  TORCH_CHECK(act.dim() == 2, "glai_ext sparse: act must be [B, P], got ", act.sizes());
  TORCH_CHECK(values.dim() == 1, "glai_ext sparse: values must be [K], got ", values.sizes());
  to_glai(x.scalar_type(), "glai_ext sparse");
  TORCH_CHECK(act.scalar_type() == x.scalar_type() && values.scalar_type() == x.scalar_type(),
              "glai_ext sparse: x, act and values must share a dtype, got ", x.scalar_type(),
              ", ", act.scalar_type(), ", ", values.scalar_type());
  TORCH_CHECK(x.is_cuda(), "glai_ext sparse: the CUDA implementation got x on ", x.device());
  TORCH_CHECK(act.device() == x.device() && values.device() == x.device(),
              "glai_ext sparse: x, act and values must be on one device, got ", x.device(), ", ",
              act.device(), ", ", values.device());
  TORCH_CHECK(index.size() == kIndexFields.size(), "glai_ext sparse: index must hold ",
              kIndexFields.size(), " tensors (the KeptIndex fields), got ", index.size());
  for (size_t f = 0; f < kIndexFields.size(); ++f) {
    const at::Tensor& t = index[f];
    TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kInt && t.is_contiguous(),
                "glai_ext sparse: index.", kIndexFields[f],
                " must be a contiguous 1-d int32 tensor, got ", t.scalar_type(), " ", t.sizes());
    TORCH_CHECK(t.device() == x.device(), "glai_ext sparse: index.", kIndexFields[f],
                " must be on x's device ", x.device(), ", got ", t.device());
  }
  const Sparse s{x.size(0), index[5].numel() - 1, index[8].numel() - 1, index[4].numel() - 1,
                 values.numel(), index[2].numel()};
  TORCH_CHECK(s.inputs >= 0 && s.paths >= 0 && s.outputs >= 0,
              "glai_ext sparse: index.output_ptr, input_ptr and path_ptr need at least one entry");
  const std::array<int64_t, 10> lengths = {s.nnz, s.groups + 1, s.groups, s.groups,
                                           s.outputs + 1, s.inputs + 1, s.nnz, s.nnz,
                                           s.paths + 1, s.groups};
  for (size_t f = 0; f < kIndexFields.size(); ++f) {
    TORCH_CHECK(index[f].numel() == lengths[f], "glai_ext sparse: index.", kIndexFields[f],
                " must have ", lengths[f], " entries (K = ", s.nnz, ", G = ", s.groups,
                "), got ", index[f].numel());
  }
  TORCH_CHECK(act.size(0) == s.batch, "glai_ext sparse: act has ", act.size(0),
              " rows, x has ", s.batch);
  TORCH_CHECK(x.size(1) == s.inputs, "glai_ext sparse: x must have I = ", s.inputs,
              " columns (index.input_ptr), got ", x.size(1));
  TORCH_CHECK(act.size(1) == s.paths, "glai_ext sparse: act must have P = ", s.paths,
              " columns (index.path_ptr), got ", act.size(1));
  return s;
}

// The kernels' view of one call; the transposed operands are held by the caller.
glai_sparse_problem problem(const at::Tensor& xt, const at::Tensor& actt,
                            const at::Tensor& values, const at::Tensor* dyt,
                            at::TensorList index, const Sparse& s, at::ScalarType dtype) {
  auto ptr = [&](size_t f) { return index[f].const_data_ptr<int32_t>(); };
  return {xt.const_data_ptr(), actt.const_data_ptr(), values.const_data_ptr(),
          dyt != nullptr ? dyt->const_data_ptr() : nullptr,
          ptr(0), ptr(1), ptr(2), ptr(3), ptr(4), ptr(5), ptr(6), ptr(7), ptr(8), ptr(9),
          s.batch, s.inputs, s.paths, s.outputs, s.nnz, s.groups,
          to_glai(dtype, "glai_ext sparse")};
}

// [B, n] -> [n, B] contiguous: the threads of a block run over B.
at::Tensor batch_fastest(const at::Tensor& t) { return t.t().contiguous(); }

void checked(cudaError_t error, const char* pass) {
  TORCH_CHECK(error == cudaSuccess, "glai_ext sparse: CUDA kernel for ", pass, " failed: ",
              cudaGetErrorString(error));
}

std::tuple<at::Tensor, at::Tensor> sparse_forward_cuda(const at::Tensor& x, const at::Tensor& act,
                                                       const at::Tensor& values_in,
                                                       at::TensorList index, bool save) {
  const Sparse s = check(x, act, values_in, index);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xt = batch_fastest(x), actt = batch_fastest(act);
  const at::Tensor values = values_in.contiguous();
  at::Tensor y = at::empty({s.batch, s.outputs}, x.options());
  at::Tensor zgt = at::empty({save ? s.groups : 0, save ? s.batch : 0},
                             x.options().dtype(accumulation(x.scalar_type())));
  const glai_sparse_problem p = problem(xt, actt, values, nullptr, index, s, x.scalar_type());
  checked(glai_sparse_forward(&p, y.data_ptr(), save ? zgt.data_ptr() : nullptr,
                              c10::cuda::getCurrentCUDAStream().stream()),
          "the forward");
  return {y, zgt};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_backward_cuda(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& act, const at::Tensor& values_in,
    at::TensorList index, const at::Tensor& saved, c10::List<bool> needs) {
  const Sparse s = check(x, act, values_in, index);
  TORCH_CHECK(needs.size() == 3, "glai_ext sparse: needs must be [need_x, need_act, "
                                 "need_values], got ", needs.size(), " entries");
  TORCH_CHECK(dy.dim() == 2 && dy.size(0) == s.batch && dy.size(1) == s.outputs,
              "glai_ext sparse: dy must be [", s.batch, ", ", s.outputs, "], got ", dy.sizes());
  TORCH_CHECK(dy.scalar_type() == x.scalar_type() && dy.device() == x.device(),
              "glai_ext sparse: dy must match x's dtype and device");
  const auto acc = accumulation(x.scalar_type());
  if (saved.numel() > 0) {
    TORCH_CHECK(saved.dim() == 2 && saved.size(0) == s.groups && saved.size(1) == s.batch &&
                    saved.scalar_type() == acc && saved.device() == x.device(),
                "glai_ext sparse: saved must be the forward's Zg^T [", s.groups, ", ", s.batch,
                "] of ", acc, " on ", x.device(), ", got ", saved.scalar_type(), " ",
                saved.sizes(), " on ", saved.device());
  }
  const bool need_x = needs.get(0), need_act = needs.get(1), need_values = needs.get(2);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const at::Tensor xt = batch_fastest(x), actt = batch_fastest(act), dyt = batch_fastest(dy);
  const at::Tensor values = values_in.contiguous();
  const glai_sparse_problem p = problem(xt, actt, values, &dyt, index, s, x.scalar_type());
  const auto opts = x.options();
  at::Tensor dx = at::empty({need_x ? s.batch : 0, need_x ? s.inputs : 0}, opts);
  at::Tensor dact = at::empty({need_act ? s.batch : 0, need_act ? s.paths : 0}, opts);
  at::Tensor dvalues = at::empty({need_values ? s.nnz : 0}, opts);
  if (need_x) checked(glai_sparse_dx(&p, dx.data_ptr(), stream), "dx");
  if (need_values) checked(glai_sparse_dvalues(&p, dvalues.data_ptr(), stream), "dvalues");
  if (need_act) {
    at::Tensor zgt = saved.numel() > 0 ? saved.contiguous()
                                       : at::empty({s.groups, s.batch}, opts.dtype(acc));
    if (saved.numel() == 0) {
      checked(glai_sparse_forward(&p, nullptr, zgt.data_ptr(), stream), "the group sums");
    }
    checked(glai_sparse_dact(&p, zgt.const_data_ptr(), dact.data_ptr(), stream), "dact");
  }
  return {dx, dact, dvalues};
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, CUDA, m) {
  m.impl("sparse_forward", &sparse_forward_cuda);
  m.impl("sparse_backward", &sparse_backward_cuda);
}

}  // namespace glai_ext
