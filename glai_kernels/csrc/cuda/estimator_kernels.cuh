// The CUDA kernels' C interface: raw pointers, sizes and a stream, no torch headers, so plain
// nvcc compiles estimator_kernels.cu anywhere (bench/tools/check_cuda.py, `glai-bench check-cuda`, does, for sm_80 and sm_90).
//
// Each product of the estimator is one GEMM  C[m, n] = sum_k A(m, k) B(k, n)  whose Khatri-Rao
// operand (x ⊗ act, dy ⊗ act or dy ⊗ x) is formed tile by tile in shared memory, never stored:
//   GLAI_Y        y [B, O]         m = b, n = o,        k = (i, s): A = x[b,i] act[b,s], B = w[o,i,s]
//   GLAI_DX       dx [B, I]        m = b, n = i,        k = (o, s): A = dy[b,o] act[b,s], B = w[o,i,s]
//   GLAI_DACT     dact [B, P]      m = b, n = s,        k = (o, i): A = dy[b,o] x[b,i],   B = w[o,i,s]
//   GLAI_DWEIGHT  dweight [O, I*P] m = o, n = (i, s),   k = b:      A = dy[b,o], B = x[b,i] act[b,s]
// Three kernels (estimator_kernels.cu says which runs when):
//   - at the paper's batch (B <= 32: y, dx, dact) a CUDA-core kernel whose blocks each take a
//     short chain of k tiles, the weight streamed through a multi-stage cp.async pipeline;
//   - tensor cores (wmma, float accumulators) for bfloat16, float16's y, dx and dact (each row
//     of the formed operand scaled by a power of two, unscaled after the sum), and float32
//     through TF32 when the problem allows it (torch's own setting, read by the binding);
//   - CUDA-core tiles otherwise: float32 and float64 in their own precision, float16 dweight
//     in float.
// When the output has few tiles, the reduction dimension is split across blocks into a
// workspace that a second kernel sums in split order (deterministic, no atomics).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum glai_dtype {
  GLAI_FLOAT32 = 0,
  GLAI_FLOAT64 = 1,
  GLAI_FLOAT16 = 2,
  GLAI_BFLOAT16 = 3,
} glai_dtype;

typedef enum glai_product {
  GLAI_Y = 0,
  GLAI_DX = 1,
  GLAI_DACT = 2,
  GLAI_DWEIGHT = 3,
} glai_product;

// One estimator call: contiguous row-major x [B, I], act [B, P], weight [O, I, P] and, for the
// gradients, dy [B, O], all of `dtype`, on the current device.
typedef struct glai_problem {
  const void* x;
  const void* act;
  const void* weight;
  const void* dy;
  int64_t batch, inputs, paths, outputs;
  glai_dtype dtype;
  // float32 only: nonzero lets the tensor cores round the GEMM operands to TF32 (10 mantissa
  // bits), as torch allows its own float32 matmuls to (torch.backends.cuda.matmul.allow_tf32,
  // torch.get_float32_matmul_precision() != "highest"); zero keeps full float32
  int allow_tf32;
} glai_problem;

// How many blocks will share the reduction dimension of `product` on a GPU with `sm_count`
// multiprocessors (1: no split).
int glai_cuda_splits(const glai_problem* p, glai_product product, int sm_count);

// Elements of the workspace (float; double for GLAI_FLOAT64) a launch with `splits` needs;
// 0 when splits == 1.
int64_t glai_cuda_workspace_elements(const glai_problem* p, glai_product product, int splits);

// Writes `product` to `out` (row-major [M, N] of the problem's dtype) on `stream`. Returns the
// first launch error (cudaErrorInvalidValue for sizes beyond the grid's limits).
cudaError_t glai_cuda_launch(const glai_problem* p, glai_product product, int splits, void* out,
                             void* workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
