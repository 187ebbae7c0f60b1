// Internals shared by the per-type files: little-endian field reads, the 16-lane dot over
// dequantized blocks (instantiated per instruction set), scale checks and quantizer helpers.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#if defined(__F16C__)
// GCC 12's intrinsic headers trip -Wmaybe-uninitialized where inlined (as in avx2.h)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "quant/quant.h"

namespace mk::quant {
extern const ActQuant kQ8_0Act, kQ8_1Act, kQ8_KAct;  // act.cpp
}

namespace mk::quant::detail {

inline uint16_t ld_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t ld_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// IEEE half to float, exact for every input (subnormals, inf, NaN): the bit manipulation of ggml's
// fp16 fallback (after Maratyszcza's FP16 library), branch-free and inlinable, unlike
// mk::f16_to_f32 (a call with ldexp, which cost as much as the rest of a small block's dot).
inline float f16_to_f32_fast(uint16_t h) {
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto to_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  const float denormalized = from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result = sign | (two_w < (1u << 27) ? to_bits(denormalized) : to_bits(normalized));
  return from_bits(result);
}
inline float ld_f16(const uint8_t* p) { return f16_to_f32_fast(ld_u16(p)); }
inline void st_f16(uint8_t* p, float v) {
#if defined(__F16C__)
  // vcvtps2ph rounds to nearest even as f32_to_f16 does: the same bits for every value but NaN
  // (where it keeps the payload; f32_to_f16 gives sign | 0x7e00), and no call (the activation
  // quantizers store two of these per block: 1.8% of a 16-row SmolLM2 step)
  uint16_t h = v == v ? static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)) : f32_to_f16(v);
#else
  uint16_t h = f32_to_f16(v);
#endif
  std::memcpy(p, &h, 2);
}

// First block (of n_blocks, `bytes` apart) with a NaN/inf f16 at one of `offsets`, or -1.
inline int64_t first_bad_f16(const void* src, int64_t n_blocks, int64_t bytes, std::initializer_list<int> offsets) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n_blocks; ++b, p += bytes)
    for (int o : offsets)
      if ((ld_u16(p + o) & 0x7c00) == 0x7c00) return b;
  return -1;
}

// The 16-lane dot of quant.h over blocks dequantized by DEQ(block, out[QK]).
template <int QK, int BYTES, void (*DEQ)(const uint8_t*, float*)>
[[gnu::always_inline]] inline float dot_blocks(const void* w, const float* __restrict x, int64_t n) {
  static_assert(QK % 16 == 0);
  const uint8_t* p = static_cast<const uint8_t*>(w);
  float acc[16] = {};
  alignas(64) float buf[QK];
  for (int64_t b = 0; b < n / QK; ++b, p += BYTES, x += QK) {
    DEQ(p, buf);
    for (int j = 0; j < QK; j += 16)
      for (int l = 0; l < 16; ++l) acc[l] += x[j + l] * buf[j + l];
  }
  for (int s = 8; s > 0; s /= 2)
    for (int l = 0; l < s; ++l) acc[l] += acc[l + s];
  return acc[0];
}

using Isa = DotIsa;
Isa runtime_isa();  // quant.cpp: from __builtin_cpu_supports
// act.cpp: the scalar q8_0 / q8_1 activation quantizer (tests compare it with the AVX2 one).
void act_quantize_generic(bool q8_1, const float* x, void* dst, int64_t n);
void act_quantize_q8_K_generic(const float* x, void* dst, int64_t n);  // the scalar q8_K quantizer

// Defines NAME_generic, NAME_avx2, NAME_avx512 (builds of dot_blocks for the build target and with
// target attributes) and `float NAME(const void*, const float*, int64_t)`, which picks one once.
// All give the same bits: the same per-lane operations in the same order, no contraction (these
// files use -ffp-contract=off). MK_QUANT_DOT_HAND_AVX2 instead takes a hand-written AVX2 function
// (avx2.h), used on AVX2 and AVX-512 machines alike.
#define MK_QUANT_DOT_VARIANTS(NAME, QK, BYTES, DEQ)                                                      \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,bmi2"))) float NAME##_avx512(                \
      const void* w, const float* x, int64_t n) {                                                        \
    return ::mk::quant::detail::dot_blocks<QK, BYTES, DEQ>(w, x, n);                                     \
  }                                                                                                      \
  float NAME##_generic(const void* w, const float* x, int64_t n) {                                       \
    return ::mk::quant::detail::dot_blocks<QK, BYTES, DEQ>(w, x, n);                                     \
  }

