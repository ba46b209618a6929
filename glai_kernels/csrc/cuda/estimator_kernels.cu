// The estimator's CUDA kernels (interface and the four products: estimator_kernels.cuh).
//
// One tiled GEMM serves all four products. A product is an "Op" that says the GEMM's sizes and
// how to form one element of each operand from the inputs; the kernels stage operand tiles in
// shared memory, forming the Khatri-Rao operand there (x[b,i] act[b,s] for y, and so on), so
// [B, I, P] is never stored. Composite indices (k = i*P + s, ...) are split once per tile into
// a shared table, not per element. Three kernels:
//   - chain_gemm: the paper's batch (M = B <= 32; y, dx, dact, whose B operand is the weight
//     itself), every dtype on CUDA cores in the accumulation type: 32x64 output tiles, the
//     reduction split so the grid fills the GPU with short chains of k tiles (the rule:
//     glai_cuda_splits), the weight tile streamed by 16-byte cp.async copies through a
//     3-stage shared-memory ring (async_copy.cuh; plain loads below sm_80 or where the
//     weight's rows are not 16-byte runs).
//   - wmma_gemm: tensor cores with float accumulators, the same 3-stage ring: bfloat16
//     (m16n16k16), float32 through TF32 (m16n16k8, each operand rounded by __float_to_tf32)
//     when the problem allows TF32, and float16 (m16n16k16) for y, dx and dact. wmma takes the
//     formed operand (a product of two inputs) rounded to the input type; a float16 product
//     overflows past 65504 where the exact result need not (the contract's float32
//     accumulation forbids that), so each row m of float16's formed operand is scaled, in
//     float, by the power of two that puts its bound (the product of its two factors' largest
//     magnitudes, e.g. max|x[b,:]| max|act[b,:]|) in [2^14, 2^15), and its outputs are
//     unscaled exactly in the epilogue (RowScaled and row_scale_for below; the error bound:
//     docs/notes/cuda.md, "float16 on tensor cores (issue 38, stop 46)"). dweight's formed
//     operand is wmma's B, whose rows (k = b) no per-output factor can unscale: float16
//     dweight stays on CUDA cores. bfloat16 has float's range.
//   - simt_gemm: the rest (float64, float16 dweight, float32 without TF32, the half types
//     below sm_80): 64x64x16 tiles, 256 threads, 4x4 outputs per thread, FMA in the
//     accumulation type; but float32 without tensor cores at M, N >= 128 takes
//     large_tile_gemm (simt_tile.cuh): 128x128x8 tiles through the 3-stage ring, 8x8 outputs
//     per thread, 128-bit shared reads.
// Split-K: blockIdx.z takes a range of k tiles and writes partial sums to a workspace
// [splits, M, N]; reduce_splits adds them in split order (deterministic, no atomics).
// Indexing is int64 throughout; every launch is checked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <type_traits>

#include "async_copy.cuh"
#include "estimator_kernels.cuh"
#include "num.cuh"

