// Vectorised exp for the CPU interpreter's softmax and SiLU, 16 floats at a time (GCC vector
// extensions: AVX-512, AVX2 or SSE registers, whatever the build targets). One algorithm for vectors
// and for the scalar tail, so an element's bits never depend on where it falls in a span (the
// interpreter's determinism rule, kernels.h). Compiled without multiply-add contraction wherever it is
// included (the pragma below): every step is one rounding.
//
// exp(x) = 2^n * e^r with n = nearest(x / ln 2) and r = x - n ln 2 (ln 2 in two parts, Cody and
// Waite), |r| <= ln 2 / 2, e^r by its Taylor polynomial to degree 7 in Horner form (truncation error
// below 2e-8 relative there), 2^n put together in the exponent bits. Within 2 ulp of the correctly
// rounded exp over [-87.3, 88] (checked against std::exp in tests/unit/test_cpu.cpp); x < -87.33
// gives 0 (no subnormal results), x > 88.72 gives +inf, NaN stays NaN. Inputs in (88, 88.72] are
// taken as 88 (only SiLU of very negative values sees them, where 1 + e^-x is huge either way).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace mk::cpu {

using VF16 = float __attribute__((vector_size(64)));
using VI16 = int32_t __attribute__((vector_size(64)));

namespace vmath_detail {
// The one algorithm: F is float or VF16, I the matching int32 type.
template <class F, class I>
inline F exp_impl(F x) {
  const F hi = x > 88.0f ? F{} + 88.0f : x;  // (a vector compare gives an integer mask; ?: selects)
  const F xc = hi < -87.5f ? F{} - 87.5f : hi;
  const F t = xc * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds to the nearest integer
  const F n = t - 12582912.0f;
  F r = xc - n * 0.693145751953125f;  // ln 2's high part: n * hi is exact for |n| < 2^9
  r = r - n * 1.428606765330187e-06f;
  F p = r * (1.0f / 5040) + (1.0f / 720);
  p = p * r + (1.0f / 120);
  p = p * r + (1.0f / 24);
  p = p * r + (1.0f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  I ni;
  if constexpr (std::is_same_v<F, float>) {
    ni = static_cast<int32_t>(n);
  } else {
    ni = __builtin_convertvector(n, I);
  }
  const I bits = (ni + 127) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof scale);
  F y = p * scale;
  y = x < -87.33654f ? F{} : y;
  y = x > 88.72283f ? F{} + std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;  // NaN
}
}  // namespace vmath_detail

inline float exp_f32(float x) { return vmath_detail::exp_impl<float, int32_t>(x); }
inline VF16 exp_v16(VF16 x) { return vmath_detail::exp_impl<VF16, VI16>(x); }

// y[j] = exp(x[j] - sub) for j < n (x == y allowed).
inline void exp_sub_span(const float* x, float* y, int64_t n, float sub) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    VF16 v;
    std::memcpy(&v, x + j, sizeof v);
    v = exp_v16(v - sub);
    std::memcpy(y + j, &v, sizeof v);
  }
  for (; j < n; ++j) y[j] = exp_f32(x[j] - sub);
}

// SiLU with exp_f32: v / (1 + exp(-v)).
inline float silu_f32(float v) { return v / (1.0f + exp_f32(-v)); }
// t[j] = silu(t[j]) * u[j] for j < n: a SwiGLU's gate and up values.
inline void silu_mul_span(float* t, const float* u, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    VF16 v, w;
    std::memcpy(&v, t + j, sizeof v);
    std::memcpy(&w, u + j, sizeof w);
    v = v / (1.0f + exp_v16(-v)) * w;
    std::memcpy(t + j, &v, sizeof v);
  }
  for (; j < n; ++j) t[j] = silu_f32(t[j]) * u[j];
}

}  // namespace mk::cpu

#pragma GCC pop_options
