// The per-entry batch sum of the sparse kept-path op's dvalues, stated once for the two kernels
// that run it: dvalues_kernel (sparse_kernels.cu), which stores dv, and dvalues_adam_kernel
// (sparse_step_kernels.cu), which updates each kept value with its gradient instead.
//
//   dv[k] = sum_b dy[b, o_k] act[b, s_k] x[b, i_k]    for every kept entry k in [0, K)
//
// Blocks are (lanes, rows): the lanes run over the batch (8, 16 or 32, the smallest that covers
// B: `lanes_for`), each row takes kEntriesPerRow entries per iteration, grid-stride over K, and
// each entry's lane partial sums go through shared memory to one thread, which adds them in lane
// order and hands the total to the caller's `finish`. The order of every sum depends on the
// sizes alone: the same bits from run to run, no atomics.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace glai_cuda_sparse {

// entries per row and iteration, summed over the batch together (more loads in flight)
constexpr int kEntriesPerRow = 4;
constexpr int64_t kMaxEntryBlocks = int64_t{1} << 20;  // grid-stride beyond this

__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Lanes per block over the batch: the smallest of 8, 16, 32 that covers B (32 beyond).
inline int lanes_for(int64_t batch) { return batch <= 8 ? 8 : batch <= 16 ? 16 : 32; }

// The grid and block shape of a pass over the K entries at batch B in blocks of `threads`.
inline void entry_launch(int64_t nnz, int64_t batch, int threads, dim3* grid, dim3* block) {
  const int lanes = lanes_for(batch), rows = threads / lanes;
  const int64_t needed = cdiv(nnz, static_cast<int64_t>(rows) * kEntriesPerRow);
  *grid = dim3(static_cast<unsigned>(needed < kMaxEntryBlocks ? needed : kMaxEntryBlocks));
  *block = dim3(static_cast<unsigned>(lanes), static_cast<unsigned>(rows));
}

// Runs the sum above for every entry, calling finish(k, total) once per entry k, from one
// thread (consecutive threads take consecutive entries: coalesced writes of whatever finish
// writes at k). `a` holds the transposed operands xt [I, B], actt [P, B], dyt [O, B], the
// layout's inputs, entry_groups, group_outputs and group_paths, the sizes B and K, and
// at(t, r, b), element b of row r of a transposed operand in the accumulation type Acc.
// `scratch` is shared memory of kEntriesPerRow * blockDim.x * blockDim.y Acc. Every thread of
// the block must call it (it holds the block's barriers).
template <typename Acc, typename Operands, typename Finish>
__device__ void for_each_entry_sum(const Operands& a, Acc* scratch, Finish finish) {
  constexpr int E = kEntriesPerRow;
  const int lane = threadIdx.x, row = threadIdx.y, lanes = blockDim.x, rows = blockDim.y;
  const int tid = row * lanes + lane;
  const int64_t step = static_cast<int64_t>(rows) * E;  // entries per block and iteration
  // the loop bound depends on the block alone, so every thread reaches every barrier
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * step; base < a.K;
       base += static_cast<int64_t>(gridDim.x) * step) {
    // slot e*rows + row: the rows of one e read consecutive entries (coalesced index loads),
    // and a row's E entries are independent, so their loads are in flight together
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t k = base + e * rows + row;
      Acc part = Acc(0);
      if (k < a.K) {
        const int32_t g = a.entry_groups[k];
        const int32_t o = a.group_outputs[g], s = a.group_paths[g], i = a.inputs[k];
        for (int64_t b = lane; b < a.B; b += lanes) {
          part += a.at(a.dyt, o, b) * a.at(a.actt, s, b) * a.at(a.xt, i, b);
        }
      }
      scratch[(e * rows + row) * lanes + lane] = part;
    }
    __syncthreads();
    // thread t < step adds slot t's lanes in lane order and finishes entry base + t
    const int64_t k = base + tid;
    if (tid < step && k < a.K) {
      Acc total = Acc(0);
      for (int l = 0; l < lanes; ++l) total += scratch[tid * lanes + l];
      finish(k, total);
    }
    __syncthreads();
  }
}

}  // namespace glai_cuda_sparse
