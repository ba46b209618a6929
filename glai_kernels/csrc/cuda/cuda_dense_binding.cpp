// The CUDA implementation of the dense glai_ext ops (schemas: ../schema.cpp): translates tensors
// into the C interface of estimator_kernels.cuh and launches on torch's current stream.
//
// The CUDA kernels keep no Z: `save` is accepted and an empty `saved` returned, so the
// backward computes dact with its own GEMM (the `cuda` backend has no forward_saving).
//
// float32 may run on TF32 tensor cores exactly where torch lets its own float32 matmuls:
// torch.backends.cuda.matmul.allow_tf32, or torch.set_float32_matmul_precision("high" or
// "medium"); by default neither, and the kernels keep full float32. Read per call, so a
// change of either setting takes effect at the next call.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <tuple>

#include "cuda/estimator_kernels.cuh"
#include "cuda/torch_dtype.h"
#include "glai_ext.h"

namespace glai_ext {
namespace {

const char* product_name(glai_product product) {
  switch (product) {
    case GLAI_Y: return "y";
    case GLAI_DX: return "dx";
    case GLAI_DACT: return "dact";
    case GLAI_DWEIGHT: return "dweight";
  }
  return "?";
}

// torch's rule for its own float32 matmuls (cuBLAS): TF32 when allowed by either switch
bool tf32_allowed() {
  const at::Context& context = at::globalContext();
  return context.allowTF32CuBLAS() ||
         context.float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
}

glai_problem make_problem(const at::Tensor& x, const at::Tensor& act, const at::Tensor& w,
                          const at::Tensor* dy, const Sizes& s) {
  const bool tf32 = x.scalar_type() == at::kFloat && tf32_allowed();
  return {x.const_data_ptr(), act.const_data_ptr(), w.const_data_ptr(),
          dy != nullptr ? dy->const_data_ptr() : nullptr,
          s.batch, s.inputs, s.paths, s.outputs, to_glai(x.scalar_type(), "glai_ext"),
          tf32 ? 1 : 0};
}

bool empty_problem(const Sizes& s) {
  return s.batch == 0 || s.inputs == 0 || s.paths == 0 || s.outputs == 0;
}

// Launch one product into `out` ([M, N] contiguous), with a split-K workspace if it helps.
void launch(const glai_problem& p, glai_product product, at::Tensor& out) {
  int sms = 0;
  const cudaError_t query = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                                   c10::cuda::current_device());
  TORCH_CHECK(query == cudaSuccess, "glai_ext: ", cudaGetErrorString(query));
  const int splits = glai_cuda_splits(&p, product, sms);
  const int64_t count = glai_cuda_workspace_elements(&p, product, splits);
  at::Tensor workspace;
  if (count > 0) {
    // freed when this returns: the caching allocator reuses it only for later work on this
    // stream, after the kernels
    workspace = at::empty({count}, out.options().dtype(p.dtype == GLAI_FLOAT64 ? at::kDouble
                                                                               : at::kFloat));
  }
  const cudaError_t error =
      glai_cuda_launch(&p, product, splits, out.data_ptr(),
                       workspace.defined() ? workspace.data_ptr() : nullptr,
                       c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error == cudaSuccess, "glai_ext: CUDA kernel for ", product_name(product),
              " failed: ", cudaGetErrorString(error));
}

void check_cuda(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "glai_ext: the CUDA implementation got a tensor on ", x.device());
}

std::tuple<at::Tensor, at::Tensor> forward_cuda(const at::Tensor& x_in, const at::Tensor& act_in,
                                                const at::Tensor& w_in, bool /*save*/) {
  const Sizes s = check_problem(x_in, act_in, w_in);
  check_cuda(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), act = act_in.contiguous(), w = w_in.contiguous();
  at::Tensor y = at::empty({s.batch, s.outputs}, x.options());
  if (empty_problem(s)) {
    y.zero_();
  } else {
    launch(make_problem(x, act, w, nullptr, s), GLAI_Y, y);
  }
  return {y, at::empty({0}, x.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& act_in,
    const at::Tensor& w_in, const at::Tensor& /*saved*/, bool need_x, bool need_act,
    bool need_weight) {
  const Sizes s = check_problem(x_in, act_in, w_in);
  check_dy(dy_in, x_in, s);
  check_cuda(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), act = act_in.contiguous(), w = w_in.contiguous();
  const at::Tensor dy = dy_in.contiguous();
  const glai_problem p = make_problem(x, act, w, &dy, s);
  const auto opts = x.options();
  auto grad = [&](bool need, at::IntArrayRef shape, glai_product product) {
    if (!need) return at::empty({0}, opts);
    if (empty_problem(s)) return at::zeros(shape, opts);
    at::Tensor g = at::empty(shape, opts);
    launch(p, product, g);
    return g;
  };
  return {grad(need_x, {s.batch, s.inputs}, GLAI_DX),
          grad(need_act, {s.batch, s.paths}, GLAI_DACT),
          grad(need_weight, {s.outputs, s.inputs, s.paths}, GLAI_DWEIGHT)};
}

}  // namespace

TORCH_LIBRARY_IMPL(glai_ext, CUDA, m) {
  m.impl("forward", &forward_cuda);
  m.impl("backward", &backward_cuda);
}

}  // namespace glai_ext
