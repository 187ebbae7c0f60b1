// Register-blocked tiles of dot_act (quant.h QuantType::gemm_act) for the K-quants (and iq4_xs,
// which has their super-block shape) against q8_K activations: several weight rows x several activation rows per pass over the
// 256-element super-blocks, each weight super-block unpacked once for all activation rows and each
// activation chunk loaded once for all weight rows.
//
// Same bits as dot_act (k_act.h, ggml_vec_dot_qN_K_q8_K's AVX2 arithmetic): per super-block the exact
// int32 lanes sumi[l] (lane l = elements 4l..4l+3 of each 32-element chunk, times the chunk's
// 16-element group scale), then acc[l] = fma(d_x * d_w, float(sumi[l]), acc[l]); q4_K's minimum in 4
// lanes of its own (acc_m = fma(-d_x * dmin, float(mins lanes), acc_m)), q5_K's as one scalar
// chain; ggml's hsum_float_8 and the minimum added at the end. The integer lanes are exact however
// they are formed (no int16 step overflows: weights <= 63, |y| <= 127, maddubs pairs <= 16002, q6_K's
// -32 offset folded in as maddubs(q, y) - maddubs(32, y) <= 24130; iq4_xs's table values |q| <= 127,
// pairs <= 32258), so the variants differ only in
// how they form them:
//   avx2        vpmaddubsw, vpmaddwd with the scales, vpaddd (ggml's sequence), one chunk per register
//   avxvnni     vpmaddubsw, then vpdpwssd (multiply by the scales and add in one) on 256 bits
//   avx512vnni  q4_K, q5_K, q6_K: the packed-pair tiles of k_gemm_pp.h (vpmaddubsw + vpdpwssd on 512
//               bits, both weight rows in one register, 2 x up to 16); q2_K, q3_K, iq4_xs: the
//               256-bit tile with EVEX vpdpwssd.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/gemm_x86.h"
#include "quant/k_act.h"

namespace mk::quant::detail {

enum class KGemmKind { q2_K, q3_K, q4_K, q5_K, q6_K, iq4_xs };

template <KGemmKind K>
struct KGemmLayout {
  static constexpr int kBytes = K == KGemmKind::q2_K   ? 84  // weight block
                                : K == KGemmKind::q3_K ? 110
                                : K == KGemmKind::q4_K ? 144
                                : K == KGemmKind::q5_K ? 176
                                : K == KGemmKind::q6_K ? 210
                                                       : 136;
  static constexpr bool kMin = K == KGemmKind::q4_K || K == KGemmKind::q5_K;  // 6-bit mins (scales_mins_k4)
  static constexpr int kD = K == KGemmKind::q2_K ? 80 : K == KGemmKind::q3_K ? 108 : K == KGemmKind::q6_K ? 208 : 0;
  static constexpr bool kPp = K == KGemmKind::q4_K || K == KGemmKind::q5_K || K == KGemmKind::q6_K;  // k_gemm_pp.h
};

// One weight super-block's scalars: d, dmin (q4_K, q5_K), the mins and the scales as the chunks read them.
struct KHead {
  float d, dmin;
  __m128i mins;       // 8 x i16 (q4_K, q5_K)
  __m256i mins16;     // q2_K: the 16 4-bit mins as i16
  int16_t sc16[16];   // q3_K, iq4_xs: the 16 signed scales (iq4_xs: one per 32, twice)
  __m256i hmask;      // q3_K: the 32 high-bit bytes
  __m256i scx;        // q4_K/q5_K: the 8 scales as i16 in both 128-bit lanes; q6_K: the 16 as i16, even
                      // groups in the low lane, odd in the high (chunk c's pair by one vpshufb: kScPick)
};
// vpshufb indices that broadcast i16 element c of each 128-bit lane to the whole lane.
struct KScPick {
  alignas(32) int8_t idx[8][32];
  constexpr KScPick() : idx{} {
    for (int c = 0; c < 8; ++c)
      for (int b = 0; b < 32; ++b) idx[c][b] = static_cast<int8_t>(2 * c + b % 2);
  }
};
inline constexpr KScPick kScPick{};
template <KGemmKind K>
MK_AVX2_FN inline void k_head(const uint8_t* p, KHead& h) {
  using L = KGemmLayout<K>;
  h.d = ld_f16c(p + L::kD);
  if constexpr (L::kMin) {
    h.dmin = ld_f16c(p + 2);
    uint32_t u[4];
    scales_mins_k4(p + 4, u);
    h.mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 2)));
    h.scx = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u))));
  } else if constexpr (K == KGemmKind::q2_K) {
    h.dmin = ld_f16c(p + 82);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    h.mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0f)));
  } else if constexpr (K == KGemmKind::q3_K) {
    for (int g = 0; g < 16; ++g) h.sc16[g] = static_cast<int16_t>(scale6(p + 96, g));
    h.hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else if constexpr (K == KGemmKind::iq4_xs) {
    for (int g = 0; g < 16; ++g) h.sc16[g] = static_cast<int16_t>(iq4_xs_scale(p, g / 2));
  } else if constexpr (K == KGemmKind::q6_K) {  // [even groups | odd groups] as i16
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
    h.scx = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
  }
}