#define MK_QUANT_DOT(NAME, QK, BYTES, DEQ)                                                               \
  MK_QUANT_DOT_VARIANTS(NAME, QK, BYTES, DEQ)                                                            \
  __attribute__((target("avx2,fma,bmi2"))) float NAME##_avx2(const void* w, const float* x, int64_t n) { \
    return ::mk::quant::detail::dot_blocks<QK, BYTES, DEQ>(w, x, n);                                     \
  }                                                                                                      \
  float NAME(const void* w, const float* x, int64_t n) {                                                 \
    static const ::mk::quant::detail::Isa isa = ::mk::quant::detail::runtime_isa();                      \
    if (isa == ::mk::quant::detail::Isa::avx512) return NAME##_avx512(w, x, n);                          \
    if (isa == ::mk::quant::detail::Isa::avx2) return NAME##_avx2(w, x, n);                              \
    return NAME##_generic(w, x, n);                                                                      \
  }

#define MK_QUANT_DOT_HAND_AVX2(NAME, QK, BYTES, DEQ, AVX2_FN)                                            \
  MK_QUANT_DOT_VARIANTS(NAME, QK, BYTES, DEQ)                                                            \
  float NAME##_avx2(const void* w, const float* x, int64_t n) { return AVX2_FN(w, x, n); }               \
  float NAME(const void* w, const float* x, int64_t n) {                                                 \
    static const ::mk::quant::detail::Isa isa = ::mk::quant::detail::runtime_isa();                      \
    if (isa != ::mk::quant::detail::Isa::generic) return AVX2_FN(w, x, n);                               \
    return NAME##_generic(w, x, n);                                                                      \
  }

// ggml's hsum_float_8: lanes (l, l + 4), then (l, l + 2), then (0, 1).
inline float hsum8(const float* a) {
  const float t0 = a[4] + a[0], t1 = a[5] + a[1], t2 = a[6] + a[2], t3 = a[7] + a[3];
  return (t0 + t2) + (t1 + t3);
}

// The dot_act of quant.h over 32-element blocks of BYTES bytes that UNPACK turns into 32 signed
// integers q, the scale d and (MIN) the minimum m (value d * q + m), against q8_0 (MIN = false) or
// q8_1 (MIN = true) activation blocks.
template <int BYTES, void (*UNPACK)(const uint8_t*, int8_t*, float*, float*), bool MIN>
[[gnu::always_inline]] inline float dot_act_blocks(const void* w, const void* xq, int64_t n) {
  constexpr int kXBytes = MIN ? 36 : 34, kXQs = MIN ? 4 : 2;
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {};
  float summs = 0;
  for (int64_t b = 0; b < n / 32; ++b, p += BYTES, y += kXBytes) {
    alignas(32) int8_t q[32];
    float d, m = 0;
    UNPACK(p, q, &d, &m);
    const float dd = d * ld_f16(y);
    if constexpr (MIN) summs = std::fma(m, ld_f16(y + 2), summs);
    const int8_t* qy = reinterpret_cast<const int8_t*>(y + kXQs);
    for (int l = 0; l < 8; ++l) {
      int32_t s = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) s += static_cast<int32_t>(q[e]) * static_cast<int32_t>(qy[e]);
      acc[l] = std::fma(dd, static_cast<float>(s), acc[l]);
    }
  }
  return hsum8(acc) + summs;
}

// The block-integer dot_act (q4_1, quant.h): per block the exact int32 dot of the 32 weight integers
// with the 32 activation bytes, then acc = fma(d_w * d_x, float(isum), acc) and (MIN)
// summs = fma(m_w, s_x, summs) in block order; acc + summs. No lanes: any way of forming the
// integer sums gives these bits (blockint_x86.h does it 8 or 16 weight rows at a time).
template <int BYTES, void (*UNPACK)(const uint8_t*, int8_t*, float*, float*), bool MIN>
[[gnu::always_inline]] inline float dot_act_blocks_int(const void* w, const void* xq, int64_t n) {
  constexpr int kXBytes = MIN ? 36 : 34, kXQs = MIN ? 4 : 2;
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc = 0, summs = 0;
  for (int64_t b = 0; b < n / 32; ++b, p += BYTES, y += kXBytes) {
    alignas(32) int8_t q[32];
    float d, m = 0;
    UNPACK(p, q, &d, &m);
    const int8_t* qy = reinterpret_cast<const int8_t*>(y + kXQs);
    int32_t s = 0;
    for (int e = 0; e < 32; ++e) s += static_cast<int32_t>(q[e]) * static_cast<int32_t>(qy[e]);
    acc = std::fma(d * ld_f16(y), static_cast<float>(s), acc);
    if constexpr (MIN) summs = std::fma(m, ld_f16(y + 2), summs);
  }
  return MIN ? acc + summs : acc;
}

