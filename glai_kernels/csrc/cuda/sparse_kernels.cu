// The sparse kept-path estimator's CUDA kernels (interface and layouts: sparse_kernels.cuh).
//
// Every kernel runs blocks of 256 threads (1024 for a per-item pass with few items) shaped
// (lanes, rows): the lanes run over a tile of the batch (8, 16 or 32 wide, the smallest that
// covers B, so a batch of 16 wastes no lane) and read the transposed operands' contiguous
// batch rows; the rows split the work of one result element between them in a fixed stride,
// and a shared-memory pass adds the rows' partial sums in row order. So each result element is summed by one block, in an order fixed
// by the sizes alone: deterministic, no atomics.
//   forward   block per (output o, batch tile): rows take o's groups g (stride rows), sum the
//             group's entries v[k] x[b, i_k] into Zg[b, g] (kept if asked), add act[b, s_g] Zg.
//   dx        block per (input i, batch tile): rows take i's entries (input_entries).
//   dact      block per (path s, batch tile): rows take s's groups (path_groups), dy Zg.
//   dvalues   each row takes 4 entries per step (grid-stride), lanes take the batch, and
//             each entry's lane partial sums are added in lane order by one thread (the loop
//             is entry_sums.cuh's, shared with the fused step's dvalues + Adam).
// Index values are int32 (layout.py); every address built from them is int64.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sparse_kernels.cuh"
#include "entry_sums.cuh"
#include "num.cuh"

namespace {

// nvcc launches with <<< >>>; the tests compile this file as C++ against a CPU emulation of the
// CUDA runtime (correctness/cuda_emulation), which launches through glai_emulated_launch.
#ifdef GLAI_CUDA_EMULATION
#define GLAI_SPARSE_LAUNCH(kernel, grid, block, stream, ...) \
  glai_emulated_launch(kernel, grid, block, stream, __VA_ARGS__)
#else
#define GLAI_SPARSE_LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<grid, block, 0, stream>>>(__VA_ARGS__)
#endif

using glai_cuda_num::Num;  // storage type -> accumulation type and conversions
using glai_cuda_sparse::cdiv;
using glai_cuda_sparse::kEntriesPerRow;
using glai_cuda_sparse::lanes_for;

constexpr int kThreads = 256;
// A per-item pass with fewer blocks than this (B1's forward: 128 outputs at B = 16) runs
// 1024-thread blocks instead, four times the rows, so that each row's serial chain of
// dependent loads is a quarter as long; the choice depends on the sizes alone.
constexpr int kWideThreads = 1024;
constexpr int64_t kFewBlocks = 512;
// Launch bounds name the blocks per SM wanted: with the thread count alone ptxas 13 aimed at
// full occupancy (32 registers) and spilled forward_kernel<float> on sm_90; 6 blocks of 256
// (48 warps, up to 40 registers) keep most of the occupancy that hides the gathers' latency.
template <int Threads>
struct Bounds {
  static constexpr int blocks = Threads == kThreads ? 6 : 1;
};
constexpr int64_t kMaxGridY = 65535;

template <typename T>
struct Args {
  using acc = typename Num<T>::acc;
  const T* xt;    // [I, B]
  const T* actt;  // [P, B]
  const T* v;     // [K]
  const T* dyt;   // [O, B]
  const int32_t* inputs;
  const int32_t* group_ptr;
  const int32_t* group_outputs;
  const int32_t* group_paths;
  const int32_t* output_ptr;
  const int32_t* input_ptr;
  const int32_t* input_entries;
  const int32_t* entry_groups;
  const int32_t* path_ptr;
  const int32_t* path_groups;
  int64_t B, I, P, O, K, G;

