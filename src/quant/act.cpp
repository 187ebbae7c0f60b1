// 8-bit activation blocks (quant.h ActQuant): q8_0 and q8_1 as ggml's x86 quantize_row_q8_0 /
// quantize_row_q8_1 (arch/x86/quants.c, AVX2 path) compute them, q8_K as quantize_row_q8_K_ref
// (ggml-quants.c; the x86 quantize_row_q8_K calls it).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/avx2.h"
#include "quant/k_act.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;

// One 32-element block: d = amax / 127 (f16), q = nearest-even(x * (127 / amax)); with S, also
// s = d * sum(q) (f16, d before its rounding to f16).
template <bool S>
void quantize_q8(const float* x, void* dst, int64_t n) {
  constexpr int kBytes = S ? 36 : 34, kQs = S ? 4 : 2;
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32, b += kBytes) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    st_f16(b, d);
    int32_t sum = 0;
    int8_t* q = reinterpret_cast<int8_t*>(b + kQs);
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(x[j] * id));  // default rounding: to nearest even
      q[j] = static_cast<int8_t>(v);
      sum += v;
    }
    if constexpr (S) st_f16(b + 2, d * static_cast<float>(sum));
  }
}

// The same with AVX2 (ggml's x86 code): the same bits, max/multiply/round are exact lane operations.
template <bool S>
MK_AVX2_FN void quantize_q8_avx2(const float* x, void* dst, int64_t n) {
  constexpr int kBytes = S ? 36 : 34, kQs = S ? 4 : 2;
  uint8_t* b = static_cast<uint8_t*>(dst);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / 32; ++i, x += 32, b += kBytes) {
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    st_f16(b, d);
    const __m256 mul = _mm256_set1_ps(id);
    const auto q = [&](__m256 v) {
      return _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    };
    __m256i i0 = q(v0), i1 = q(v1), i2 = q(v2), i3 = q(v3);
    if constexpr (S) {
      const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
      st_f16(b + 2, d * static_cast<float>(_mm_cvtsi128_si32(s4)));
    }
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + kQs), i0);
  }
}

// The same with AVX-512, 16 blocks at a time: their maxima of |x| into one register, so that d and
// 1 / d take one division each for all 16; per block two 16-lane multiplies, conversions (round to
// nearest even) and saturating narrowings, and the sum for q8_1. The same bits (the maxima, the
// divisions, the products and the integer sums are exact lane operations); the last nb % 16 blocks
// go through quantize_q8_avx2.
template <bool S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) void quantize_q8_avx512(const float* x,
                                                                                                   void* dst, int64_t n) {
  constexpr int kBytes = S ? 36 : 34, kQs = S ? 4 : 2;
  uint8_t* b = static_cast<uint8_t*>(dst);
  const int64_t nb = n / 32;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 16 <= nb; i += 16, x += 16 * 32) {
    alignas(64) float amax[16], dv[16], idv[16];
    for (int j = 0; j < 16; ++j)
      amax[j] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + 32 * j)),
                                                   _mm512_andnot_ps(sign, _mm512_loadu_ps(x + 32 * j + 16))));
    const __m512 am = _mm512_load_ps(amax), k127 = _mm512_set1_ps(127.f);
    _mm512_store_ps(dv, _mm512_div_ps(am, k127));
    // amax != 0 (NaN included, as the scalar test): 127 / amax, else 0
    _mm512_store_ps(idv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(am, _mm512_setzero_ps(), _CMP_NEQ_UQ), k127, am));
    for (int j = 0; j < 16; ++j, b += kBytes) {
      const __m512 mul = _mm512_set1_ps(idv[j]);
      constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j), mul), kRound);
      const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16), mul), kRound);
      st_f16(b, dv[j]);
      if constexpr (S) st_f16(b + 2, dv[j] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b + kQs), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b + kQs + 16), _mm512_cvtsepi32_epi8(q1));
    }
  }
  if (i < nb) quantize_q8_avx2<S>(x, b, (nb - i) * 32);
}

