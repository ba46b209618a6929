// The large-batch full-float32 tile (issue 38): float32 on CUDA cores, no TF32, at sizes where
// a 128x128 output tile is filled (M and N at least 128). Included by estimator_kernels.cu
// inside its anonymous namespace, after what it uses: Idx/split, Num, cdiv, BlockSpan, the Ops,
// kStages, stage_tile and run_pipeline.
//
// Shape and why:
//   - 128x128 outputs a block, 256 threads, 8x8 outputs a thread in registers: per k step a
//     thread reads 8 values of A and 8 of B from shared memory and does 64 FMAs (8 FMAs per
//     value read; the 64x64 simt_gemm tile does 4x4 outputs a thread, 2 per value).
//   - 8-wide k tiles through the 3-stage ring (run_pipeline): the weight (y, dx, dact) by
//     16-byte cp.async where its rows come in 16-byte runs (stage_tile), the formed operand by
//     the threads: x act, dy act, dy x from a table of row offsets (stage_formed_a), dy and
//     x act for dweight by stage_tile. 3 stages of A [128][12] and B [128][12] or [8][132]
//     floats: 30-36 KB, two blocks an SM (launch bound: 128 registers).
//   - Every operand row is read as 16-byte vectors without bank conflicts. A is stored
//     [m][k] with rows of 12 floats (8 + 4 padding); thread (ty, tx) takes rows ty + 16 i, so a
//     warp's 32 threads read 2 rows (a broadcast). B along k (y, dx) is stored [n][k], rows of
//     12: columns tx + 16 j, so the 8 threads of a quarter warp (one 128-bit wavefront) read
//     rows tx*3 float4 slots apart, 3 odd: 8 different bank groups. B along n (dact, dweight)
//     is stored [k][n], rows of 132: columns 4 tx + {0..3} and 64 + 4 tx + {0..3}, a quarter
//     warp reading 32 consecutive floats.
//   - Each k tile is two steps of 4 k: a thread loads B's 8 columns x 4 k (32 registers), then
//     for each of its 8 rows one float4 of A (4 k) and 32 FMAs. 64 accumulators + 32 + 4.
//   - The sum of each output runs over k in order (tile by tile, k by k within a tile), the
//     split-K partial sums reduced in split order afterwards: deterministic.
// (No includes of its own: it is read inside that namespace.)
#pragma once

constexpr int kTileBM = 128, kTileBN = 128, kTileBK = 8, kTileThreads = 256;
constexpr int kTileBlocksPerSm = 2;
constexpr int kTileMinTiles = 16;  // k tiles a split takes at least (the ring's fill and drain)

// Whether the large tile takes a full-float32 product of M x N (the caller has ruled out the
// chains and the tensor cores): one whole tile each way at least.
__host__ __device__ inline bool large_tile_fits(int64_t m, int64_t n) {
  return m >= kTileBM && n >= kTileBN;
}

// Four floats, 16-byte aligned: copied as one 128-bit vector (ld.shared.v4.f32). Not CUDA's
// float4, so the CPU emulation needs no vector types.
struct alignas(16) Float4 {
  float x, y, z, w;
};

// 16 bytes of shared memory at p (16-byte aligned) as one vector load.
__device__ __forceinline__ Float4 load4(const float* p) {
#ifdef GLAI_CUDA_EMULATION
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {  // the device would fault
    glai_emulation::sticky_error = cudaErrorMisalignedAddress;
  }
  Float4 v;
  memcpy(&v, p, sizeof v);
  return v;
#else
  return *reinterpret_cast<const Float4*>(p);
#endif
}

// y, dx and dact form A(m, k) = hi[m * hi_stride + k.hi] * lo[m * lo_stride + k.lo] (their
// Ops' a(); the tests hold the two to the oracle). The tile stages it from a per-block table of
// each row's two offsets: 64-bit multiplies once a block, not once an element (stage_tile's
// general loop spends about 45 instructions an element, a fifth of the tile's issue slots).
struct FormedA {
  const float* hi;
  const float* lo;
  int64_t hi_stride, lo_stride;
};
__device__ inline FormedA formed_a(const YOp<float>& op) {
  return {op.d.x, op.d.act, op.d.I, op.d.P};
}
__device__ inline FormedA formed_a(const DxOp<float>& op) {
  return {op.d.dy, op.d.act, op.d.O, op.d.P};
}
__device__ inline FormedA formed_a(const DactOp<float>& op) {
  return {op.d.dy, op.d.x, op.d.O, op.d.I};
}

// A's k tile [k0, k0 + BK) into a_s [BM][LDA]: a thread's elements share one column kk (one
// split k), rows tid / BK + (kThreads / BK) r; `rows` holds each row's offsets (hi, lo).
template <int BM, int BK, int LDA, int kThreads, class Op>
__device__ __forceinline__ void stage_formed_a(const Op& op, float* a_s, const Idx* rows,
                                               const Idx* k_index, int64_t m0, int64_t k0) {
  static_assert(kThreads % BK == 0, "a thread keeps one column");
  const FormedA f = formed_a(op);
  const int tid = threadIdx.x, kk = tid % BK;
  const Idx k = k_index[kk];
  // rows of the tile inside M (0 where column kk is past K): one 32-bit bound in the loop
  const int64_t left = k0 + kk < op.K() ? op.M() - m0 : 0;
  const int rows_in = left < BM ? static_cast<int>(left) : BM;
#pragma unroll 1
  for (int mm = tid / BK; mm < BM; mm += kThreads / BK) {
    float v = 0.0f;
    if (mm < rows_in) {
      const Idx r = rows[mm];
      v = f.hi[r.hi + k.hi] * f.lo[r.lo + k.lo];
    }
    a_s[mm * LDA + kk] = v;
  }
}

template <class Op>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm)
    large_tile_gemm(Op op, float* __restrict__ out, float* __restrict__ workspace,
                    int64_t tiles_per_split, bool vector_b) {
  constexpr int BM = kTileBM, BN = kTileBN, BK = kTileBK;
  constexpr int LDA = BK + 4, LDB = Op::kBAlongK ? BK + 4 : BN + 4;
  constexpr int kABytes = align128(BM * LDA * static_cast<int>(sizeof(float)));
  constexpr int kBBytes = align128((Op::kBAlongK ? BN : BK) * LDB * static_cast<int>(sizeof(float)));
  __shared__ __align__(128) unsigned char smem[kStages * (kABytes + kBBytes)];
  __shared__ Idx k_index[2][BK];
  __shared__ Idx n_index[BN];
  __shared__ Idx rows[Op::kAAlongK ? BM : 1];  // A's row offsets (stage_formed_a)
  auto a_stage = [&](int s) { return reinterpret_cast<float*>(smem + s * (kABytes + kBBytes)); };
  auto b_stage = [&](int s) {
    return reinterpret_cast<float*>(smem + s * (kABytes + kBBytes) + kABytes);
  };

  const int tid = threadIdx.x;
  const int64_t M = op.M(), N = op.N(), K = op.K();
  const BlockSpan span = block_span<BM, BN, BK>(K, tiles_per_split);
  const int64_t m0 = span.m0, n0 = span.n0;
  if (tid < BN) n_index[tid] = split(n0 + tid, op.n_div());
  if constexpr (Op::kAAlongK) {  // read after run_pipeline's first barrier
    const FormedA f = formed_a(op);
    if (tid < BM) rows[tid] = {(m0 + tid) * f.hi_stride, (m0 + tid) * f.lo_stride};
  }

  const int ty = tid / 16, tx = tid % 16;
  // the thread's column j in the tile, by B's layout (see the top)
  auto column = [&](int j) { return Op::kBAlongK ? tx + 16 * j : (j / 4) * 64 + 4 * tx + j % 4; };
  float c[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) c[i][j] = 0.0f;

  auto issue = [&](int64_t t, int s, const Idx* table) {
    if constexpr (Op::kAAlongK) {  // A from the row table, then B alone (BM = 0: no A)
      stage_formed_a<BM, BK, LDA, kTileThreads>(op, a_stage(s), rows, table, m0, t * BK);
      stage_tile<0, BN, BK, LDA, LDB, kTileThreads>(op, a_stage(s), b_stage(s), table, n_index,
                                                   m0, n0, t * BK, vector_b);
    } else {  // dweight: A is dy itself, B the formed operand
      stage_tile<BM, BN, BK, LDA, LDB, kTileThreads>(op, a_stage(s), b_stage(s), table,
                                                    n_index, m0, n0, t * BK, vector_b);
    }
  };
  auto compute = [&](int s) {
    const float* a_s = a_stage(s);
    const float* b_s = b_stage(s);
#pragma unroll 1  // unrolled, y and dx spilled 8 bytes at 128 registers
    for (int kq = 0; kq < BK; kq += 4) {
      float b[8][4];  // [column j][k kq + u]
      if constexpr (Op::kBAlongK) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const Float4 v = load4(b_s + (tx + 16 * j) * LDB + kq);
          b[j][0] = v.x, b[j][1] = v.y, b[j][2] = v.z, b[j][3] = v.w;
        }
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const Float4 v = load4(b_s + (kq + u) * LDB + h * 64 + 4 * tx);
            b[4 * h][u] = v.x, b[4 * h + 1][u] = v.y, b[4 * h + 2][u] = v.z, b[4 * h + 3][u] = v.w;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const Float4 v = load4(a_s + (ty + 16 * i) * LDA + kq);
        const float a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int j = 0; j < 8; ++j) c[i][j] += a[u] * b[j][u];
      }
    }
  };
  run_pipeline<BK, kTileThreads>(op, k_index, span.t_begin, span.t_end, issue, compute);

  // float32 out and workspace alike: one destination, a row pointer per row (64-bit
  // addresses for each of the 64 outputs made ptxas spill)
  float* const dst =
      workspace != nullptr ? workspace + static_cast<int64_t>(blockIdx.z) * M * N : out;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= M) break;  // rows increase with i
    float* const row = dst + m * N + n0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (n0 + column(j) < N) row[column(j)] = c[i][j];
    }
  }
}

// The large tile's split count: the smallest s that comes within 5% of a time model's minimum
// (a larger count must save 5% over the best smaller one: more splits, more workspace, for a
// gain the model is too crude to promise). The model, in FLOPs at the kernel's rate R: the grid runs
// ceil(tiles * s / slots) waves (slots: kTileBlocksPerSm blocks on each SM), each as long as
// one block's 2 * 128 * 128 * ceil(K / s) FLOPs at R / slots; a split adds its partial sums'
// traffic, 8 * s * M * N bytes (written, then read by reduce_splits), at kTileFlopsPerByte.
// At most 256 splits, none shorter than kTileMinTiles k tiles. On 132 SMs at B = 4096: y at
// B1 and B2 (32 tiles) 8 splits, 256 blocks; dx at B1 (352 tiles, 1.33 waves) 3 splits, 4.0
// waves; dweight (3,203 tiles at B1) none.
constexpr double kTileFlopsPerByte = 11;  // H100 SXM: half of 67 TFLOP/s over 3 TB/s
inline int large_tile_splits(int64_t m, int64_t n, int64_t k, int sm_count) {
  const int64_t tiles = cdiv(m, kTileBM) * cdiv(n, kTileBN);
  const int64_t slots = static_cast<int64_t>(sm_count) * kTileBlocksPerSm;
  auto cost = [&](int64_t s) {
    const double block = 2.0 * kTileBM * kTileBN * static_cast<double>(cdiv(k, s));
    const double partials = s > 1 ? 8.0 * static_cast<double>(s * m * n) : 0.0;
    return static_cast<double>(cdiv(tiles * s, slots) * slots) * block +
           partials * kTileFlopsPerByte;
  };
  int64_t most = cdiv(k, kTileBK) / kTileMinTiles;
  most = most < 256 ? most : 256;
  int64_t best = 1;
  for (int64_t s = 2; s <= most; ++s) {
    if (cost(s) <= 0.95 * cost(best)) best = s;
  }
  return static_cast<int>(best);
}