namespace {

__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// nvcc launches with <<< >>>. The tests also compile this file as C++ against a CPU emulation
// of the CUDA runtime and wmma (correctness/cuda_emulation), which launches a kernel pointer
// through glai_emulated_launch.
#ifdef GLAI_CUDA_EMULATION
#define GLAI_LAUNCH(kernel, grid, block, stream, ...) \
  glai_emulated_launch(kernel, grid, block, stream, __VA_ARGS__)
#else
#define GLAI_LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<grid, block, 0, stream>>>(__VA_ARGS__)
#endif

#ifdef __CUDA_ARCH__
#define GLAI_ARCH __CUDA_ARCH__
#else
#define GLAI_ARCH 0
#endif

using glai_cuda_num::Num;  // storage type -> accumulation type and conversions

// The lowest architecture whose wmma this file uses for T (1 << 30: never on tensor cores;
// float32 through TF32, only where the problem allows it; float16 for y, dx and dact only,
// use_tensor_cores). 800 for both half types: the 3-stage cp.async ring is sm_80's.
template <typename T>
struct TensorCoreArch {
  static constexpr int value = 1 << 30;
};
template <>
struct TensorCoreArch<__nv_bfloat16> {
  static constexpr int value = 800;
};
template <>
struct TensorCoreArch<__half> {
  static constexpr int value = 800;
};
template <>
struct TensorCoreArch<float> {
  static constexpr int value = 800;
};

// An index split as v = hi * d + lo. Composite indices (k or n below 2^32, checked by the
// launcher) split with 32-bit division: 64-bit division is a subroutine whose calling
// convention made ptxas spill. Addresses built from the parts are int64.
struct Idx {
  int64_t hi, lo;
};
constexpr int64_t kMaxComposite = 0xffffffffLL;
__device__ inline Idx split(int64_t v, int64_t d) {
  const uint32_t hi = static_cast<uint32_t>(v) / static_cast<uint32_t>(d);
  return {hi, v - static_cast<int64_t>(hi) * d};
}

template <typename T>
struct Operands {
  const T* x;    // [B, I]
  const T* act;  // [B, P]
  const T* w;    // [O, I, P]
  const T* dy;   // [B, O]
  int64_t B, I, P, O;
};

// ---- the four products as GEMMs with a formed operand (see estimator_kernels.cuh) -------
// Each Op: sizes M, N, K; divisors splitting k and n into (hi, lo); a(m, k); and whether each
// operand's element index runs fastest along k (for coalesced tile loads). Where B is the
// weight itself (kBRaw: y, dx, dact), b_raw(k, n) is its element's address (b_of reads it) and
// b_runs(v) says whether every v elements along B's fast direction that start at a multiple
// of v are v consecutive elements of the weight (one 16-byte copy when v = 16 / sizeof(T));
// where B is formed (dweight), b(k, n) is its element.

template <typename T>
struct YOp {  // y[b, o] = sum_{(i,s)} (x[b,i] act[b,s]) w[o, i*P + s]
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = true, kBAlongK = true, kBRaw = true;
  __host__ __device__ int64_t M() const { return d.B; }
  __host__ __device__ int64_t N() const { return d.O; }
  __host__ __device__ int64_t K() const { return d.I * d.P; }
  __host__ __device__ int64_t k_div() const { return d.P; }
  __host__ __device__ int64_t n_div() const { return 1; }
  __device__ acc a(int64_t m, int64_t, Idx k) const {
    return Num<T>::in(d.x[m * d.I + k.hi]) * Num<T>::in(d.act[m * d.P + k.lo]);
  }
  __device__ const T* b_raw(int64_t k, Idx, int64_t n, Idx) const {
    return d.w + n * (d.I * d.P) + k;
  }
  __host__ __device__ bool b_runs(int64_t v) const { return K() % v == 0; }  // rows of w
};

template <typename T>
struct DxOp {  // dx[b, i] = sum_{(o,s)} (dy[b,o] act[b,s]) w[o, i, s]
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = true, kBAlongK = true, kBRaw = true;
  __host__ __device__ int64_t M() const { return d.B; }
  __host__ __device__ int64_t N() const { return d.I; }
  __host__ __device__ int64_t K() const { return d.O * d.P; }
  __host__ __device__ int64_t k_div() const { return d.P; }
  __host__ __device__ int64_t n_div() const { return 1; }
  __device__ acc a(int64_t m, int64_t, Idx k) const {
    return Num<T>::in(d.dy[m * d.O + k.hi]) * Num<T>::in(d.act[m * d.P + k.lo]);
  }
  __device__ const T* b_raw(int64_t, Idx k, int64_t n, Idx) const {
    return d.w + (k.hi * d.I + n) * d.P + k.lo;
  }
  // k = (o, s) runs along s: a run stays inside one o when P is a multiple of v
  __host__ __device__ bool b_runs(int64_t v) const { return d.P % v == 0; }
};

template <typename T>
struct DactOp {  // dact[b, s] = sum_{(o,i)} (dy[b,o] x[b,i]) w[o*I + i, s]
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = true, kBAlongK = false, kBRaw = true;
  __host__ __device__ int64_t M() const { return d.B; }
  __host__ __device__ int64_t N() const { return d.P; }
  __host__ __device__ int64_t K() const { return d.O * d.I; }
  __host__ __device__ int64_t k_div() const { return d.I; }
  __host__ __device__ int64_t n_div() const { return 1; }
  __device__ acc a(int64_t m, int64_t, Idx k) const {
    return Num<T>::in(d.dy[m * d.O + k.hi]) * Num<T>::in(d.x[m * d.I + k.lo]);
  }
  __device__ const T* b_raw(int64_t k, Idx, int64_t n, Idx) const { return d.w + k * d.P + n; }
  __host__ __device__ bool b_runs(int64_t v) const { return d.P % v == 0; }  // rows of w[o, i]
};

template <typename T>
struct DweightOp {  // dweight[o, i*P + s] = sum_b dy[b,o] (x[b,i] act[b,s])
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = false, kBAlongK = false, kBRaw = false;
  __host__ __device__ int64_t M() const { return d.O; }
  __host__ __device__ int64_t N() const { return d.I * d.P; }
  __host__ __device__ int64_t K() const { return d.B; }
  __host__ __device__ int64_t k_div() const { return 1; }
  __host__ __device__ int64_t n_div() const { return d.P; }
  __device__ acc a(int64_t m, int64_t k, Idx) const { return Num<T>::in(d.dy[k * d.O + m]); }
  __device__ acc b(int64_t k, Idx, int64_t, Idx n) const {
    return Num<T>::in(d.x[k * d.I + n.hi]) * Num<T>::in(d.act[k * d.P + n.lo]);
  }
};

// B's element (k, n) of an Op in the accumulation type: the weight's, read through b_raw, where
// B is the weight itself (kBRaw), else the Op's formed b(k, n).
template <typename T, class Op>
__device__ inline typename Num<T>::acc b_of(const Op& op, int64_t k, Idx ki, int64_t n, Idx ni) {
  if constexpr (Op::kBRaw) {
    return Num<T>::in(*op.b_raw(k, ki, n, ni));
  } else {
    return op.b(k, ki, n, ni);
  }
}

// ---- CUDA-core kernel ------------------------------------------------------------------

// A block's place in the grid: its output tile's first row m0 and column n0, and the k tiles
// [t_begin, t_end) of its split (tiles_per_split from blockIdx.z on, the last split shorter).
struct BlockSpan {
  int64_t m0, n0, t_begin, t_end;
};
template <int BM, int BN, int BK>
__device__ inline BlockSpan block_span(int64_t K, int64_t tiles_per_split) {
  const int64_t k_tiles = cdiv(K, BK);
  const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
  const int64_t t_end = t_begin + tiles_per_split < k_tiles ? t_begin + tiles_per_split : k_tiles;
  return {static_cast<int64_t>(blockIdx.y) * BM, static_cast<int64_t>(blockIdx.x) * BN, t_begin,
          t_end};
}

// One output element (m, n) of an M x N product: its split's partial sum into the workspace
// [splits, M, N] when the reduction is split (reduce_splits adds them), else the result itself,
// rounded once to the output type.
template <typename T>
__device__ inline void store_result(T* __restrict__ out,
                                    typename Num<T>::acc* __restrict__ workspace, int64_t M,
                                    int64_t N, int64_t m, int64_t n, typename Num<T>::acc v) {
  if (workspace != nullptr) {
    workspace[(static_cast<int64_t>(blockIdx.z) * M + m) * N + n] = v;
  } else {
    out[m * N + n] = Num<T>::out(v);
  }
}

constexpr int kSimtBM = 64, kSimtBN = 64, kSimtBK = 16, kSimtThreads = 256;
// Launch bounds name the blocks per SM wanted (2 here, 4 for wmma_gemm: 128 registers at most):
// with the thread count alone, ptxas 13 aimed at fewer registers and spilled a few bytes.

template <typename T, class Op>
__global__ void __launch_bounds__(kSimtThreads, 2)
    simt_gemm(Op op, T* __restrict__ out, typename Num<T>::acc* __restrict__ workspace,
              int64_t tiles_per_split) {
  using acc = typename Num<T>::acc;
  constexpr int BM = kSimtBM, BN = kSimtBN, BK = kSimtBK;
  // stored k-major so the compute loop reads rows of m and n; +1 breaks bank conflicts of
  // the k-fastest loads
  __shared__ acc a_tile[BK][BM + 1];
  __shared__ acc b_tile[BK][BN + 1];
  __shared__ Idx k_index[BK];
  __shared__ Idx n_index[BN];

  const int tid = threadIdx.x;
  const int64_t M = op.M(), N = op.N(), K = op.K();
  const BlockSpan span = block_span<BM, BN, BK>(K, tiles_per_split);
  const int64_t m0 = span.m0, n0 = span.n0;
  if (tid < BN) n_index[tid] = split(n0 + tid, op.n_div());

  const int ty = tid / 16, tx = tid % 16;
  acc c[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) c[i][j] = acc(0);

  for (int64_t t = span.t_begin; t < span.t_end; ++t) {
    const int64_t k0 = t * BK;
    if (tid < BK) k_index[tid] = split(k0 + tid, op.k_div());
    __syncthreads();
#pragma unroll
    for (int r = 0; r < BM * BK / kSimtThreads; ++r) {
      const int e = tid + r * kSimtThreads;
      const int mm = Op::kAAlongK ? e / BK : e % BM;
      const int kk = Op::kAAlongK ? e % BK : e / BM;
      const int64_t m = m0 + mm, k = k0 + kk;
      a_tile[kk][mm] = (m < M && k < K) ? op.a(m, k, k_index[kk]) : acc(0);
    }
#pragma unroll
    for (int r = 0; r < BN * BK / kSimtThreads; ++r) {
      const int e = tid + r * kSimtThreads;
      const int nn = Op::kBAlongK ? e / BK : e % BN;
      const int kk = Op::kBAlongK ? e % BK : e / BN;
      const int64_t n = n0 + nn, k = k0 + kk;
      b_tile[kk][nn] = (n < N && k < K) ? b_of<T>(op, k, k_index[kk], n, n_index[nn]) : acc(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      acc a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = a_tile[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = b_tile[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) c[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) store_result(out, workspace, M, N, m, n, c[i][j]);
    }
  }
}

// ---- the pipelined kernels' shared-memory stages -------------------------------------------

constexpr int kStages = 3;  // k tiles in flight: one being computed, two being copied
__host__ __device__ constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

// Writes k tile [k0, k0 + BK)'s operands into one stage. A (formed from the inputs, or dy for
// dweight) by the threads with plain loads, into a_s [BM][LDA] (row m, column k) as AS. B into
// b_s as T, [BN][LDB] (row n, column k) when Op::kBAlongK, else [BK][LDB] (row k, column n):
// the weight (Op::kBRaw) by 16-byte async copies where `vector_b` says its runs allow them,
// else by plain loads; a formed B (dweight) rounded to T. Elements past M, N or K are zeros.
// k_index holds the tile's split k; n_index the block's split n.
template <int BM, int BN, int BK, int LDA, int LDB, int kThreads, typename AS, typename T,
          class Op>
__device__ __forceinline__ void stage_tile(const Op& op, AS* a_s, T* b_s, const Idx* k_index,
                                           const Idx* n_index, int64_t m0, int64_t n0,
                                           int64_t k0, bool vector_b) {
  using acc = typename Num<T>::acc;
  const int tid = threadIdx.x;
  const int64_t M = op.M(), N = op.N(), K = op.K();
#pragma unroll 1
  for (int e = tid; e < BM * BK; e += kThreads) {  // not unrolled: more spilled at 64 registers
    const int mm = Op::kAAlongK ? e / BK : e % BM;
    const int kk = Op::kAAlongK ? e % BK : e / BM;
    const int64_t m = m0 + mm, k = k0 + kk;
    const acc v = (m < M && k < K) ? op.a(m, k, k_index[kk]) : acc(0);
    if constexpr (std::is_same_v<AS, acc>) {
      a_s[mm * LDA + kk] = v;
    } else {
      a_s[mm * LDA + kk] = Num<T>::out(v);  // rounded once, as the tensor cores take it
    }
  }
  if constexpr (Op::kBRaw) {
    if (vector_b) {
      constexpr int V = 16 / static_cast<int>(sizeof(T));
      constexpr int kRun = (Op::kBAlongK ? BK : BN) / V;  // 16-byte chunks per stored row
#pragma unroll 1
      for (int c = tid; c < BN * BK / V; c += kThreads) {
        const int row = c / kRun, col = (c % kRun) * V;
        const int nn = Op::kBAlongK ? row : col, kk = Op::kBAlongK ? col : row;
        const int64_t n = n0 + nn, k = k0 + kk;
        // b_runs: a chunk is wholly inside K and N or wholly outside
        const bool valid = n < N && k < K;
        const T* src = valid ? op.b_raw(k, k_index[kk], n, n_index[nn]) : op.d.w;
        glai_async::copy16(b_s + row * LDB + col, src, valid);
      }
      return;
    }
  }
#pragma unroll 1
  for (int e = tid; e < BN * BK; e += kThreads) {
    const int nn = Op::kBAlongK ? e / BK : e % BN;
    const int kk = Op::kBAlongK ? e % BK : e / BN;
    const int64_t n = n0 + nn, k = k0 + kk;
    T v = Num<T>::out(acc(0));
    if (n < N && k < K) {
      if constexpr (Op::kBRaw) {
        v = *op.b_raw(k, k_index[kk], n, n_index[nn]);
      } else {
        v = Num<T>::out(op.b(k, k_index[kk], n, n_index[nn]));
      }
    }
    b_s[Op::kBAlongK ? nn * LDB + kk : kk * LDB + nn] = v;
  }
}

// The loop both pipelined kernels run over their k tiles [t_begin, t_end): a ring of kStages
// stages, tile t + kStages - 1 issued while tile t is computed. One barrier per tile: after it,
// tile t has landed for every thread (each waited for its own copies) and every thread is done
// with tile t - 1, whose stage the next issue overwrites. The split-k tables alternate between
// two slots for the same reason. `compute(stage)` consumes one stage; `issue(t, stage, table)`
// fills one. Drains every copy before it returns.
template <int BK, int kThreads, class Op, class Issue, class Compute>
__device__ __forceinline__ void run_pipeline(const Op& op, Idx (*k_index)[BK], int64_t t_begin,
                                             int64_t t_end, Issue issue, Compute compute) {
  const int tid = threadIdx.x;
  if (tid < BK) k_index[0][tid] = split(t_begin * BK + tid, op.k_div());
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (t_begin + s < t_end) issue(t_begin + s, s, k_index[s & 1]);
    glai_async::commit();  // an empty group where no tile is left keeps the count uniform
    if (tid < BK) k_index[(s + 1) & 1][tid] = split((t_begin + s + 1) * BK + tid, op.k_div());
    __syncthreads();
  }
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int j = static_cast<int>(t - t_begin);
    glai_async::wait<kStages - 2>();  // tile t's group, committed kStages - 1 groups ago
    __syncthreads();
    const int64_t next = t + kStages - 1;
    if (next < t_end) issue(next, (j + kStages - 1) % kStages, k_index[(j + kStages - 1) & 1]);
    glai_async::commit();
    if (tid < BK) k_index[(j + kStages) & 1][tid] = split((next + 1) * BK + tid, op.k_div());
    compute(j % kStages);
  }
  glai_async::wait<0>();
  __syncthreads();
}

// ---- the large-batch full-float32 tile: 128x128, 8x8 outputs a thread (issue 38) ----------

#include "simt_tile.cuh"  // here: it uses Idx, split, stage_tile and run_pipeline above

// ---- short chains at the paper's batch (M <= 32) -------------------------------------------

constexpr int kChainBM = 32, kChainBN = 64, kChainThreads = 256, kChainBlocksPerSm = 4;
constexpr int kChainMinTiles = 4;  // a chain shorter than this leaves the ring half empty
// 32 k per tile (16 for float64, to fit the ring in 48 KB of static shared memory)
template <typename T>
struct ChainShape {
  static constexpr int BK = sizeof(T) == 8 ? 16 : 32;
  static constexpr int V = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
};
int chain_bk(glai_dtype dtype) { return dtype == GLAI_FLOAT64 ? 16 : 32; }

template <typename T, class Op>
__global__ void __launch_bounds__(kChainThreads, kChainBlocksPerSm)
    chain_gemm(Op op, T* __restrict__ out, typename Num<T>::acc* __restrict__ workspace,
               int64_t tiles_per_split, bool vector_b) {
  using acc = typename Num<T>::acc;
  constexpr int BM = kChainBM, BN = kChainBN, BK = ChainShape<T>::BK, V = ChainShape<T>::V;
  // A formed in the accumulation type; the weight raw, its rows padded by one 16-byte chunk
  // (keeps the copies aligned, spreads the rows over banks)
  constexpr int LDA = BK, LDB = (Op::kBAlongK ? BK : BN) + V;
  constexpr int kABytes = align128(BM * LDA * static_cast<int>(sizeof(acc)));
  constexpr int kBBytes = align128((Op::kBAlongK ? BN : BK) * LDB * static_cast<int>(sizeof(T)));
  __shared__ __align__(128) unsigned char smem[kStages * (kABytes + kBBytes)];
  __shared__ Idx k_index[2][BK];
  __shared__ Idx n_index[BN];
  auto a_stage = [&](int s) { return reinterpret_cast<acc*>(smem + s * (kABytes + kBBytes)); };
  auto b_stage = [&](int s) {
    return reinterpret_cast<T*>(smem + s * (kABytes + kBBytes) + kABytes);
  };

  const int tid = threadIdx.x;
  const int64_t M = op.M(), N = op.N(), K = op.K();
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int64_t k_tiles = cdiv(K, BK);
  const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
  const int64_t t_end = t_begin + tiles_per_split < k_tiles ? t_begin + tiles_per_split : k_tiles;
  if (tid < BN) n_index[tid] = split(n0 + tid, op.n_div());

  // 2 rows x 4 columns a thread; a warp reads 2 rows of A (broadcast) and 16 columns of B
  const int ty = tid / 16, tx = tid % 16;
  acc c[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) c[i][j] = acc(0);

  auto issue = [&](int64_t t, int s, const Idx* table) {
    stage_tile<BM, BN, BK, LDA, LDB, kChainThreads>(op, a_stage(s), b_stage(s), table, n_index,
                                                   m0, n0, t * BK, vector_b);
  };
  auto compute = [&](int s) {
    const acc* a_s = a_stage(s);
    const T* b_s = b_stage(s);
#pragma unroll 8
    for (int kk = 0; kk < BK; ++kk) {
      acc a[2], b[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) a[i] = a_s[(ty + 16 * i) * LDA + kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int nn = tx + 16 * j;
        b[j] = Num<T>::in(b_s[Op::kBAlongK ? nn * LDB + kk : kk * LDB + nn]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) c[i][j] += a[i] * b[j];
    }
  };
  run_pipeline<BK, kChainThreads>(op, k_index, t_begin, t_end, issue, compute);

#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) store_result(out, workspace, M, N, m, n, c[i][j]);
    }
  }
}