// The variant/dispatch glue of every dot_act (the 32-element types and the K-quants alike):
// NAME_generic / NAME_avx2 / NAME_avx512, builds of SPEC (an always_inline function (w, xq, n) ->
// float; a template-id goes in parentheses) for the build target and under target attributes, and
// NAME, which picks one once (runtime_isa). With HAND, NAME_avx2 and NAME_avx512 are the hand-written
// AVX2 kernel AVX2_FN (avx2.h, k_act.h), used on AVX2 and AVX-512 machines alike; NAME_generic stays
// the spec. All give the same bits (QuantAct.* / QuantActK.* tests).
#define MK_QUANT_DOT_ACT_SPEC(NAME, SPEC)                                                                    \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,bmi2"))) float NAME##_avx512(                     \
      const void* w, const void* x, int64_t n) {                                                              \
    return SPEC(w, x, n);                                                                                     \
  }                                                                                                           \
  __attribute__((target("avx2,fma,bmi2"))) float NAME##_avx2(const void* w, const void* x, int64_t n) {       \
    return SPEC(w, x, n);                                                                                     \
  }                                                                                                           \
  float NAME##_generic(const void* w, const void* x, int64_t n) { return SPEC(w, x, n); }                     \
  float NAME(const void* w, const void* x, int64_t n) {                                                       \
    static const ::mk::quant::detail::Isa isa = ::mk::quant::detail::runtime_isa();                           \
    if (isa == ::mk::quant::detail::Isa::avx512) return NAME##_avx512(w, x, n);                               \
    if (isa == ::mk::quant::detail::Isa::avx2) return NAME##_avx2(w, x, n);                                   \
    return NAME##_generic(w, x, n);                                                                           \
  }
#define MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(NAME, SPEC, AVX2_FN)                                                 \
  float NAME##_avx512(const void* w, const void* x, int64_t n) { return AVX2_FN(w, x, n); }                  \
  float NAME##_avx2(const void* w, const void* x, int64_t n) { return AVX2_FN(w, x, n); }                    \
  float NAME##_generic(const void* w, const void* x, int64_t n) { return SPEC(w, x, n); }                    \
  float NAME(const void* w, const void* x, int64_t n) {                                                       \
    static const ::mk::quant::detail::Isa isa = ::mk::quant::detail::runtime_isa();                           \
    if (isa != ::mk::quant::detail::Isa::generic) return AVX2_FN(w, x, n);                                    \
    return NAME##_generic(w, x, n);                                                                           \
  }

// The 32-element types: the spec is dot_act_blocks over UNPACK.
#define MK_QUANT_DOT_ACT(NAME, BYTES, UNPACK, MIN) \
  MK_QUANT_DOT_ACT_SPEC(NAME, (::mk::quant::detail::dot_act_blocks<BYTES, UNPACK, MIN>))

// dot_act4 from a hand-written AVX2 four-row kernel, or four calls of NAME where the CPU has no AVX2.
#define MK_QUANT_DOT_ACT4_HAND_AVX2(NAME, DOT_ACT, AVX2_FN)                                                   \
  void NAME(const void* w, const void* const* x, int64_t n, float* out) {                                      \
    static const ::mk::quant::detail::Isa isa = ::mk::quant::detail::runtime_isa();                             \
    if (isa != ::mk::quant::detail::Isa::generic) return AVX2_FN(w, x, n, out);                                 \
    for (int r = 0; r < 4; ++r) out[r] = DOT_ACT(w, x[r], n);                                                   \
  }

// Row loop over blocks for dequantize_row.
template <int QK, int BYTES, void (*DEQ)(const uint8_t*, float*)>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / QK; ++b) DEQ(p + b * BYTES, dst + b * QK);
}

// ggml's nearest_int: round half away from zero is not what it does; it rounds to nearest even via
// the 1.5 * 2^23 trick. Used by the K-quant quantizers.
inline int nearest_int(float f) { return static_cast<int>(std::lrintf(f)); }
// The first element of largest magnitude (0 for an all-zero block): the scale's sign and size in
// ggml's quantize_row_q4_0_ref / q5_0_ref / iq4_nl's start.
inline float max_by_magnitude(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}
// ggml-common.h kvalues_iq4nl: the 16 values a 4-bit index of iq4_nl and iq4_xs stands for.
inline constexpr int8_t kValuesIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// The kValuesIq4nl index nearest to v (ties to the lower index): the iq4 quantizers' rounding.
inline int nearest_iq4nl_index(float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i)
    if (std::fabs(v - static_cast<float>(kValuesIq4nl[i])) < std::fabs(v - static_cast<float>(kValuesIq4nl[best]))) best = i;
  return best;
}
inline float amax(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

}  // namespace mk::quant::detail
