// The glai_peak operator library: microbenchmarks of what this CPU can physically do, the
// ceilings bench/harness/ceilings.py judges the kernels against. Not part of glai_ext (built apart by
// bench/harness/native_peak.py, so a failed build here never touches the kernels).
//
//   glai_peak::supports(str isa) -> bool        "avx512f", "avx2" (with FMA), "avx512bf16",
//       "avx512fp16", "amx_bf16" (the CPU has the tiles and the OS granted their state)
//   glai_peak::fma(str kernel, int iterations, int threads) -> (float seconds, float flops)
//       `threads` threads each run `iterations` rounds of kChains independent FMA (or bf16
//       dot-product) instructions, or of four independent AMX tile products; seconds is the
//       wall time from a common start to the last thread's end. Kernels: avx512_f32,
//       avx512_f64, avx2_f32, avx2_f64, avx512bf16, avx512_f16, amx_bf16.
//   glai_peak::triad(Tensor a, Tensor b, Tensor c, float s, int reps, int threads) -> float
//       the fastest of `reps` rounds of a[i] = b[i] + s * c[i] (float32, split in contiguous
//       chunks across `threads` threads started once), in seconds.
//   glai_peak::clock(int iterations) -> float
//       the seconds of `iterations` × 100 dependent register-to-register integer adds on this
//       thread (x86): one a cycle on every x86 core of the last two decades, so iterations ×
//       100 / seconds is the core's clock while it runs one thread's integer work. Not adds of
//       an immediate: Intel's cores since Golden Cove fold chains of those at rename, several a
//       cycle (an Emerald Rapids read 15 "GHz"), where an add of a register's value must
//       execute.
//
// FLOPs: an FMA lane is 2 (multiply, add). vdpbf16ps adds two bf16 products into each float32
// lane: 2 products and 2 adds, 4 FLOPs per lane, 64 per 512-bit instruction. An AMX
// tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 float32 sums:
// 16 * 16 * 32 multiply-adds, 16,384 FLOPs.
//
// The chains converge to a finite value (acc = acc * m + c with 0 < m < 1), so no lane ever
// becomes denormal, infinite or NaN, which would slow some units down.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PEAK_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace glai_peak {

// 12 chains: more than FMA latency (4 cycles) x FMA ports (2) on current x86 cores.
constexpr int kChains = 12;

// A spinning barrier: thread creation (tens of microseconds) must not be timed.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    const int phase = phase_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      phase_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (phase_.load(std::memory_order_acquire) == phase) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> phase_{0};
};

using Clock = std::chrono::steady_clock;

// Runs body(thread, round) on `threads` threads for `rounds` rounds, each round started by a
// barrier; returns the fastest round's wall time (start barrier to end barrier).
template <typename Body>
double timed_rounds(int threads, int rounds, Body body) {
  Barrier barrier(threads);
  double best = std::numeric_limits<double>::infinity();
  Clock::time_point start;
  auto work = [&](int t) {
    for (int r = 0; r < rounds; ++r) {
      barrier.wait();
      if (t == 0) start = Clock::now();
      barrier.wait();
      body(t, r);
      barrier.wait();
      if (t == 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  return best;
}

#if PEAK_X86
// Each returns a sum of its accumulators so the compiler must compute them.
#define PEAK_CHAINS(VEC, SET1, FMA, ADD, REDUCE)                        \
  VEC acc[kChains];                                                     \
  for (int k = 0; k < kChains; ++k) acc[k] = SET1(1.0 + 0.01 * k);      \
  const VEC m = SET1(0.999);                                            \
  const VEC c = SET1(0.001);                                            \
  for (int64_t n = 0; n < iterations; ++n) {                            \
    _Pragma("GCC unroll 12") for (int k = 0; k < kChains; ++k)          \
      acc[k] = FMA(acc[k], m, c);                                       \
  }                                                                     \
  for (int k = 1; k < kChains; ++k) acc[0] = ADD(acc[0], acc[k]);       \
  return REDUCE(acc[0]);

__attribute__((target("avx512f"))) double fma_avx512_f32(int64_t iterations) {
  PEAK_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_reduce_add_ps)
}
__attribute__((target("avx512f"))) double fma_avx512_f64(int64_t iterations) {
  PEAK_CHAINS(__m512d, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_add_pd, _mm512_reduce_add_pd)
}
__attribute__((target("avx2,fma"))) static double sum8(__m256 v) {
  alignas(32) float f[8];
  _mm256_store_ps(f, v);
  double s = 0;
  for (float x : f) s += x;
  return s;
}
__attribute__((target("avx2,fma"))) static double sum4(__m256d v) {
  alignas(32) double f[4];
  _mm256_store_pd(f, v);
  return f[0] + f[1] + f[2] + f[3];
}
__attribute__((target("avx2,fma"))) double fma_avx2_f32(int64_t iterations) {
  PEAK_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, sum8)
}
__attribute__((target("avx2,fma"))) double fma_avx2_f64(int64_t iterations) {
  PEAK_CHAINS(__m256d, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_add_pd, sum4)
}

// acc += a.b pairwise with a, b bf16 vectors of 32 lanes: products ~1e-3 keep acc finite and
// far from denormal for any run length this benchmark uses (it grows by ~2e-3 per round).
__attribute__((target("avx512f,avx512bf16"))) double dp_avx512bf16(int64_t iterations) {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(1.0f + 0.01f * k);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.03f), _mm512_set1_ps(0.03f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.03f), _mm512_set1_ps(0.03f));
  for (int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  for (int k = 1; k < kChains; ++k) acc[0] = _mm512_add_ps(acc[0], acc[k]);
  return _mm512_reduce_add_ps(acc[0]);
}

// acc += a * b in half precision (32 lanes): the same converging chain as the others.
__attribute__((target("avx512f,avx512fp16"))) double fma_avx512_f16(int64_t iterations) {
  PEAK_CHAINS(__m512h, _mm512_set1_ph, _mm512_fmadd_ph, _mm512_add_ph, _mm512_reduce_add_ph)
}

// Linux keeps AMX's 8 KiB tile state off until a process asks for it (arch_prctl); a CPU
// whose tiles the OS will not grant cannot run the kernel.
static bool amx_granted() {
  static const bool granted = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return tile && bf16 && syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

// The tile palette's layout (Intel SDM, LDTILECFG): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Four accumulator tiles (2 x 2 blocking, as a GEMM's inner loop holds them), operands loaded
// once: the tile unit's own rate, as the FMA chains measure the vector units'. Products of
// 0.03 x 0.03 grow each sum by ~0.03 a product: finite for any run length used here.
__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16_tiles(int64_t iterations) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.rows[t] = 16, config.bytes_per_row[t] = 64;
  _tile_loadconfig(&config);
  alignas(64) uint16_t operand[16 * 32];
  const float value = 0.03f;
  uint32_t bits;
  __builtin_memcpy(&bits, &value, 4);
  for (uint16_t& v : operand) v = static_cast<uint16_t>(bits >> 16);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t n = 0; n < iterations; ++n) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float sums[4][16 * 16];
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  _tile_stored(2, sums[2], 64);
  _tile_stored(3, sums[3], 64);
  _tile_release();
  double total = 0;
  for (const auto& tile : sums)
    for (float v : tile) total += v;
  return total;
}
#endif  // PEAK_X86

bool supports(std::string isa) {
#if PEAK_X86
  __builtin_cpu_init();
  if (isa == "avx512f") return __builtin_cpu_supports("avx512f");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx512bf16")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  if (isa == "avx512fp16")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512fp16");
  if (isa == "amx_bf16") return amx_granted();
#endif
  (void)isa;
  return false;
}

std::tuple<double, double> fma(std::string kernel, int64_t iterations, int64_t threads) {
  TORCH_CHECK(iterations > 0 && threads > 0, "glai_peak::fma: iterations and threads > 0");
#if PEAK_X86
  double (*fn)(int64_t) = nullptr;
  double flops_per_round = 0;  // FLOPs of one iteration: kChains vector instructions, or
                               // four tile products
  std::string isa;
  const double chains = kChains;
  if (kernel == "avx512_f32") fn = fma_avx512_f32, flops_per_round = 32 * chains, isa = "avx512f";
  if (kernel == "avx512_f64") fn = fma_avx512_f64, flops_per_round = 16 * chains, isa = "avx512f";
  if (kernel == "avx2_f32") fn = fma_avx2_f32, flops_per_round = 16 * chains, isa = "avx2";
  if (kernel == "avx2_f64") fn = fma_avx2_f64, flops_per_round = 8 * chains, isa = "avx2";
  if (kernel == "avx512bf16") fn = dp_avx512bf16, flops_per_round = 64 * chains, isa = "avx512bf16";
  if (kernel == "avx512_f16") fn = fma_avx512_f16, flops_per_round = 64 * chains, isa = "avx512fp16";
  if (kernel == "amx_bf16") fn = amx_bf16_tiles, flops_per_round = 4 * 16384.0, isa = "amx_bf16";
  TORCH_CHECK(fn != nullptr, "glai_peak::fma: unknown kernel ", kernel);
  TORCH_CHECK(supports(isa), "glai_peak::fma: this CPU lacks ", isa);
  std::vector<double> sink(threads);
  const double seconds = timed_rounds(static_cast<int>(threads), 1,
                                      [&](int t, int) { sink[t] = fn(iterations); });
  for (double s : sink)
    TORCH_CHECK(s == s && s < std::numeric_limits<double>::infinity(),
                "glai_peak::fma: accumulators left the finite range");
  const double flops = flops_per_round * static_cast<double>(iterations) *
                       static_cast<double>(threads);
  return {seconds, flops};
#else
  TORCH_CHECK(false, "glai_peak::fma: only x86-64 kernels are written; ", kernel);
#endif
}

#if PEAK_X86
__attribute__((target("avx512f"))) static void triad_avx512(float* a, const float* b,
                                                            const float* c, float s,
                                                            int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(a + i, _mm512_fmadd_ps(vs, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}
#endif

static void triad_plain(float* a, const float* b, const float* c, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

double triad(at::Tensor a, const at::Tensor& b, const at::Tensor& c, double s, int64_t reps,
             int64_t threads) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
                  c.scalar_type() == at::kFloat,
              "glai_peak::triad: float32 tensors");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous() &&
                  a.numel() == b.numel() && a.numel() == c.numel() && a.is_cpu(),
              "glai_peak::triad: three contiguous CPU tensors of one size");
  TORCH_CHECK(reps > 0 && threads > 0, "glai_peak::triad: reps and threads > 0");
  void (*fn)(float*, const float*, const float*, float, int64_t) = triad_plain;
#if PEAK_X86
  if (supports("avx512f")) fn = triad_avx512;
#endif
  float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  const float* pc = c.data_ptr<float>();
  const int64_t n = a.numel();
  // chunks aligned to 16 floats (a cache line), so threads never share one
  const int64_t chunk = (n / threads + 15) / 16 * 16;
  const float fs = static_cast<float>(s);
  return timed_rounds(static_cast<int>(threads), static_cast<int>(reps), [&](int t, int) {
    const int64_t begin = std::min(n, t * chunk);
    const int64_t end = std::min(n, begin + chunk);
    fn(pa + begin, pb + begin, pc + begin, fs, end - begin);
  });
}

#define PEAK_ADD10 "add %1, %0\n\t" "add %1, %0\n\t" "add %1, %0\n\t" "add %1, %0\n\t" \
                  "add %1, %0\n\t" "add %1, %0\n\t" "add %1, %0\n\t" "add %1, %0\n\t" \
                  "add %1, %0\n\t" "add %1, %0\n\t"

double clock(int64_t iterations) {
  TORCH_CHECK(iterations > 0, "glai_peak::clock: iterations > 0");
#if PEAK_X86
  uint64_t x = 0;
  const uint64_t one = 1;  // an operand in a register: the renamer cannot fold its adds
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    // a chain: each add waits for the one before (the loop's own counter is another chain)
    asm volatile(PEAK_ADD10 PEAK_ADD10 PEAK_ADD10 PEAK_ADD10 PEAK_ADD10 PEAK_ADD10 PEAK_ADD10
                 PEAK_ADD10 PEAK_ADD10 PEAK_ADD10
                 : "+r"(x)
                 : "r"(one));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  TORCH_CHECK(x == static_cast<uint64_t>(iterations) * 100, "glai_peak::clock: the chain was cut");
  return seconds;
#else
  TORCH_CHECK(false, "glai_peak::clock: x86 only");
#endif
}
#undef PEAK_ADD10

TORCH_LIBRARY(glai_peak, m) {
  m.def("supports(str isa) -> bool", &supports);
  m.def("fma(str kernel, int iterations, int threads) -> (float, float)", &fma);
  m.def("triad(Tensor(a!) a, Tensor b, Tensor c, float s, int reps, int threads) -> float",
        &triad);
  m.def("clock(int iterations) -> float", &clock);
}

}  // namespace glai_peak
