// The estimator's CUDA kernels (interface and the four products: estimator_kernels.cuh).
//
// One tiled GEMM template serves all four products. A product is an "Op" that says the GEMM's
// sizes and how to form one element of each operand from the inputs; the kernels stage
// operand tiles in shared memory, forming the Khatri-Rao operand there (x[b,i] act[b,s] for
// y, and so on), so [B, I, P] is never stored. Composite indices (k = i*P + s, ...) are split
// once per tile into a shared table, not per element.
//   - simt_gemm: float32, float64 and float16 (and bfloat16 on GPUs without bf16 tensor
//     cores): 64x64x16 tiles, 256 threads, 4x4 outputs per thread, FMA in the accumulation
//     type, the formed operand kept in it.
//   - wmma_gemm: bfloat16 on tensor cores: 64x64x32 tiles, 4 warps of 32x32, wmma 16x16x16
//     with float accumulators. Not float16: wmma takes the formed operand (a product of two
//     inputs) rounded to the input type, and a float16 product overflows past 65504 where
//     the exact result need not (the contract's float32 accumulation forbids it); bfloat16
//     has float's range.
// Split-K: blockIdx.z takes a range of k tiles and writes partial sums to a workspace
// [splits, M, N]; reduce_splits adds them in split order (deterministic, no atomics).
// Indexing is int64 throughout; every launch is checked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

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
// float16 for the overflow above).
template <typename T>
struct TensorCoreArch {
  static constexpr int value = 1 << 30;
};
template <>
struct TensorCoreArch<__nv_bfloat16> {
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
// Each Op: sizes M, N, K; divisors splitting k and n into (hi, lo); a(m, k) and b(k, n);
// and whether each operand's element index runs fastest along k (for coalesced tile loads).

template <typename T>
struct YOp {  // y[b, o] = sum_{(i,s)} (x[b,i] act[b,s]) w[o, i*P + s]
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = true, kBAlongK = true;
  __host__ __device__ int64_t M() const { return d.B; }
  __host__ __device__ int64_t N() const { return d.O; }
  __host__ __device__ int64_t K() const { return d.I * d.P; }
  __host__ __device__ int64_t k_div() const { return d.P; }
  __host__ __device__ int64_t n_div() const { return 1; }
  __device__ acc a(int64_t m, int64_t, Idx k) const {
    return Num<T>::in(d.x[m * d.I + k.hi]) * Num<T>::in(d.act[m * d.P + k.lo]);
  }
  __device__ acc b(int64_t k, Idx, int64_t n, Idx) const {
    return Num<T>::in(d.w[n * (d.I * d.P) + k]);
  }
};

template <typename T>
struct DxOp {  // dx[b, i] = sum_{(o,s)} (dy[b,o] act[b,s]) w[o, i, s]
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = true, kBAlongK = true;
  __host__ __device__ int64_t M() const { return d.B; }
  __host__ __device__ int64_t N() const { return d.I; }
  __host__ __device__ int64_t K() const { return d.O * d.P; }
  __host__ __device__ int64_t k_div() const { return d.P; }
  __host__ __device__ int64_t n_div() const { return 1; }
  __device__ acc a(int64_t m, int64_t, Idx k) const {
    return Num<T>::in(d.dy[m * d.O + k.hi]) * Num<T>::in(d.act[m * d.P + k.lo]);
  }
  __device__ acc b(int64_t, Idx k, int64_t n, Idx) const {
    return Num<T>::in(d.w[(k.hi * d.I + n) * d.P + k.lo]);
  }
};

template <typename T>
struct DactOp {  // dact[b, s] = sum_{(o,i)} (dy[b,o] x[b,i]) w[o*I + i, s]
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = true, kBAlongK = false;
  __host__ __device__ int64_t M() const { return d.B; }
  __host__ __device__ int64_t N() const { return d.P; }
  __host__ __device__ int64_t K() const { return d.O * d.I; }
  __host__ __device__ int64_t k_div() const { return d.I; }
  __host__ __device__ int64_t n_div() const { return 1; }
  __device__ acc a(int64_t m, int64_t, Idx k) const {
    return Num<T>::in(d.dy[m * d.O + k.hi]) * Num<T>::in(d.x[m * d.I + k.lo]);
  }
  __device__ acc b(int64_t k, Idx, int64_t n, Idx) const {
    return Num<T>::in(d.w[k * d.P + n]);
  }
};

template <typename T>
struct DweightOp {  // dweight[o, i*P + s] = sum_b dy[b,o] (x[b,i] act[b,s])
  using acc = typename Num<T>::acc;
  Operands<T> d;
  static constexpr bool kAAlongK = false, kBAlongK = false;
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

// ---- CUDA-core kernel ------------------------------------------------------------------

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
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int64_t k_tiles = cdiv(K, BK);
  const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
  const int64_t t_end = t_begin + tiles_per_split < k_tiles ? t_begin + tiles_per_split : k_tiles;
  if (tid < BN) n_index[tid] = split(n0 + tid, op.n_div());