// ---- tensor-core kernel (bfloat16, float16; float32 through TF32) --------------------------

constexpr int kTcBM = 64, kTcBN = 64, kTcThreads = 128;
// Per type: k per tile, the wmma shape's k, the row padding (16 bytes: wmma's ldm rule, and
// rows shifted across banks) and the fragment's element type, with the rounding wmma wants
// done by hand (TF32: each operand element through __float_to_tf32, round to nearest, ties
// away; without it the tensor core would read a float's top bits unrounded).
template <typename T>
struct TcShape;
template <>
struct TcShape<__nv_bfloat16> {
  static constexpr int BK = 32, FK = 16, kPad = 8;
  using Frag = __nv_bfloat16;
  template <class F>
  __device__ static void round(F&) {}
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // precision::tf32 exists from sm_80
template <>
struct TcShape<float> {
  static constexpr int BK = 16, FK = 8, kPad = 4;
  using Frag = nvcuda::wmma::precision::tf32;
  template <class F>
  __device__ static void round(F& f) {
#pragma unroll
    for (int e = 0; e < f.num_elements; ++e) f.x[e] = nvcuda::wmma::__float_to_tf32(f.x[e]);
  }
};
#endif
template <>
struct TcShape<__half> {  // the formed operand scaled by its row's power of two first
  static constexpr int BK = 32, FK = 16, kPad = 8;
  using Frag = __half;
  template <class F>
  __device__ static void round(F&) {}
};
int tc_bk(glai_dtype dtype) { return dtype == GLAI_FLOAT32 ? 16 : 32; }

// ---- float16's row scaling (the header comment; docs/notes/cuda.md, "float16 on tensor cores
// (issue 38, stop 46)") -------------------------------------------------------------------

// Whether wmma_gemm takes T's Op: all but float16's dweight, whose formed operand is wmma's B
// (rows k = b: a row's factor would have to be undone inside the sum, not after it).
template <typename T, class Op>
constexpr bool kTcTakes = !(std::is_same_v<T, __half> && !Op::kBRaw);
template <typename T>
constexpr bool kRowScaled = std::is_same_v<T, __half>;

template <typename T>
__device__ float max_abs(const T* row, int64_t n) {  // NaN is passed over: it stays a NaN
  float most = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    const float v = Num<T>::in(row[e]);
    const float a = v < 0.0f ? -v : v;
    most = a > most ? a : most;
  }
  return most;
}

