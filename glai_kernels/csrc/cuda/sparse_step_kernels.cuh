// The fused sparse training step's CUDA kernels: C interface (raw pointers, sizes, a stream;
// no torch headers, so plain nvcc compiles sparse_step_kernels.cu: tools/check_cuda.py does,
// and the tests compile it as C++ against correctness/cuda_emulation).
//
// What the `cpp` step does on the CPU (glai_ext::sparse_dvalues_adam, glai_ext::bias_adam;
// docs/notes/sparse.md, "Adam inside dvalues (stop 22)"), on the GPU:
//   glai_sparse_dvalues_adam  dvalues [K] of the sparse op and the Adam/AdamW update of the
//                             kept values and their moments in ONE kernel: each entry's
//                             gradient is summed over the batch in lane order by the thread
//                             that then updates values[k], m[k], v[k]; dv is never stored.
//   glai_bias_adam            dbias[o] = sum_b dy[b, o] (b in order, one thread per output)
//                             and the same update of bias [O].
// Every sum has a fixed order (no atomics): the results are the same bits from run to run.
// float32 and float64 only (the update is in place on the parameter's own dtype).
//
// The update is torch.optim.Adam's (fused=True) formula, with its scalars computed in double
// and rounded to the parameter's dtype:
//   Adam:  g += weight_decay * w;   AdamW: w *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w -= lr / (1 - beta1^n) * m / (sqrt(v) / sqrt(1 - beta2^n) + eps)
// where n is the step count after this update: `step`, or, when `step_on_device` is not null,
// the float32 it points to, read by the kernel (a step captured in a CUDA graph then replays
// with the count of each replay: torch.optim's state["step"] lives on the device).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "sparse_kernels.cuh"  // glai_sparse_problem, glai_dtype

#ifdef __cplusplus
extern "C" {
#endif

typedef struct glai_adam_step {
  double lr, beta1, beta2, weight_decay, eps;
  double step;                  // the count after this update (>= 1), when step_on_device is null
  const float* step_on_device;  // [1] on the device, or null
  int decoupled;                // 1: AdamW, 0: Adam (L2 added to the gradient)
} glai_adam_step;

// values, exp_avg, exp_avg_sq [K] (p->dtype: float32 or float64) updated in place from
// dvalues[k] = sum_b dy[b, o_k] act[b, s_k] x[b, i_k]. Needs p->dyt, p->xt, p->actt and the
// index's inputs, entry_groups, group_outputs and group_paths; p->values is not read.
cudaError_t glai_sparse_dvalues_adam(const glai_sparse_problem* p, void* values, void* exp_avg,
                                     void* exp_avg_sq, const glai_adam_step* a,
                                     cudaStream_t stream);

// bias, exp_avg, exp_avg_sq [outputs] (dtype: float32 or float64) updated in place from
// dy [batch, outputs] (row-major, the same dtype) summed over the batch.
cudaError_t glai_bias_adam(const void* dy, int64_t batch, int64_t outputs, glai_dtype dtype,
                           void* bias, void* exp_avg, void* exp_avg_sq, const glai_adam_step* a,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
