// What the dense (cpu_dispatch.cpp, kernels.inc) and sparse (sparse_kernels.cpp,
// sparse_kernels.inc) CPU kernels share to be compiled once per instruction set. This header
// is read twice over, in two roles:
//
// - at file scope, before any kernel (VBYTES not defined): the ISA ladder. GLAI_X86 says the
//   x86 sets can be compiled (GCC or clang on x86-64); GLAI_ISA_BEGIN(target) ...
//   GLAI_ISA_END() compiles the code between for one of the GLAI_TARGET_* instruction sets,
//   as the `target` pragma pair of the compiler in use (push/pop, so what follows is back on
//   the build's own target). The baseline (the `portable` kernels) needs no pragma.
// - inside each ISA's namespace, from the top of a kernels .inc file (VBYTES, the vector
//   width in bytes, defined): the vector type of that width and its unaligned load and store.
//   They are defined once per namespace on purpose, like everything in the .inc files: a
//   template shared by two ISA copies would be one symbol to the linker, which keeps either
//   copy (kernels.inc). This part includes nothing.
#ifndef GLAI_CPU_ISA_H
#define GLAI_CPU_ISA_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GLAI_X86 1
#endif

#define GLAI_TARGET_AVX512 "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"
#define GLAI_TARGET_AVX512BF16 "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma"
#define GLAI_TARGET_AVX2 "avx2,fma"

// _Pragma takes a string; #text makes one of the pragma's tokens once `isa` is substituted.
#define GLAI_PRAGMA(text) _Pragma(#text)
#if defined(__clang__)
#define GLAI_ISA_BEGIN(isa) \
  GLAI_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define GLAI_ISA_END() GLAI_PRAGMA(clang attribute pop)
#else
#define GLAI_ISA_BEGIN(isa) GLAI_PRAGMA(GCC push_options) GLAI_PRAGMA(GCC target(isa))
#define GLAI_ISA_END() GLAI_PRAGMA(GCC pop_options)
#endif

#endif  // GLAI_CPU_ISA_H

#ifdef VBYTES
template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(VBYTES)));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
constexpr int kLanes = VBYTES / static_cast<int>(sizeof(T));

template <typename T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void store(T* p, Vec<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}
#endif  // VBYTES
