// Compiles kernels.inc once per instruction set and picks one at run time.
//
// Builds meant for other machines cannot use -march=native, and a baseline x86-64 build
// would leave AVX-512 unused (twice AVX2's FMA work per instruction: 2.2-3x MKL's sgemm rate
// for these kernels on the machine in docs/notes/cpu-kernels.md, where MKL runs AVX2 code). So the
// same source is compiled three times under target pragmas, into namespaces avx512, avx2 and
// portable, and __builtin_cpu_supports chooses at first use. $GLAI_KERNELS_CPU_ISA (or the op
// glai_ext::cpu_isa) forces one, for tests. bfloat16 has its own kernels (kernels_bf16.inc) for
// CPUs with AVX512_BF16, used with "avx512".
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "isa.h"  // the ISA ladder: GLAI_X86, GLAI_ISA_BEGIN/END
#include "kernels.h"

#if GLAI_X86
#include <immintrin.h>  // the bfloat16 kernels' dot-product intrinsics
#endif

namespace glai_cpu {

void* alloc_bytes(int64_t bytes) { return std::aligned_alloc(64, static_cast<size_t>(bytes)); }
void free_scratch(const void* p) { std::free(const_cast<void*>(p)); }

}  // namespace glai_cpu

#if GLAI_X86
GLAI_ISA_BEGIN(GLAI_TARGET_AVX512)
namespace glai_cpu::avx512 {
#define VBYTES 64
#include "kernels.inc"
#undef VBYTES
}  // namespace glai_cpu::avx512
GLAI_ISA_END()
GLAI_ISA_BEGIN(GLAI_TARGET_AVX2)
namespace glai_cpu::avx2 {
#define VBYTES 32
#include "kernels.inc"
#undef VBYTES
}  // namespace glai_cpu::avx2
GLAI_ISA_END()
GLAI_ISA_BEGIN(GLAI_TARGET_AVX512BF16)
namespace glai_cpu::avx512bf16 {
#include "kernels_bf16.inc"
}  // namespace glai_cpu::avx512bf16
GLAI_ISA_END()
#endif  // GLAI_X86

// The baseline of the build's target (SSE2 on x86-64, NEON on aarch64): 16-byte vectors.
namespace glai_cpu::portable {
#define VBYTES 16
#include "kernels.inc"
#undef VBYTES
}  // namespace glai_cpu::portable

namespace glai_cpu {
namespace {

struct Isa {
  const char* name;
  bool (*supported)();
  Kernels<float> f32;
  Kernels<double> f64;
};

#define GLAI_ISA_ENTRY(ns, supported_fn)                                    \
  Isa {                                                                     \
    #ns, supported_fn,                                                      \
        {&ns::forward<float>, &ns::backward<float>, &ns::linear<float>}, {  \
      &ns::forward<double>, &ns::backward<double>, &ns::linear<double>      \
    }                                                                       \
  }

#if GLAI_X86
bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif
bool always() { return true; }

// best first
const Isa kIsas[] = {
#if GLAI_X86
    GLAI_ISA_ENTRY(avx512, has_avx512),
    GLAI_ISA_ENTRY(avx2, has_avx2),
#endif
    GLAI_ISA_ENTRY(portable, always),
};
constexpr int kIsaCount = sizeof(kIsas) / sizeof(kIsas[0]);

int find(const char* name) {
  for (int i = 0; i < kIsaCount; ++i)
    if (std::strcmp(kIsas[i].name, name) == 0 && kIsas[i].supported()) return i;
  return -1;
}

int initial_choice() {
  const char* forced = std::getenv("GLAI_KERNELS_CPU_ISA");
  if (forced != nullptr && forced[0] != '\0') {
    const int i = find(forced);
    if (i >= 0) return i;
  }
  for (int i = 0; i < kIsaCount; ++i)
    if (kIsas[i].supported()) return i;
  return kIsaCount - 1;
}

int& current() {
  static int chosen = initial_choice();
  return chosen;
}

}  // namespace

template <>
const Kernels<float>& kernels<float>() {
  return kIsas[current()].f32;
}
template <>
const Kernels<double>& kernels<double>() {
  return kIsas[current()].f64;
}

const Bf16Kernels* bf16_kernels() {
#if GLAI_X86
  static const Bf16Kernels table{&avx512bf16::forward, &avx512bf16::backward};
  static const bool cpu_has = has_avx512() && __builtin_cpu_supports("avx512bf16");
  if (cpu_has && std::strcmp(kIsas[current()].name, "avx512") == 0) return &table;
#endif
  return nullptr;
}

int64_t dx_along_s_max_weight_bytes() {
  constexpr int64_t kMiB = int64_t{1} << 20;
#if GLAI_X86
  static const int64_t bytes = __builtin_cpu_is("intel") ? 4 * kMiB : 16 * kMiB;
  return bytes;
#else
  return 16 * kMiB;
#endif
}

const char* isa() { return kIsas[current()].name; }

bool select_isa(const char* name) {
  const int i = find(name);
  if (i < 0) return false;
  current() = i;
  return true;
}

const char* supported_isas() {
  static char names[64] = {};
  if (names[0] == '\0') {
    for (int i = 0; i < kIsaCount; ++i) {
      if (!kIsas[i].supported()) continue;
      if (names[0] != '\0') std::strcat(names, ",");
      std::strcat(names, kIsas[i].name);
    }
  }
  return names;
}

}  // namespace glai_cpu