// FormedFactors<Op>::bound(op, m, f): the largest magnitude of factor f (0 or 1) of row m of
// A, whose elements are products of one element of each (y: x[b,:] and act[b,:]).
template <class Op>
struct FormedFactors;
template <typename T>
struct FormedFactors<YOp<T>> {
  __device__ static float bound(const YOp<T>& op, int64_t m, int f) {
    const Operands<T>& d = op.d;
    return f == 0 ? max_abs(d.x + m * d.I, d.I) : max_abs(d.act + m * d.P, d.P);
  }
};
template <typename T>
struct FormedFactors<DxOp<T>> {
  __device__ static float bound(const DxOp<T>& op, int64_t m, int f) {
    const Operands<T>& d = op.d;
    return f == 0 ? max_abs(d.dy + m * d.O, d.O) : max_abs(d.act + m * d.P, d.P);
  }
};
template <typename T>
struct FormedFactors<DactOp<T>> {
  __device__ static float bound(const DactOp<T>& op, int64_t m, int f) {
    const Operands<T>& d = op.d;
    return f == 0 ? max_abs(d.dy + m * d.O, d.O) : max_abs(d.x + m * d.I, d.I);
  }
};

// The power of two that puts a row's bound in [2^14, 2^15): every element of the scaled row
// is then at most 2^15 < 65504 (no overflow however it rounds) and the largest keep float16's
// 11 bits. 1 for a row of zeros, or an infinite or NaN bound (those propagate as they are).
__device__ inline float row_scale_for(float bound) {
#ifdef GLAI_PLANT_FP16_UNSCALED  // a planted bug: correctness/test_cuda_fp16_tc_emulated.py
  (void)bound;
  return 1.0f;
#else
  if (!(bound > 0.0f) || !(bound <= 3.4028235e38f)) return 1.0f;
  int e = 0;
  frexpf(bound, &e);  // bound = f 2^e, f in [0.5, 1): bound 2^(15 - e) in [2^14, 2^15)
  return ldexpf(1.0f, 15 - e);  // 2^-18 (a bound of 2^32) to 2^62 (2^-48): a float
#endif
}