// Chunk c (elements 32 c .. 32 c + 31) of a weight super-block: its integers as 32 unsigned bytes and
// the scales of its two 16-element groups as 16 x i16 (ggml's maddubs/madd operands).
// q3_K's and iq4_xs's integers are signed (q3_K -4..3, iq4_xs the table's -127..113): the tiles take
// maddubs(|q|, y with q's sign) as ggml's mul_sum_i8_pairs / mul_add_epi8 do.
template <KGemmKind K>
MK_AVX2_FN inline void k_chunk256(const uint8_t* p, const KHead& h, int c, __m256i& q, __m256i& sc) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  if constexpr (K == KGemmKind::q2_K) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (c / 4)));
    q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * (c % 4))), _mm256_set1_epi8(3));
    sc = _mm256_set_m128i(_mm_set1_epi16(p[2 * c + 1] & 0x0f), _mm_set1_epi16(p[2 * c] & 0x0f));
  } else if constexpr (K == KGemmKind::q3_K) {  // q = low bits - 4 where the high bit is clear
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * (c / 4)));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * (c % 4))), _mm256_set1_epi8(3));
    const __m256i clear = _mm256_andnot_si256(_mm256_srl_epi16(h.hmask, _mm_cvtsi32_si128(c)), _mm256_set1_epi8(1));
    q = _mm256_sub_epi8(lo, _mm256_slli_epi16(clear, 2));  // signed, -4..3
    sc = _mm256_set_m128i(_mm_set1_epi16(h.sc16[2 * c + 1]), _mm_set1_epi16(h.sc16[2 * c]));
  } else if constexpr (K == KGemmKind::iq4_xs) {  // signed table values: low nibbles, then high
    const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesIq4nl));
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 + 16 * c));
    const __m128i m4x = _mm_set1_epi8(0x0f);
    q = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4x)),
                         _mm_shuffle_epi8(values, _mm_and_si128(bits, m4x)));
    sc = _mm256_set1_epi16(h.sc16[2 * c]);
  } else if constexpr (K == KGemmKind::q6_K) {
    const int nb = c / 4, g = c % 4;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * nb + 32 * (g % 2)));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * nb));
    const __m256i l4 = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(lo, 4) : lo, m4);
    const __m256i h2 = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    q = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
    sc = _mm256_shuffle_epi8(h.scx, _mm256_load_si256(reinterpret_cast<const __m256i*>(kScPick.idx[c])));
  } else {
    constexpr int kQs = K == KGemmKind::q4_K ? 16 : 48;
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQs + 32 * (c / 2)));
    q = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(bits, 4) : bits, m4);
    if constexpr (K == KGemmKind::q5_K) {  // the 5th bit: bit c of qh[l]
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(c)), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(hi, 4));
    }
    sc = _mm256_shuffle_epi8(h.scx, _mm256_load_si256(reinterpret_cast<const __m256i*>(kScPick.idx[c])));
  }
}

// Per activation row and super-block: d_x and (q4_K, q5_K) the bsums of each 32-element chunk as 8 x i16.
struct KAct {
  float d;
  __m128i bsum2;
  __m256i bs16;  // the 16 bsums
};
MK_AVX2_FN inline void k_act_head(const uint8_t* y, KAct& a) {
  a.d = q8k_d(y);
  a.bs16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + kQ8KBsums));
  a.bsum2 = _mm_hadd_epi16(_mm256_castsi256_si128(a.bs16), _mm256_extracti128_si256(a.bs16, 1));
}