  // element b of row r of a transposed [rows, B] operand, in the accumulation type
  __device__ acc at(const T* t, int32_t r, int64_t b) const {
    return Num<T>::in(t[static_cast<int64_t>(r) * B + b]);
  }
};

// The sum over the block's rows of each lane's `part`, added in row order; meaningful in row 0.
// Every thread of the block must call it (it holds two barriers).
template <typename A>
__device__ A sum_rows(A part, A* scratch) {
  const int lane = threadIdx.x, row = threadIdx.y, lanes = blockDim.x;
  scratch[row * lanes + lane] = part;
  __syncthreads();
  A total = A(0);
  if (row == 0) {
    for (int r = 0; r < static_cast<int>(blockDim.y); ++r) total += scratch[r * lanes + lane];
  }
  __syncthreads();  // the scratch is free again
  return total;
}

// The frame every per-item pass shares: block (item, batch tile), lane b of the tile; each
// thread's `part(item, b)` (its rows' share of the item's list, in the accumulation type) is
// added over the block's rows in row order, and row 0 writes out[b * stride + item] (with
// Optional, a null `out` is not written). Every thread of the block must call it (sum_rows
// holds barriers).
template <typename T, int Threads, bool Optional, typename Part>
__device__ void item_pass(int64_t batch, T* __restrict__ out, int64_t stride, Part part) {
  using acc = typename Num<T>::acc;
  __shared__ acc scratch[Threads];
  const int64_t item = blockIdx.x;
  const int64_t b = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const acc total = sum_rows(b < batch ? part(item, b) : acc(0), scratch);
  if ((!Optional || out != nullptr) && b < batch && threadIdx.y == 0) {
    out[b * stride + item] = Num<T>::out(total);
  }
}

// This thread's row's share of the sum of term(j) over an item's list [ptr[item], ptr[item + 1])
// (dx: the input's entries; dact: the path's groups): the block's rows take the list in a fixed
// stride.
template <typename Acc, typename Term>
__device__ Acc row_share(const int32_t* ptr, int64_t item, Term term) {
  Acc part = Acc(0);
  const int64_t end = ptr[item + 1];
#pragma unroll 4
  for (int64_t j = ptr[item] + threadIdx.y; j < end; j += blockDim.y) part += term(j);
  return part;
}

template <typename T, int Threads>
__global__ void __launch_bounds__(Threads, Bounds<Threads>::blocks)
    forward_kernel(Args<T> a, T* __restrict__ y, typename Num<T>::acc* __restrict__ zgt) {
  using acc = typename Num<T>::acc;
  item_pass<T, Threads, true>(a.B, y, a.O, [&](int64_t o, int64_t b) {
    acc part = acc(0);
    const int64_t end = a.output_ptr[o + 1];
    for (int64_t g = a.output_ptr[o] + threadIdx.y; g < end; g += blockDim.y) {
      acc z = acc(0);
      const int32_t k_end = a.group_ptr[g + 1];
#pragma unroll 4
      for (int32_t k = a.group_ptr[g]; k < k_end; ++k) {
        z += Num<T>::in(a.v[k]) * a.at(a.xt, a.inputs[k], b);
      }
      if (zgt != nullptr) zgt[g * a.B + b] = z;
      part += a.at(a.actt, a.group_paths[g], b) * z;
    }
    return part;
  });
}

template <typename T, int Threads>
__global__ void __launch_bounds__(Threads, Bounds<Threads>::blocks)
    dx_kernel(Args<T> a, T* __restrict__ dx) {
  using acc = typename Num<T>::acc;
  item_pass<T, Threads, false>(a.B, dx, a.I, [&](int64_t i, int64_t b) {
    return row_share<acc>(a.input_ptr, i, [&](int64_t j) {
      const int32_t k = a.input_entries[j];
      const int32_t g = a.entry_groups[k];
      return Num<T>::in(a.v[k]) * a.at(a.dyt, a.group_outputs[g], b) *
             a.at(a.actt, a.group_paths[g], b);
    });
  });
}

template <typename T, int Threads>
__global__ void __launch_bounds__(Threads, Bounds<Threads>::blocks)
    dact_kernel(Args<T> a, const typename Num<T>::acc* __restrict__ zgt, T* __restrict__ dact) {
  using acc = typename Num<T>::acc;
  item_pass<T, Threads, false>(a.B, dact, a.P, [&](int64_t s, int64_t b) {
    return row_share<acc>(a.path_ptr, s, [&](int64_t j) {
      const int32_t g = a.path_groups[j];
      return a.at(a.dyt, a.group_outputs[g], b) * zgt[g * a.B + b];
    });
  });
}

template <typename T>
__global__ void __launch_bounds__(kThreads, Bounds<kThreads>::blocks)
    dvalues_kernel(Args<T> a, T* __restrict__ dv) {
  using acc = typename Num<T>::acc;
  __shared__ acc scratch[kEntriesPerRow * kThreads];
  glai_cuda_sparse::for_each_entry_sum(a, scratch,
                                       [&](int64_t k, acc total) { dv[k] = Num<T>::out(total); });
}

// ---- host side ------------------------------------------------------------------------------

template <typename T>
Args<T> args_of(const glai_sparse_problem& p) {
  return {static_cast<const T*>(p.xt), static_cast<const T*>(p.actt),
          static_cast<const T*>(p.values), static_cast<const T*>(p.dyt),
          p.inputs, p.group_ptr, p.group_outputs, p.group_paths, p.output_ptr, p.input_ptr,
          p.input_entries, p.entry_groups, p.path_ptr, p.path_groups,
          p.batch, p.inputs_count, p.paths, p.outputs, p.nnz, p.groups};
}

enum class Pass { kForward, kDx, kDact, kDvalues };

// The grid of a per-item pass (item = output, input or path), its block shape, and whether
// its blocks are the wide ones (kWideThreads threads).
bool item_grid(int64_t items, int64_t batch, dim3* grid, dim3* block, bool* wide) {
  const int lanes = lanes_for(batch);
  const int64_t tiles = cdiv(batch, lanes);
  if (items > 2147483647LL || tiles > kMaxGridY) return false;
  *wide = items * tiles < kFewBlocks;
  *grid = dim3(static_cast<unsigned>(items), static_cast<unsigned>(tiles));
  *block = dim3(static_cast<unsigned>(lanes),
                static_cast<unsigned>((*wide ? kWideThreads : kThreads) / lanes));
  return true;
}

// Launches kernel<Threads> for the block size item_grid chose.
#define GLAI_SPARSE_LAUNCH_ITEMS(kernel, T, wide, grid, block, stream, ...) \
  do {                                                                     \
    if (wide) {                                                            \
      auto* k = &kernel<T, kWideThreads>;                                  \
      GLAI_SPARSE_LAUNCH(k, grid, block, stream, __VA_ARGS__);             \
    } else {                                                               \
      auto* k = &kernel<T, kThreads>;                                      \
      GLAI_SPARSE_LAUNCH(k, grid, block, stream, __VA_ARGS__);             \
    }                                                                      \
  } while (0)

template <typename T>
cudaError_t launch_typed(const glai_sparse_problem& p, Pass pass, void* out, void* zgt,
                         cudaStream_t stream) {
  using acc = typename Num<T>::acc;
  const Args<T> a = args_of<T>(p);
  if (p.batch <= 0) return cudaSuccess;
  dim3 grid, block;
  bool wide = false;
  switch (pass) {
    case Pass::kForward: {
      if (p.outputs == 0) return cudaSuccess;
      if (!item_grid(p.outputs, p.batch, &grid, &block, &wide)) return cudaErrorInvalidValue;
      GLAI_SPARSE_LAUNCH_ITEMS(forward_kernel, T, wide, grid, block, stream, a,
                               static_cast<T*>(out), static_cast<acc*>(zgt));
      break;
    }
    case Pass::kDx: {
      if (p.inputs_count == 0) return cudaSuccess;
      if (!item_grid(p.inputs_count, p.batch, &grid, &block, &wide))
        return cudaErrorInvalidValue;
      GLAI_SPARSE_LAUNCH_ITEMS(dx_kernel, T, wide, grid, block, stream, a, static_cast<T*>(out));
      break;
    }
    case Pass::kDact: {
      if (p.paths == 0) return cudaSuccess;
      if (!item_grid(p.paths, p.batch, &grid, &block, &wide)) return cudaErrorInvalidValue;
      GLAI_SPARSE_LAUNCH_ITEMS(dact_kernel, T, wide, grid, block, stream, a,
                               static_cast<const acc*>(zgt), static_cast<T*>(out));
      break;
    }
    case Pass::kDvalues: {
      if (p.nnz == 0) return cudaSuccess;
      glai_cuda_sparse::entry_launch(p.nnz, p.batch, kThreads, &grid, &block);
      auto* kernel = &dvalues_kernel<T>;
      GLAI_SPARSE_LAUNCH(kernel, grid, block, stream, a, static_cast<T*>(out));
      break;
    }
  }
  return cudaGetLastError();
}

cudaError_t launch(const glai_sparse_problem* p, Pass pass, void* out, void* zgt,
                   cudaStream_t stream) {
  if (p == nullptr) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case GLAI_FLOAT32: return launch_typed<float>(*p, pass, out, zgt, stream);
    case GLAI_FLOAT64: return launch_typed<double>(*p, pass, out, zgt, stream);
    case GLAI_FLOAT16: return launch_typed<__half>(*p, pass, out, zgt, stream);
    case GLAI_BFLOAT16: return launch_typed<__nv_bfloat16>(*p, pass, out, zgt, stream);
  }
  return cudaErrorInvalidValue;
}