// One 256-element q8_K block (k_act.h layout): max = the element of largest magnitude (the first
// one on ties), iscale = -127 / max, q = min(127, nearest-even(iscale * x)), bsums of 16, d = 1 /
// iscale as f32. A zero block stores d = 0 and zeros (ggml leaves its bsums unset; they are unread).
void quantize_q8_K(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256, b += kQ8KBytes) {
    float amax = 0;  // written as a max, then a search, so that it vectorises
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[j]));
    int first = 0;
    while (first < 255 && !(std::fabs(x[first]) == amax)) ++first;
    const float max = x[first];
    int8_t* q = reinterpret_cast<int8_t*>(b + kQ8KQs);
    int16_t bsums[16] = {};
    float d = 0;
    if (amax != 0) {
      const float iscale = -127.f / max;
      for (int j = 0; j < 256; ++j) {
        // ggml's nearest_int: adding 1.5 * 2^23 rounds to nearest even (|iscale * x| <= 127 here).
        float v = iscale * x[j] + 12582912.f;
        int32_t i;
        std::memcpy(&i, &v, 4);
        q[j] = static_cast<int8_t>(std::min(127, (i & 0x007fffff) - 0x00400000));
      }
      for (int j = 0; j < 16; ++j) {
        int sum = 0;
        for (int k = 0; k < 16; ++k) sum += q[16 * j + k];
        bsums[j] = static_cast<int16_t>(sum);
      }
      d = 1 / iscale;
    } else {
      std::memset(q, 0, 256);
    }
    std::memcpy(b, &d, 4);
    std::memcpy(b + kQ8KBsums, bsums, 32);
  }
}

// The same with AVX2: max of |x|, the first element of that magnitude, then the same multiply and
// round-to-nearest-even (for |v| <= 127 the magic-number trick and the rounding instruction agree;
// packing saturates 128 to 127 as min(127, .) does). The same bytes (QuantActK tests).
MK_AVX2_FN void quantize_q8_K_avx2(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / 256; ++i, x += 256, b += kQ8KBytes) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    int8_t* q = reinterpret_cast<int8_t*>(b + kQ8KQs);
    int16_t bsums[16] = {};
    float d = 0;
    if (amax != 0) {
      int first = 0;
      const __m256 va = _mm256_set1_ps(amax);
      for (int j = 0; j < 256; j += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
        if (mask) {
          first = j + __builtin_ctz(static_cast<unsigned>(mask));
          break;
        }
      }
      const float iscale = -127.f / x[first];
      const __m256 mul = _mm256_set1_ps(iscale);
      const auto qv = [&](const float* p) {
        return _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(p), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      };
      const auto hsum = [](__m256i v) {
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
      };
      for (int j = 0; j < 256; j += 32) {
        __m256i i0 = qv(x + j), i1 = qv(x + j + 8), i2 = qv(x + j + 16), i3 = qv(x + j + 24);
        const __m256i k127 = _mm256_set1_epi32(127);
        i0 = _mm256_min_epi32(i0, k127), i1 = _mm256_min_epi32(i1, k127);
        i2 = _mm256_min_epi32(i2, k127), i3 = _mm256_min_epi32(i3, k127);
        bsums[j / 16] = static_cast<int16_t>(hsum(_mm256_add_epi32(i0, i1)));
        bsums[j / 16 + 1] = static_cast<int16_t>(hsum(_mm256_add_epi32(i2, i3)));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), p);
      }
      d = 1 / iscale;
    } else {
      std::memset(q, 0, 256);
    }
    std::memcpy(b, &d, 4);
    std::memcpy(b + kQ8KBsums, bsums, 32);
  }
}

void quantize_q8_K_any(const float* x, void* dst, int64_t n) {
  static const bool avx2 = runtime_isa() != Isa::generic;
  if (avx2) return quantize_q8_K_avx2(x, dst, n);
  quantize_q8_K(x, dst, n);
}

template <bool S>
void quantize_q8_any(const float* x, void* dst, int64_t n) {
  static const Isa isa = runtime_isa();
  if (isa == Isa::avx512) return quantize_q8_avx512<S>(x, dst, n);
  if (isa != Isa::generic) return quantize_q8_avx2<S>(x, dst, n);
  quantize_q8<S>(x, dst, n);
}
}  // namespace

extern const ActQuant kQ8_0Act = {"q8_0", 32, 34, quantize_q8_any<false>};
extern const ActQuant kQ8_1Act = {"q8_1", 32, 36, quantize_q8_any<true>};
extern const ActQuant kQ8_KAct = {"q8_K", 256, kQ8KBytes, quantize_q8_K_any};

namespace detail {
// For tests: the scalar quantizer (ActQuant::quantize_row picks AVX2 where the CPU has it).
void act_quantize_q8_K_generic(const float* x, void* dst, int64_t n) { quantize_q8_K(x, dst, n); }
void act_quantize_generic(bool q8_1, const float* x, void* dst, int64_t n) {
  if (q8_1) quantize_q8<true>(x, dst, n);
  else quantize_q8<false>(x, dst, n);
}
}  // namespace detail

const ActQuant& act_q8_0() { return kQ8_0Act; }
const ActQuant& act_q8_1() { return kQ8_1Act; }
const ActQuant& act_q8_K() { return kQ8_KAct; }
}  // namespace mk::quant