// The float part of one super-block for one (weight row, activation row) pair, as dot_act does it.
template <KGemmKind K>
MK_AVX2_FN inline void k_fold(const KHead& h, const KAct& a, __m256i sumi, __m256& acc, __m128& acc_m, float& summs) {
  if constexpr (K == KGemmKind::q2_K) {  // the mins into the same 8 lanes, before the scales' part
    acc = _mm256_fmadd_ps(_mm256_set1_ps(-a.d * h.dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(h.mins16, a.bs16)), acc);
  } else if constexpr (K == KGemmKind::q4_K) {
    acc_m = _mm_fmadd_ps(_mm_set1_ps(-a.d * h.dmin), _mm_cvtepi32_ps(_mm_madd_epi16(h.mins, a.bsum2)), acc_m);
  } else if constexpr (K == KGemmKind::q5_K) {
    __m128i v = _mm_madd_epi16(h.mins, a.bsum2);
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    summs = std::fma(-a.d * h.dmin, static_cast<float>(_mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 1)))),
                     summs);
  }
  acc = _mm256_fmadd_ps(_mm256_set1_ps(a.d * h.d), _mm256_cvtepi32_ps(sumi), acc);
}
template <KGemmKind K>
MK_AVX2_FN inline float k_finish(__m256 acc, __m128 acc_m, float summs) {
  if constexpr (K == KGemmKind::q4_K) {
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    return hsum_float_8(acc) + _mm_cvtss_f32(acc_m);
  } else if constexpr (K == KGemmKind::q5_K) {
    return hsum_float_8(acc) + summs;
  } else {
    return hsum_float_8(acc);
  }
}

// ---- 256-bit tiles (AVX2 or AVX-VNNI): NW weight rows x NA activation rows. One body built under two
// target attributes, as MK_GEMM_TILE256 (the AVX2 build must not be allowed VNNI instructions).
#define MK_KGEMM_TILE256(FN, ATTR, dpwssd)                                                                     \
  template <KGemmKind K, int NW, int NA>                                                                      \
  ATTR inline void FN(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* out) {             \
    using L = KGemmLayout<K>;                                                                                 \
    __m256 acc[NW][NA];                                                                                       \
    __m128 acc_m[NW][NA];                                                                                     \
    float summs[NW][NA];                                                                                      \
    for (int i = 0; i < NW; ++i)                                                                              \
      for (int a = 0; a < NA; ++a) {                                                                          \
        acc[i][a] = _mm256_setzero_ps();                                                                      \
        acc_m[i][a] = _mm_setzero_ps();                                                                       \
        summs[i][a] = 0;                                                                                      \
      }                                                                                                       \
    for (int64_t b = 0; b < nb; ++b) {                                                                        \
      KHead h[NW];                                                                                            \
      for (int i = 0; i < NW; ++i) k_head<K>(w[i] + b * L::kBytes, h[i]);                                     \
      __m256i sumi[NW][NA];                                                                                   \
      for (int i = 0; i < NW; ++i)                                                                            \
        for (int a = 0; a < NA; ++a) sumi[i][a] = _mm256_setzero_si256();                                     \
      _Pragma("GCC unroll 8") for (int c = 0; c < 8; ++c) {                                                   \
        __m256i q[NW], sc[NW];                                                                                \
        for (int i = 0; i < NW; ++i) k_chunk256<K>(w[i] + b * L::kBytes, h[i], c, q[i], sc[i]);               \
        for (int a = 0; a < NA; ++a) {                                                                        \
          const __m256i qy =                                                                                  \
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[a] + b * kQ8KBytes + kQ8KQs + 32 * c));   \
          __m256i off = _mm256_setzero_si256();                                                               \
          if constexpr (K == KGemmKind::q6_K) off = _mm256_maddubs_epi16(_mm256_set1_epi8(32), qy);           \
          for (int i = 0; i < NW; ++i) {                                                                      \
            __m256i p16;                                                                                      \
            if constexpr (K == KGemmKind::q3_K || K == KGemmKind::iq4_xs) /* signed: |q| x y with q's sign */ \
              p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q[i], q[i]), _mm256_sign_epi8(qy, q[i]));           \
            else                                                                                              \
              p16 = _mm256_maddubs_epi16(q[i], qy);                                                           \
            if constexpr (K == KGemmKind::q6_K) p16 = _mm256_sub_epi16(p16, off);                             \
            sumi[i][a] = dpwssd(sumi[i][a], sc[i], p16);                                                      \
            /* keeps the chain in order: reassociated, the 64 products of a super-block were all kept */      \
            /* live and spilled (the integer sum is the same either way) */                                   \
            __asm__("" : "+x"(sumi[i][a]));                                                                   \
          }                                                                                                   \
        }                                                                                                     \
      }                                                                                                       \
      for (int a = 0; a < NA; ++a) {                                                                          \
        KAct ya;                                                                                              \
        k_act_head(y[a] + b * kQ8KBytes, ya);                                                                 \
        for (int i = 0; i < NW; ++i) k_fold<K>(h[i], ya, sumi[i][a], acc[i][a], acc_m[i][a], summs[i][a]);    \
      }                                                                                                       \
    }                                                                                                         \
    for (int i = 0; i < NW; ++i)                                                                              \
      for (int a = 0; a < NA; ++a) out[i * NA + a] = k_finish<K>(acc[i][a], acc_m[i][a], summs[i][a]);        \
  }