  const int ty = tid / 16, tx = tid % 16;
  acc c[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) c[i][j] = acc(0);

  for (int64_t t = t_begin; t < t_end; ++t) {
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
      b_tile[kk][nn] = (n < N && k < K) ? op.b(k, k_index[kk], n, n_index[nn]) : acc(0);
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
      if (m >= M || n >= N) continue;
      if (workspace != nullptr) {
        workspace[(static_cast<int64_t>(blockIdx.z) * M + m) * N + n] = c[i][j];
      } else {
        out[m * N + n] = Num<T>::out(c[i][j]);
      }
    }
  }
}

// ---- tensor-core kernel (float16, bfloat16) -----------------------------------------------

constexpr int kTcBM = 64, kTcBN = 64, kTcBK = 32, kTcThreads = 128;

template <typename T, class Op>
__global__ void __launch_bounds__(kTcThreads, 4)
    wmma_gemm(Op op, T* __restrict__ out, float* __restrict__ workspace,
              int64_t tiles_per_split) {
  // The host launches this only where wmma takes T; other architectures compile an empty body.
  if constexpr (GLAI_ARCH >= TensorCoreArch<T>::value) {
    namespace wmma = nvcuda::wmma;
    constexpr int BM = kTcBM, BN = kTcBN, BK = kTcBK;
    // padded leading dimensions: multiples of 8 halves / 4 floats, as wmma requires, that
    // shift successive rows across banks
    constexpr int LDA = BK + 8, LDB = BN + 8, LDC = BN + 4;
    constexpr int kTileBytes = (BM * LDA + BK * LDB) * static_cast<int>(sizeof(T));
    constexpr int kOutBytes = BM * LDC * static_cast<int>(sizeof(float));
    __shared__ __align__(128) unsigned char smem[kTileBytes > kOutBytes ? kTileBytes : kOutBytes];
    __shared__ Idx k_index[BK];
    __shared__ Idx n_index[BN];
    T* a_tile = reinterpret_cast<T*>(smem);  // [BM][LDA], row m, column k
    T* b_tile = a_tile + BM * LDA;           // [BK][LDB], row k, column n
    float* c_tile = reinterpret_cast<float*>(smem);  // [BM][LDC], after the k loop

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

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(c[i][j], 0.0f);

    for (int64_t t = t_begin; t < t_end; ++t) {
      const int64_t k0 = t * BK;
      if (tid < BK) k_index[tid] = split(k0 + tid, op.k_div());
      __syncthreads();
      // the formed operands are products of two inputs, computed in float and rounded once
#pragma unroll 4
      for (int r = 0; r < BM * BK / kTcThreads; ++r) {
        const int e = tid + r * kTcThreads;
        const int mm = Op::kAAlongK ? e / BK : e % BM;
        const int kk = Op::kAAlongK ? e % BK : e / BM;
        const int64_t m = m0 + mm, k = k0 + kk;
        a_tile[mm * LDA + kk] = Num<T>::out((m < M && k < K) ? op.a(m, k, k_index[kk]) : 0.0f);
      }
#pragma unroll 4
      for (int r = 0; r < BN * BK / kTcThreads; ++r) {
        const int e = tid + r * kTcThreads;
        const int nn = Op::kBAlongK ? e / BK : e % BN;
        const int kk = Op::kBAlongK ? e % BK : e / BN;
        const int64_t n = n0 + nn, k = k0 + kk;
        b_tile[kk * LDB + nn] =
            Num<T>::out((n < N && k < K) ? op.b(k, k_index[kk], n, n_index[nn]) : 0.0f);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(fa[i], a_tile + (warp_m * 32 + i * 16) * LDA + kk, LDA);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          wmma::load_matrix_sync(fb[j], b_tile + kk * LDB + warp_n * 32 + j * 16, LDB);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], fa[i], fb[j], c[i][j]);
      }
      __syncthreads();
    }

    // accumulators -> shared memory (reusing the operand tiles) -> bounds-checked writes
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
      const float v = c_tile[mm * LDC + nn];
      if (workspace != nullptr) {
        workspace[(static_cast<int64_t>(blockIdx.z) * M + m) * N + n] = v;
      } else {
        out[m * N + n] = Num<T>::out(v);
      }
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