// An Op whose formed A is scaled by its row's power of two (scale[m - m0], in shared memory),
// in float before stage_tile rounds it to T: a power of two is exact, so the tile holds each
// element rounded once, as it would be unscaled, unless it would have over- or underflowed.
template <class Op>
struct RowScaled : Op {
  const float* scale;
  int64_t m0;
  __device__ typename Op::acc a(int64_t m, int64_t k, Idx ki) const {
    return Op::a(m, k, ki) * scale[m - m0];
  }
};

template <typename T, class Op>
__global__ void __launch_bounds__(kTcThreads, 4)
    wmma_gemm(Op op, T* __restrict__ out, float* __restrict__ workspace,
              int64_t tiles_per_split, bool vector_b) {
  // The host launches this only where wmma takes T and Op; elsewhere an empty body.
  if constexpr (GLAI_ARCH >= TensorCoreArch<T>::value && kTcTakes<T, Op>) {
    namespace wmma = nvcuda::wmma;
    using Shape = TcShape<T>;
    using Frag = typename Shape::Frag;
    using BLayout = std::conditional_t<Op::kBAlongK, wmma::col_major, wmma::row_major>;
    constexpr int BM = kTcBM, BN = kTcBN, BK = Shape::BK, FK = Shape::FK;
    constexpr int LDA = BK + Shape::kPad, LDB = (Op::kBAlongK ? BK : BN) + Shape::kPad;
    constexpr int LDC = BN + 4;
    constexpr int kABytes = align128(BM * LDA * static_cast<int>(sizeof(T)));
    constexpr int kBBytes = align128((Op::kBAlongK ? BN : BK) * LDB * static_cast<int>(sizeof(T)));
    constexpr int kRingBytes = kStages * (kABytes + kBBytes);
    constexpr int kOutBytes = BM * LDC * static_cast<int>(sizeof(float));
    __shared__ __align__(128) unsigned char smem[kRingBytes > kOutBytes ? kRingBytes : kOutBytes];
    __shared__ Idx k_index[2][BK];
    __shared__ Idx n_index[BN];
    __shared__ float row_scale[2][BM];  // float16: each row's power of two, and its inverse
    auto a_stage = [&](int s) { return reinterpret_cast<T*>(smem + s * (kABytes + kBBytes)); };
    auto b_stage = [&](int s) {
      return reinterpret_cast<T*>(smem + s * (kABytes + kBBytes) + kABytes);
    };
    float* c_tile = reinterpret_cast<float*>(smem);  // [BM][LDC], after the ring is drained

    const int tid = threadIdx.x;
    const int warp = tid / 32, warp_m = warp / 2, warp_n = warp % 2;
    const int64_t M = op.M(), N = op.N(), K = op.K();
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
    const int64_t k_tiles = cdiv(K, BK);
    const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
    const int64_t t_end =
        t_begin + tiles_per_split < k_tiles ? t_begin + tiles_per_split : k_tiles;
    if (tid < BN) n_index[tid] = split(n0 + tid, op.n_div());
    if constexpr (kRowScaled<T>) {
      static_assert(kTcThreads == 2 * BM, "one thread for each factor of each row");
      const int r = tid % BM, f = tid / BM;
      row_scale[f][r] = m0 + r < M ? FormedFactors<Op>::bound(op, m0 + r, f) : 0.0f;
      __syncthreads();
      if (tid < BM) {  // only thread r reads and writes row r's pair until run_pipeline's barrier
        const float scale = row_scale_for(row_scale[0][r] * row_scale[1][r]);
        row_scale[0][r] = scale;
        row_scale[1][r] = 1.0f / scale;  // exact: a power of two
      }
    }

    wmma::fragment<wmma::accumulator, 16, 16, FK, float> c[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(c[i][j], 0.0f);

    auto issue = [&](int64_t t, int s, const Idx* table) {
      if constexpr (kRowScaled<T>) {
        const RowScaled<Op> scaled{op, row_scale[0], m0};
        stage_tile<BM, BN, BK, LDA, LDB, kTcThreads>(scaled, a_stage(s), b_stage(s), table,
                                                     n_index, m0, n0, t * BK, vector_b);
      } else {
        stage_tile<BM, BN, BK, LDA, LDB, kTcThreads>(op, a_stage(s), b_stage(s), table, n_index,
                                                     m0, n0, t * BK, vector_b);
      }
    };
    auto compute = [&](int s) {
      const T* a_s = a_stage(s);
      const T* b_s = b_stage(s);
#pragma unroll
      for (int kk = 0; kk < BK; kk += FK) {
        wmma::fragment<wmma::matrix_a, 16, 16, FK, Frag, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, FK, Frag, BLayout> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          wmma::load_matrix_sync(fa[i], a_s + (warp_m * 32 + i * 16) * LDA + kk, LDA);
          Shape::round(fa[i]);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int nn = warp_n * 32 + j * 16;
          wmma::load_matrix_sync(fb[j], b_s + (Op::kBAlongK ? nn * LDB + kk : kk * LDB + nn),
                                 LDB);
          Shape::round(fb[j]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], fa[i], fb[j], c[i][j]);
      }
    };
    run_pipeline<BK, kTcThreads>(op, k_index, t_begin, t_end, issue, compute);

    // accumulators -> shared memory (the drained ring) -> bounds-checked writes
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(c_tile + (warp_m * 32 + i * 16) * LDC + warp_n * 32 + j * 16,
                                c[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < BM * BN; e += kTcThreads) {
      const int mm = e / BN, nn = e % BN;
      const int64_t m = m0 + mm, n = n0 + nn;
      if (m >= M || n >= N) continue;
      float v = c_tile[mm * LDC + nn];
      if constexpr (kRowScaled<T>) v *= row_scale[1][mm];  // exact, before any rounding
      store_result(out, workspace, M, N, m, n, v);
    }
  }
}

// out[e] = sum over splits of workspace[split, e], in split order.
template <typename T>
__global__ void reduce_splits(const typename Num<T>::acc* __restrict__ workspace,
                              T* __restrict__ out, int64_t count, int64_t splits) {
  using acc = typename Num<T>::acc;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += stride) {
    acc sum = acc(0);
    for (int64_t z = 0; z < splits; ++z) sum += workspace[z * count + e];
    out[e] = Num<T>::out(sum);
  }
}

// ---- host side ------------------------------------------------------------------------------

template <typename T>
Operands<T> operands(const glai_problem& p) {
  return {static_cast<const T*>(p.x), static_cast<const T*>(p.act),
          static_cast<const T*>(p.weight), static_cast<const T*>(p.dy),
          p.batch, p.inputs, p.paths, p.outputs};
}

// Whether wmma_gemm runs T's Op here: an architecture whose wmma takes T, for float32 a
// problem that allows TF32, for float16 not dweight (kTcTakes).
template <typename T, class Op>
bool use_tensor_cores(const glai_problem& p) {
  if (!kTcTakes<T, Op>) return false;
  if (std::is_same_v<T, float> && p.allow_tf32 == 0) return false;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major * 100 + minor * 10 >= TensorCoreArch<T>::value;
}

// The paper's batch: a product whose B operand is the weight and whose M (= B) fits one chain
// tile. glai_cuda_splits applies the same test.
bool use_chains(glai_product product, int64_t m) {
  return product != GLAI_DWEIGHT && m <= kChainBM;
}

template <typename T, class Op>
bool weight_in_runs(const Op& op) {  // the 16-byte copies' condition (stage_tile)
  if constexpr (Op::kBRaw) {
    return op.b_runs(ChainShape<T>::V) && reinterpret_cast<uintptr_t>(op.d.w) % 16 == 0;
  } else {
    return false;
  }
}