// acc + the int32 lanes of madd(s, p) (pairs of i16 products), exact.
MK_AVX2_FN inline __m256i dpwssd256_avx2(__m256i acc, __m256i s, __m256i p) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(s, p));
}
MK_AVXVNNI_FN inline __m256i dpwssd256_avxvnni(__m256i acc, __m256i s, __m256i p) {
  return _mm256_dpwssd_avx_epi32(acc, s, p);
}
MK_KGEMM_TILE256(kgemm_tile256_avx2, MK_AVX2_FN, dpwssd256_avx2)
MK_AVX512VNNI_FN inline __m256i dpwssd256_avx512vnni(__m256i acc, __m256i s, __m256i p) {
  return _mm256_dpwssd_epi32(acc, s, p);
}
MK_KGEMM_TILE256(kgemm_tile256_avxvnni, MK_AVXVNNI_FN, dpwssd256_avxvnni)
MK_KGEMM_TILE256(kgemm_tile256_avx512vnni, MK_AVX512VNNI_FN, dpwssd256_avx512vnni)  // q2_K, q3_K

template <KGemmKind K, int NA>
MK_AVX512VNNI_FN void kgemm_tile256_512_na(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* out) {
  kgemm_tile256_avx512vnni<K, 2, NA>(w, y, nb, out);
}
template <KGemmKind K>
void kgemm_pp_rows(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t x_stride, int64_t na, int64_t n,
                   float* out, int64_t ldo);  // k_gemm_pp.h
// q4_K, q5_K, q6_K: the packed-pair tiles (k_gemm_pp.h, 2 x up to 16; gemm_act sends one activation
// row to dot_act instead, MK_QUANT_GEMM_ACT_K); q2_K, q3_K: the 256-bit tile built for AVX-512 VNNI
// (EVEX vpdpwssd), 2 x 4.
template <KGemmKind K>
void kgemm_rows512(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t x_stride, int64_t na, int64_t n,
                   float* out, int64_t ldo) {
  if constexpr (KGemmLayout<K>::kPp)
    kgemm_pp_rows<K>(w, w_stride, nw, xq, x_stride, na, n, out, ldo);
  else
    gemm_rows<2, 256, kgemm_tile256_512_na<K, 1>, kgemm_tile256_512_na<K, 2>, kgemm_tile256_512_na<K, 3>,
              kgemm_tile256_512_na<K, 4>>(w, w_stride, nw, xq, x_stride, na, n, out, ldo);
}

}  // namespace mk::quant::detail


