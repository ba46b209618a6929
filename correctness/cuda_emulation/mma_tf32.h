// CPU emulation of wmma's TF32 subset (tests only): precision::tf32, m16n16k8 fragments and
// __float_to_tf32. Included at the end of mma.h.
//
// TF32 keeps float's sign and 8-bit exponent and the top 10 of its 23 mantissa bits.
// __float_to_tf32 rounds to nearest with ties away from zero, as cvt.rna.tf32.f32 does. The
// tensor core reads only those 19 bits of an operand register; what it does with an operand
// that was not converted first is not specified, and this emulation truncates it (drops the
// low 13 bits), so a kernel that forgets the conversion gets a visibly different result.
// Products of two TF32 values are exact in float (11-bit significands); the sums are float.
// fill_fragment and store_matrix_sync are mma.h's, which take either k.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

namespace nvcuda::wmma {

namespace precision {
struct tf32 {};
}  // namespace precision

inline float tf32_bits(float f, uint32_t add) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;  // inf and NaN pass unchanged
  u = (u + add) & 0xffffe000u;  // adding half an ulp to the magnitude rounds ties away
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float __float_to_tf32(float f) { return tf32_bits(f, 0x1000u); }
inline float tf32_operand(float f) { return tf32_bits(f, 0); }

// a: 16 x 8 (row m, column k); b: 8 x 16 (row k, column n); the accumulator 16 x 16
template <typename Layout>
struct fragment<matrix_a, 16, 16, 8, precision::tf32, Layout> {
  static constexpr int num_elements = 16 * 8;
  float x[16 * 8];
};
template <typename Layout>
struct fragment<matrix_b, 16, 16, 8, precision::tf32, Layout> {
  static constexpr int num_elements = 8 * 16;
  float x[8 * 16];
};
template <>
struct fragment<accumulator, 16, 16, 8, float, void> {
  static constexpr int num_elements = 16 * 16;
  float x[16 * 16];
};
using tf32_accumulator = fragment<accumulator, 16, 16, 8, float, void>;

template <typename Layout>
void load_matrix_sync(fragment<matrix_a, 16, 16, 8, precision::tf32, Layout>& f, const float* p,
                      unsigned ldm) {
  check_layout(p, ldm);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) f.x[r * 8 + c] = Layout::is_col ? p[c * ldm + r] : p[r * ldm + c];
}

template <typename Layout>
void load_matrix_sync(fragment<matrix_b, 16, 16, 8, precision::tf32, Layout>& f, const float* p,
                      unsigned ldm) {
  check_layout(p, ldm);
  for (int k = 0; k < 8; ++k)
    for (int n = 0; n < 16; ++n)
      f.x[k * 16 + n] = Layout::is_col ? p[n * ldm + k] : p[k * ldm + n];
}

template <typename LA, typename LB>
void mma_sync(tf32_accumulator& d, const fragment<matrix_a, 16, 16, 8, precision::tf32, LA>& a,
              const fragment<matrix_b, 16, 16, 8, precision::tf32, LB>& b,
              const tf32_accumulator& c) {
  float out[16 * 16];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float sum = c.x[r * 16 + n];
      for (int k = 0; k < 8; ++k)
        sum += tf32_operand(a.x[r * 8 + k]) * tf32_operand(b.x[k * 16 + n]);
      out[r * 16 + n] = sum;
    }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