template <typename T, template <typename> class OpT>
cudaError_t launch_typed(const glai_problem& p, glai_product product, int splits, void* out,
                         void* workspace, cudaStream_t stream) {
  using acc = typename Num<T>::acc;
  using Op = OpT<T>;
  const Op op{operands<T>(p)};
  const int64_t M = op.M(), N = op.N(), K = op.K();
  if (M == 0 || N == 0) return cudaSuccess;
  enum { kChain, kTensorCores, kSimt, kTile } kernel = kSimt;
  if (Op::kBRaw && use_chains(product, M)) {
    kernel = kChain;
  } else if (TensorCoreArch<T>::value < (1 << 30) && use_tensor_cores<T, Op>(p)) {
    kernel = kTensorCores;
  }
  if (kernel == kSimt && std::is_same_v<T, float> && large_tile_fits(M, N)) kernel = kTile;
  const int64_t bm = kernel == kTile    ? kTileBM
                     : kernel == kChain ? kChainBM : kernel == kTensorCores ? kTcBM : kSimtBM;
  const int64_t bn = kernel == kTile    ? kTileBN
                     : kernel == kChain ? kChainBN : kernel == kTensorCores ? kTcBN : kSimtBN;
  const int64_t bk = kernel == kTile           ? kTileBK
                     : kernel == kChain         ? chain_bk(p.dtype)
                     : kernel == kTensorCores ? tc_bk(p.dtype)
                                              : kSimtBK;
  const int64_t k_tiles = cdiv(K, bk) > 0 ? cdiv(K, bk) : 1;
  const int64_t per_split = cdiv(k_tiles, splits > 0 ? splits : 1);
  const int64_t used = cdiv(k_tiles, per_split);  // no empty split
  const int64_t grid_n = cdiv(N, bn), grid_m = cdiv(M, bm);
  if (grid_n > 2147483647LL || grid_m > 65535 || used > 65535) return cudaErrorInvalidValue;
  // the split index tables hold k and n of the last tile, and the pipelines' tables run up to
  // kStages tiles past the end
  if ((k_tiles + kStages + 1) * bk > kMaxComposite || grid_n * bn > kMaxComposite)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m),
                  static_cast<unsigned>(used));
  acc* partial = used > 1 ? static_cast<acc*>(workspace) : nullptr;
  if (used > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  T* result = static_cast<T*>(out);
  const bool vector_b = weight_in_runs<T>(op);
  if constexpr (Op::kBRaw) {
    if (kernel == kChain) {
      auto* chain = &chain_gemm<T, Op>;
      GLAI_LAUNCH(chain, grid, kChainThreads, stream, op, result, partial, per_split, vector_b);
    }
  }
  if constexpr (TensorCoreArch<T>::value < (1 << 30)) {
    if (kernel == kTensorCores) {
      auto* tensor_cores = &wmma_gemm<T, Op>;
      GLAI_LAUNCH(tensor_cores, grid, kTcThreads, stream, op, result, partial, per_split,
                  vector_b);
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (kernel == kTile) {
      auto* tile = &large_tile_gemm<Op>;
      GLAI_LAUNCH(tile, grid, kTileThreads, stream, op, result, partial, per_split, vector_b);
    }
  }
  if (kernel == kSimt) {
    auto* simt = &simt_gemm<T, Op>;
    GLAI_LAUNCH(simt, grid, kSimtThreads, stream, op, result, partial, per_split);
  }
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || used == 1) return error;
  const int64_t count = M * N;
  const int64_t blocks = cdiv(count, 256) < 4096 ? cdiv(count, 256) : 4096;
  auto* reduce = &reduce_splits<T>;
  GLAI_LAUNCH(reduce, static_cast<unsigned>(blocks), 256, stream, partial, result, count, used);
  return cudaGetLastError();
}

template <template <typename> class OpT>
cudaError_t launch_op(const glai_problem& p, glai_product product, int splits, void* out,
                      void* workspace, cudaStream_t stream) {
  switch (p.dtype) {
    case GLAI_FLOAT32:
      return launch_typed<float, OpT>(p, product, splits, out, workspace, stream);
    case GLAI_FLOAT64:
      return launch_typed<double, OpT>(p, product, splits, out, workspace, stream);
    case GLAI_FLOAT16:
      return launch_typed<__half, OpT>(p, product, splits, out, workspace, stream);
    case GLAI_BFLOAT16:
      return launch_typed<__nv_bfloat16, OpT>(p, product, splits, out, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

// M, N, K of a product (the Ops' sizes, without their element type)
void gemm_sizes(const glai_problem& p, glai_product product, int64_t* m, int64_t* n,
                int64_t* k) {
  const Operands<float> d{nullptr, nullptr, nullptr, nullptr,
                          p.batch, p.inputs, p.paths, p.outputs};
  switch (product) {
    case GLAI_Y: { const YOp<float> op{d}; *m = op.M(); *n = op.N(); *k = op.K(); return; }
    case GLAI_DX: { const DxOp<float> op{d}; *m = op.M(); *n = op.N(); *k = op.K(); return; }
    case GLAI_DACT: { const DactOp<float> op{d}; *m = op.M(); *n = op.N(); *k = op.K(); return; }
    case GLAI_DWEIGHT: {
      const DweightOp<float> op{d};
      *m = op.M(); *n = op.N(); *k = op.K();
      return;
    }
  }
  *m = *n = *k = 0;
}

}  // namespace

extern "C" int glai_cuda_splits(const glai_problem* p, glai_product product, int sm_count) {
  if (p == nullptr || sm_count <= 0) return 1;
  int64_t m, n, k;
  gemm_sizes(*p, product, &m, &n, &k);
  if (m == 0 || n == 0 || k == 0) return 1;
  if (use_chains(product, m)) {
    // The paper's batch. A block's time is a fixed cost plus one step per k tile of its
    // serial chain (the H100/H200 leases fit 12 us + 2.1 us per tile to the old kernel), so
    // the reduction is cut into as many chains as the GPU holds at once (kChainBlocksPerSm
    // blocks on each multiprocessor), but none shorter than kChainMinTiles: a shorter one
    // buys no time and costs workspace. With 132 SMs (528 blocks) and 32-wide k tiles, y:
    //   A1 (K = 385*128 = 49,280: 1,540 tiles, 1 column tile): 385 chains of 4 tiles
    //   C2 (K = 769*256 = 196,864: 6,152 tiles, 1 column tile): 513 chains of 12
    //   B1 (K = 1281*320 = 409,920: 12,810 tiles, 2 column tiles): 262 chains of 49
    //   B2 (K = 769*384 = 295,296: 9,228 tiles, 2 column tiles): 264 chains of 35
    // (B1 and B2 are bound by reading the weight, not by their chains: 2 column tiles x 262
    // chains keep 528 blocks streaming.)
    const int64_t k_tiles = cdiv(k, chain_bk(p->dtype));
    const int64_t out_tiles = cdiv(n, kChainBN);
    const int64_t fill = cdiv(static_cast<int64_t>(sm_count) * kChainBlocksPerSm, out_tiles);
    const int64_t short_chains = cdiv(k_tiles, kChainMinTiles);
    const int64_t splits = fill < short_chains ? fill : short_chains;
    return static_cast<int>(splits < 1 ? 1 : splits > 65535 ? 65535 : splits);
  }
  // full float32 at M, N >= 128: the 128x128 tile (simt_tile.cuh)
  if (p->dtype == GLAI_FLOAT32 && p->allow_tf32 == 0 && large_tile_fits(m, n))
    return large_tile_splits(m, n, k, sm_count);
  // the larger tiles of either other kernel, so the count holds for both
  const int64_t tiles = cdiv(m, 64) * cdiv(n, 64);
  const int64_t k_tiles = cdiv(k, 32);
  if (tiles >= sm_count) return 1;
  int64_t splits = cdiv(2LL * sm_count, tiles);  // about two blocks per multiprocessor
  const int64_t most = k_tiles / 4 > 1 ? k_tiles / 4 : 1;  // at least 4 k tiles per split
  splits = splits < most ? splits : most;
  splits = splits < 256 ? splits : 256;
  return static_cast<int>(splits > 1 ? splits : 1);
}

extern "C" int64_t glai_cuda_workspace_elements(const glai_problem* p, glai_product product,
                                                int splits) {
  if (p == nullptr || splits <= 1) return 0;
  int64_t m, n, k;
  gemm_sizes(*p, product, &m, &n, &k);
  return static_cast<int64_t>(splits) * m * n;
}

extern "C" cudaError_t glai_cuda_launch(const glai_problem* p, glai_product product, int splits,
                                        void* out, void* workspace, cudaStream_t stream) {
  if (p == nullptr || out == nullptr || splits < 1) return cudaErrorInvalidValue;
  switch (product) {
    case GLAI_Y: return launch_op<YOp>(*p, product, splits, out, workspace, stream);
    case GLAI_DX: return launch_op<DxOp>(*p, product, splits, out, workspace, stream);
    case GLAI_DACT: return launch_op<DactOp>(*p, product, splits, out, workspace, stream);
    case GLAI_DWEIGHT: return launch_op<DweightOp>(*p, product, splits, out, workspace, stream);
  }
  return cudaErrorInvalidValue;
}