// Defines NAME_avx2, NAME_avxvnni, NAME_avx512vnni (gemm_act variants for K-quant kind KIND: 2 weight
// rows x up to 4 activation rows per tile; with AVX-512 VNNI up to 16 in q4_K/q5_K/q6_K's packed-pair
// tiles) and NAME_generic (dot_act per pair through DOT_ACT_GENERIC), plus NAME, which picks one once.
// One activation row (decode) goes to DOT_ACT_AVX2 per weight row in every variant (the same bits:
// every variant gives dot_act's): it measured faster than a one-column tile (BM_QuantGemm at 1 row),
// and where a tile looked faster in that benchmark (q6_K's former 512-bit 2 x 1 tile, weights in L2)
// it was 2.2x slower in whole-model decode, weights streamed from memory (docs/PERFORMANCE.md,
// 2026-12-02).
#define MK_QUANT_GEMM_ACT_K(NAME, KIND, DOT_ACT_GENERIC, DOT_ACT_AVX2)                                        \
  template <int NA>                                                                                           \
  MK_AVX2_FN void NAME##_t_avx2(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* o) {     \
    ::mk::quant::detail::kgemm_tile256_avx2<KIND, 2, NA>(w, y, nb, o);                                      \
  }                                                                                                           \
  template <int NA>                                                                                           \
  MK_AVXVNNI_FN void NAME##_t_avxvnni(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* o) { \
    ::mk::quant::detail::kgemm_tile256_avxvnni<KIND, 2, NA>(w, y, nb, o);                                       \
  }                                                                                                           \
  MK_QUANT_GEMM_ROWS(NAME##_tiles_avx2, 2, 256, NAME##_t_avx2)                                                \
  MK_QUANT_GEMM_ROWS(NAME##_tiles_avxvnni, 2, 256, NAME##_t_avxvnni)                                          \
  void NAME##_one_row(const void* w, size_t ws, int64_t nw, const void* x, int64_t n, float* out) {           \
    const uint8_t* wb = static_cast<const uint8_t*>(w);                                                      \
    for (int64_t i = 0; i < nw; ++i) {                                                                        \
      ::mk::quant::detail::prefetch_bytes(wb + (i + 4) * ws, ws); /* 4 rows ahead: see prefetch_bytes */     \
      out[i] = DOT_ACT_AVX2(wb + i * ws, x, n);                                                               \
    }                                                                                                         \
  }                                                                                                           \
  void NAME##_avx2(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,     \
                   float* out, int64_t ldo) {                                                                 \
    if (na == 1) return NAME##_one_row(w, ws, nw, x, n, out);                                                 \
    NAME##_tiles_avx2(w, ws, nw, x, xs, na, n, out, ldo);                                                     \
  }                                                                                                           \
  void NAME##_avxvnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,  \
                      float* out, int64_t ldo) {                                                              \
    if (na == 1) return NAME##_one_row(w, ws, nw, x, n, out);                                                 \
    NAME##_tiles_avxvnni(w, ws, nw, x, xs, na, n, out, ldo);                                                  \
  }                                                                                                           \
  void NAME##_avx512vnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na,          \
                         int64_t n, float* out, int64_t ldo) {                                                \
    if (na == 1) return NAME##_one_row(w, ws, nw, x, n, out);                                                 \
    ::mk::quant::detail::kgemm_rows512<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                            \
  }                                                                                                           \
  MK_QUANT_GEMM_GENERIC_AND_PICK(NAME, DOT_ACT_GENERIC, NAME##_avx512vnni)

// dot_act4 of quant.h for K-quant kind KIND: the AVX2 tile with one weight row and four activation
// rows (each weight chunk unpacked once), or four DOT_ACT calls where the CPU has no AVX2.
#define MK_QUANT_DOT_ACT4_K(NAME, KIND, DOT_ACT)                                                               \
  MK_AVX2_FN void NAME##_tile_avx2(const void* w, const void* const* x, int64_t n, float* out) {               \
    const uint8_t* wr[1] = {static_cast<const uint8_t*>(w)};                                                  \
    const uint8_t* yr[4] = {static_cast<const uint8_t*>(x[0]), static_cast<const uint8_t*>(x[1]),             \
                            static_cast<const uint8_t*>(x[2]), static_cast<const uint8_t*>(x[3])};            \
    ::mk::quant::detail::kgemm_tile256_avx2<KIND, 1, 4>(wr, yr, n / 256, out);                               \
  }                                                                                                           \
  MK_QUANT_DOT_ACT4_HAND_AVX2(NAME, DOT_ACT, NAME##_tile_avx2)

#include "quant/k_gemm_pp.h"  // kgemm_pp_rows, which kgemm_rows512 hands prefill to