// A null output is refused where it would have elements to write.
bool missing(const void* out, int64_t rows, int64_t columns) {
  return out == nullptr && rows > 0 && columns > 0;
}

}  // namespace

extern "C" cudaError_t glai_sparse_forward(const glai_sparse_problem* p, void* y, void* zgt,
                                           cudaStream_t stream) {
  if (p == nullptr) return cudaErrorInvalidValue;
  if (y == nullptr && zgt == nullptr) return cudaSuccess;  // nothing asked for
  return launch(p, Pass::kForward, y, zgt, stream);
}

extern "C" cudaError_t glai_sparse_dvalues(const glai_sparse_problem* p, void* dvalues,
                                           cudaStream_t stream) {
  if (p == nullptr || missing(dvalues, p->nnz, 1) || missing(p->dyt, p->outputs, p->batch))
    return cudaErrorInvalidValue;
  return launch(p, Pass::kDvalues, dvalues, nullptr, stream);
}

extern "C" cudaError_t glai_sparse_dx(const glai_sparse_problem* p, void* dx,
                                      cudaStream_t stream) {
  if (p == nullptr || missing(dx, p->batch, p->inputs_count) ||
      missing(p->dyt, p->outputs, p->batch))
    return cudaErrorInvalidValue;
  return launch(p, Pass::kDx, dx, nullptr, stream);
}

extern "C" cudaError_t glai_sparse_dact(const glai_sparse_problem* p, const void* zgt,
                                        void* dact, cudaStream_t stream) {
  if (p == nullptr || missing(dact, p->batch, p->paths) || missing(zgt, p->groups, p->batch) ||
      missing(p->dyt, p->outputs, p->batch))
    return cudaErrorInvalidValue;
  return launch(p, Pass::kDact, dact, const_cast<void*>(zgt), stream);
}
