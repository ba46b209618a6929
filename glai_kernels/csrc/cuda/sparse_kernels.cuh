// The sparse kept-path estimator's CUDA kernels: C interface (raw pointers, sizes, a stream;
// no torch headers, so plain nvcc compiles sparse_kernels.cu: tools/check_cuda.py does).
//
// The index is the kept-path layout of glai_kernels/sparse/layout.py (int32 arrays; entries
// sorted by (o, s, i), grouped by (o, s); reverse orders for dx and dact). Every dense
// operand is passed TRANSPOSED, batch fastest, so the threads of a block, which run over the
// batch, read contiguous memory for each kept entry:
//   xt [I, B], actt [P, B], dyt [O, B], zgt [G, B] (the group sums, accumulation type).
// Results are written in the op's own layout: y [B, O], dx [B, I], dact [B, P], dvalues [K].
//
// Every pass is a gather: each result element is summed by one block in a fixed order (no
// atomics), so results are the same bits from run to run. Half types accumulate in float32;
// float64 in float64. Launch errors come back as cudaError_t (cudaErrorInvalidValue for sizes
// beyond the grid's limits).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "estimator_kernels.cuh"  // glai_dtype

#ifdef __cplusplus
extern "C" {
#endif

typedef struct glai_sparse_problem {
  const void* xt;    // [I, B], dtype
  const void* actt;  // [P, B], dtype
  const void* values;  // [K], dtype
  const void* dyt;   // [O, B], dtype; null for the forward
  // the KeptIndex, layout.py's fields
  const int32_t* inputs;         // [K]
  const int32_t* group_ptr;      // [G + 1]
  const int32_t* group_outputs;  // [G]
  const int32_t* group_paths;    // [G]
  const int32_t* output_ptr;     // [O + 1]
  const int32_t* input_ptr;      // [I + 1]
  const int32_t* input_entries;  // [K]
  const int32_t* entry_groups;   // [K]
  const int32_t* path_ptr;       // [P + 1]
  const int32_t* path_groups;    // [G]
  int64_t batch, inputs_count, paths, outputs, nnz, groups;
  glai_dtype dtype;
} glai_sparse_problem;

// y [B, O] (dtype; null: not written) and zgt [G, B] (float32 for half types, else dtype;
// null: not kept). One block per (output, batch tile).
cudaError_t glai_sparse_forward(const glai_sparse_problem* p, void* y, void* zgt,
                                cudaStream_t stream);

// dvalues [K] (dtype): dv[k] = sum_b dy[b, o_k] act[b, s_k] x[b, i_k]. Needs dyt.
cudaError_t glai_sparse_dvalues(const glai_sparse_problem* p, void* dvalues,
                                cudaStream_t stream);

// dx [B, I] (dtype) over input_ptr / input_entries. Needs dyt. One block per (input, tile).
cudaError_t glai_sparse_dx(const glai_sparse_problem* p, void* dx, cudaStream_t stream);

// dact [B, P] (dtype) from zgt [G, B] (the forward's) over path_ptr / path_groups. Needs dyt.
cudaError_t glai_sparse_dact(const glai_sparse_problem* p, const void* zgt, void* dact,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif
