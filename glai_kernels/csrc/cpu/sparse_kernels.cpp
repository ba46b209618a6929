// Compiles sparse_kernels.inc once per instruction set, as cpu_dispatch.cpp does kernels.inc,
// and follows cpu_dispatch.cpp's run-time choice: kernels<T>() returns the set that
// glai_cpu::isa() names, so $GLAI_KERNELS_CPU_ISA and glai_ext::cpu_isa switch the dense and
// the sparse kernels together. The namespaces differ from the dense ones (glai_cpu::sparse::
// <isa>): the two .inc files define helpers of the same names.
#include <cstdint>
#include <cstring>

#include "isa.h"  // the ISA ladder: GLAI_X86, GLAI_ISA_BEGIN/END
#include "kernels.h"
#include "sparse_kernels.h"

#if GLAI_X86
#include <immintrin.h>  // the AVX-512 copy's few intrinsics (sparse_kernels.inc, round_weights)

GLAI_ISA_BEGIN(GLAI_TARGET_AVX512)
namespace glai_cpu::sparse::avx512 {
#define VBYTES 64
#include "sparse_kernels.inc"
#undef VBYTES
}  // namespace glai_cpu::sparse::avx512
GLAI_ISA_END()
GLAI_ISA_BEGIN(GLAI_TARGET_AVX2)
namespace glai_cpu::sparse::avx2 {
#define VBYTES 32
#include "sparse_kernels.inc"
#undef VBYTES
}  // namespace glai_cpu::sparse::avx2
GLAI_ISA_END()
#endif  // GLAI_X86

namespace glai_cpu::sparse::portable {
#define VBYTES 16
#include "sparse_kernels.inc"
#undef VBYTES
}  // namespace glai_cpu::sparse::portable

namespace glai_cpu::sparse {
namespace {

#define GLAI_SPARSE_SET(ns, T) \
  Kernels<T> { &ns::forward<T>, &ns::dvalues<T>, &ns::dx<T>, &ns::dact<T>, &ns::adam<T>, \
            &ns::transpose<T> }

template <typename T>
struct Named {
  const char* name;
  Kernels<T> kernels;
};

template <typename T>
const Kernels<T>& pick() {
  static const Named<T> sets[] = {
#if GLAI_X86
      {"avx512", GLAI_SPARSE_SET(avx512, T)},
      {"avx2", GLAI_SPARSE_SET(avx2, T)},
#endif
      {"portable", GLAI_SPARSE_SET(portable, T)},
  };
  const char* chosen = glai_cpu::isa();
  for (const auto& set : sets)
    if (std::strcmp(set.name, chosen) == 0) return set.kernels;
  return sets[sizeof(sets) / sizeof(sets[0]) - 1].kernels;  // portable runs everywhere
}

}  // namespace

template <>
const Kernels<float>& kernels<float>() {
  return pick<float>();
}
template <>
const Kernels<double>& kernels<double>() {
  return pick<double>();
}

}  // namespace glai_cpu::sparse