template <typename T>
bool use_tensor_cores() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major * 100 + minor * 10 >= TensorCoreArch<T>::value;
}

template <typename T, template <typename> class OpT>
cudaError_t launch_typed(const glai_problem& p, int splits, void* out, void* workspace,
                         cudaStream_t stream) {
  using acc = typename Num<T>::acc;
  const OpT<T> op{operands<T>(p)};
  const int64_t M = op.M(), N = op.N(), K = op.K();
  if (M == 0 || N == 0) return cudaSuccess;
  const bool tc = use_tensor_cores<T>();
  const int64_t bm = tc ? kTcBM : kSimtBM, bn = tc ? kTcBN : kSimtBN;
  const int64_t bk = tc ? kTcBK : kSimtBK;
  const int64_t k_tiles = cdiv(K, bk) > 0 ? cdiv(K, bk) : 1;
  const int64_t per_split = cdiv(k_tiles, splits > 0 ? splits : 1);
  const int64_t used = cdiv(k_tiles, per_split);  // no empty split
  const int64_t grid_n = cdiv(N, bn), grid_m = cdiv(M, bm);
  if (grid_n > 2147483647LL || grid_m > 65535 || used > 65535) return cudaErrorInvalidValue;
  // the split index tables hold k and n of the last tile, up to a tile past the end
  if (k_tiles * bk + bk > kMaxComposite || grid_n * bn > kMaxComposite)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m),
                  static_cast<unsigned>(used));
  acc* partial = used > 1 ? static_cast<acc*>(workspace) : nullptr;
  if (used > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  T* result = static_cast<T*>(out);
  auto* simt = &simt_gemm<T, OpT<T>>;
  if constexpr (TensorCoreArch<T>::value < (1 << 30)) {
    auto* tensor_cores = &wmma_gemm<T, OpT<T>>;
    if (tc) {
      GLAI_LAUNCH(tensor_cores, grid, kTcThreads, stream, op, result, partial, per_split);
    } else {
      GLAI_LAUNCH(simt, grid, kSimtThreads, stream, op, result, partial, per_split);
    }
  } else {
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
cudaError_t launch_op(const glai_problem& p, int splits, void* out, void* workspace,
                      cudaStream_t stream) {
  switch (p.dtype) {
    case GLAI_FLOAT32: return launch_typed<float, OpT>(p, splits, out, workspace, stream);
    case GLAI_FLOAT64: return launch_typed<double, OpT>(p, splits, out, workspace, stream);
    case GLAI_FLOAT16: return launch_typed<__half, OpT>(p, splits, out, workspace, stream);
    case GLAI_BFLOAT16:
      return launch_typed<__nv_bfloat16, OpT>(p, splits, out, workspace, stream);
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
  // the larger tiles of either kernel, so the count holds for both
  const int64_t tiles = cdiv(m, 64) * cdiv(n, 64);
  const int64_t k_tiles = cdiv(k, kTcBK);
  if (tiles == 0 || tiles >= sm_count) return 1;
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
    case GLAI_Y: return launch_op<YOp>(*p, splits, out, workspace, stream);
    case GLAI_DX: return launch_op<DxOp>(*p, splits, out, workspace, stream);
    case GLAI_DACT: return launch_op<DactOp>(*p, splits, out, workspace, stream);
    case GLAI_DWEIGHT: return launch_op<DweightOp>(*p, splits, out, workspace, stream);
  }
  return cudaErrorInvalidValue;
}
