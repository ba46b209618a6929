// CPU emulation of __half (tests only): IEEE binary16 through the compiler's _Float16.
#pragma once

struct __half {
  _Float16 v;
};
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half_rn(float f) { return {static_cast<_Float16>(f)}; }
