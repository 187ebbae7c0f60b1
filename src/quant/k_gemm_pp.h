// Packed-pair tiles of dot_act (quant.h QuantType::gemm_act) for q4_K, q5_K and q6_K weights against
// q8_K activations, AVX-512 VNNI (+BW): the prefill matmul (two or more activation rows; kgemm_rows512
// of k_gemm_x86.h hands them here).
//
// Tile: 2 weight rows x up to kPpMaxRows (16) activation rows. Each 512-bit register holds the same
// 32-element chunk of both weight rows (low 256 bits row i, high 256 bits row i + 1); one super-block
// (256 elements) of the pair is unpacked once into 8 chunk registers and 8 scale registers and then
// reused for every activation row of the tile, whose 32-byte q8_K chunks are broadcast to both
// halves. Per (activation row, chunk): one broadcast load, vpmaddubsw (u8 x s8 -> s16 pairs) and
// vpdpwssd with the two 16-element groups' scales; the int32 lanes come out as [row i's 8 lanes |
// row i + 1's 8 lanes], exactly the lanes dot_act forms (k_act.h: lane l = elements 4l..4l+3 of each
// chunk times its group's scale), so the float part folds both rows in one 512-bit fma without
// shuffles. The weight side (unpack, scales, q6_K's correction) costs once per 2 x 16 dots instead of
// once per dot, and what only depends on the activations (d_x, q4_K/q5_K's bsum pairs, q6_K's
// flipped bytes) is prepared once per call for all weight rows (measured in docs/PERFORMANCE.md).
//
// Same bits as dot_act (k_act.h, ggml_vec_dot_qN_K_q8_K's AVX2 arithmetic): the int32 lanes are exact
// however they are formed, and per super-block each lane does dot_act's float operations in its order:
// acc = fma(d_x * d_w, float(sumi), acc); q4_K's mins acc_m = fma(-d_x * dmin, float(mins lanes),
// acc_m) in 4 lanes per row, q5_K's summs = fma(-d_x * dmin, float(sum of the mins lanes), summs)
// (held in all 4 lanes of its row), both computed as d_x * -dmin, the same value (negation is exact);
// then hsum_float_8 and the minimum (k_finish). No int16 step overflows:
//   q4_K  maddubs(nibble 0..15, y -127..127): pairs <= 2 * 15 * 127 = 3810 (q5_K: 0..31, 7874).
//   q6_K  the weights go in signed (q - 32, -32..31) and the activations unsigned (y + 128, 1..255,
//         by flipping the top bit), as llama.cpp's VNNI/AVX-512 paths treat signed x signed bytes;
//         pairs <= 2 * 255 * 32 = 16320. The extra 128 * sc * pairsum(q - 32) is the same for every
//         activation row: computed once per super-block pair and used as the lanes' start value
//         (negated), so the sums equal sc * (q - 32) . y exactly.
// Source: the ggml type table (ggml-common.h block_q4_K / block_q5_K / block_q6_K / block_q8_K) and
// the idea of llama.cpp's repacked x86 kernels (several rows interleaved per register, activations
// broadcast), written here from the layouts, not copied.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/k_gemm_x86.h"

namespace mk::quant::detail {

// Activation rows per tile: 16 rows of q8_K for a 768-wide matmul (3 super-blocks) are 14 KiB, in L1
// with the weight pair. The 16 chunk/scale registers stay in registers for the whole super-block; an
// activation row needs two integer accumulators while it runs (its float accumulators are in memory).
// 8, 24 and 32 measured the same within the noise of a loaded 2-core VM (2026-12-02).
constexpr int kPpMaxRows = 16;

// One super-block of two weight rows, unpacked. Chunk c = elements 32 c .. 32 c + 31.
struct KPpBlock {
  __m512i q[8];    // chunk c of row 0 | of row 1: 32 bytes each (q4_K/q5_K: u8 0..15/31; q6_K: s8 q - 32)
  __m512i sc[8];   // the scales of chunk c's two 16-element groups, 8 x i16 each, row 0 | row 1
  __m512 dw;       // [d row 0 x 8 | d row 1 x 8]
  __m256 ndmin;    // q4_K/q5_K: [-dmin row 0 x 4 | -dmin row 1 x 4]
  __m256i mins;    // q4_K/q5_K: [the 8 mins of row 0 | of row 1] as i16
  __m512i start;   // q6_K: the lanes' start value, -128 * sum_c madd(sc, pairsum(q - 32)); else 0
};

// [32 bytes at p0 | 32 bytes at p1]
[[gnu::always_inline]] MK_AVX512VNNI_FN inline __m512i pp_pair(const uint8_t* p0, const uint8_t* p1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1)), 1);
}

// q4_K/q5_K's vpshufb indices: chunk c's scale byte (c for row 0, 8 + c for row 1) zero-extended to all
// 16 i16 lanes of each row's half, from the 16 bytes [row 0's 8 scales | row 1's 8 scales] broadcast
// to every 128-bit lane.
struct PpQ4Index {
  alignas(64) int8_t idx[8][64];
  constexpr PpQ4Index() : idx{} {
    for (int c = 0; c < 8; ++c)
      for (int b = 0; b < 64; ++b) idx[c][b] = static_cast<int8_t>(b % 2 ? -128 : (b < 32 ? c : 8 + c));
  }
};
inline constexpr PpQ4Index kPpQ4Index{};
// q6_K's vpermw indices over [row 0's 16 scales | row 1's 16 scales] as i16: chunk c's groups 2c
// (i16 lanes 0..7 of a half) and 2c + 1 (lanes 8..15).
struct PpQ6Index {
  alignas(64) int16_t idx[8][32];
  constexpr PpQ6Index() : idx{} {
    for (int c = 0; c < 8; ++c)
      for (int l = 0; l < 32; ++l) idx[c][l] = static_cast<int16_t>(16 * (l / 16) + 2 * c + (l % 16) / 8);
  }
};
inline constexpr PpQ6Index kPpQ6Index{};

template <KGemmKind K>
[[gnu::always_inline]] MK_AVX512VNNI_FN inline void pp_unpack(const uint8_t* p0, const uint8_t* p1, KPpBlock& k) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  if constexpr (K == KGemmKind::q4_K || K == KGemmKind::q5_K) {
    k.dw = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(ld_f16c(p0)), _mm512_set1_ps(ld_f16c(p1)));
    k.ndmin = _mm256_blend_ps(_mm256_set1_ps(-ld_f16c(p0 + 2)), _mm256_set1_ps(-ld_f16c(p1 + 2)), 0xf0);
    uint32_t u0[4], u1[4];
    scales_mins_k4(p0 + 4, u0);
    scales_mins_k4(p1 + 4, u1);
    uint64_t s0, s1, m0, m1;
    std::memcpy(&s0, u0, 8);
    std::memcpy(&s1, u1, 8);
    std::memcpy(&m0, u0 + 2, 8);
    std::memcpy(&m1, u1 + 2, 8);
    k.mins = _mm256_cvtepu8_epi16(_mm_set_epi64x(static_cast<int64_t>(m1), static_cast<int64_t>(m0)));
    const __m512i s = _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0)));
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) k.sc[c] = _mm512_shuffle_epi8(s, _mm512_load_si512(kPpQ4Index.idx[c]));
    constexpr int kQs = K == KGemmKind::q4_K ? 16 : 48;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high) share 32 bytes
      const __m512i bits = pp_pair(p0 + kQs + 32 * j, p1 + kQs + 32 * j);
      k.q[2 * j] = _mm512_and_si512(bits, m4);
      k.q[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
    }
    if constexpr (K == KGemmKind::q5_K) {  // the 5th bit of chunk c: bit c of qh[l], moved to bit 4
      const __m512i h = pp_pair(p0 + 16, p1 + 16), m10 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i hc = c <= 4 ? _mm512_slli_epi16(h, 4 - c) : _mm512_srli_epi16(h, c - 4);
        k.q[c] = _mm512_or_si512(k.q[c], _mm512_and_si512(hc, m10));
      }
    }
    k.start = _mm512_setzero_si512();
  } else {
    static_assert(K == KGemmKind::q6_K);
    k.dw = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(ld_f16c(p0 + 208)), _mm512_set1_ps(ld_f16c(p1 + 208)));
    const __m256i s8 = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + 192)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 192)));
    const __m512i s16 = _mm512_cvtepi8_epi16(s8);
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) k.sc[c] = _mm512_permutexvar_epi16(_mm512_load_si512(kPpQ6Index.idx[c]), s16);
    const __m512i m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
#pragma GCC unroll 2
    for (int nb = 0; nb < 2; ++nb) {  // chunk 4 nb + g: low bits nibble g / 2 of ql[64 nb + 32 (g % 2) + l],
      // top bits 2g..2g+1 of qh[32 nb + l] (moved to bits 4..5 with 16-bit shifts, masked per byte)
      const __m512i l0 = pp_pair(p0 + 64 * nb, p1 + 64 * nb);
      const __m512i l1 = pp_pair(p0 + 64 * nb + 32, p1 + 64 * nb + 32);
      const __m512i h = pp_pair(p0 + 128 + 32 * nb, p1 + 128 + 32 * nb);
      const __m512i q0 = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
      const __m512i q1 = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
      const __m512i q2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(h, m30));
      const __m512i q3 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
      k.q[4 * nb] = _mm512_sub_epi8(q0, k32);
      k.q[4 * nb + 1] = _mm512_sub_epi8(q1, k32);
      k.q[4 * nb + 2] = _mm512_sub_epi8(q2, k32);
      k.q[4 * nb + 3] = _mm512_sub_epi8(q3, k32);
    }
    // what the +128 on the activations adds to the lanes: 128 * sum_c sc . pairsum(q - 32)
    const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i corr = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) corr = _mm512_dpwssd_epi32(corr, k.sc[c], _mm512_maddubs_epi16(k128, k.q[c]));
    k.start = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
  }
}

// One activation tile (rows a < na, super-blocks b < nb) as the tile reads it, prepared once per
// gemm_act call for every weight pair: d_x of (b, a) at d[b * na + a]; chunk c's 32 signed bytes at
// qs + b * qs_b + a * qs_a + 32 c (q4_K: the q8_K rows themselves; q6_K: a copy with the top bit
// flipped, y + 128 as unsigned bytes); q4_K/q5_K's pair sums of bsums (8 x i16, bsums[2i] + bsums[2i + 1])
// at bsum2[b * na + a].
struct PpActTile {
  int na;
  int64_t nb;
  const uint8_t* qs;
  size_t qs_b, qs_a;
  const float* d;
  const __m128i* bsum2;
};

// The tile: out[r * na + a] = dot_act(w_r, activation row a) for r < 2, a < t.na <= kPpMaxRows; w0, w1
// the two weight rows. pf0, pf1 (0: none): the rows of a later pair, as integers (a prefetch never
// faults, and rows past the matrix would be pointers past the array), prefetched super-block by
// super-block: into L2 from 4 activation rows on, into L1 below (BM_QuantGemmStreamed; as the packed
// q4/q8 tile, blockint_x86.h; docs/PERFORMANCE.md 2026-12-05).
template <KGemmKind K>
MK_AVX512VNNI_FN inline void kgemm_pp_tile(const uint8_t* w0, const uint8_t* w1, const PpActTile& t, float* out,
                                           uintptr_t pf0 = 0, uintptr_t pf1 = 0) {
  static_assert(KGemmLayout<K>::kPp);
  using L = KGemmLayout<K>;
  const int na = t.na;
  __m512 acc[kPpMaxRows];
  __m256 acc_m[kPpMaxRows];
  for (int a = 0; a < na; ++a) {
    acc[a] = _mm512_setzero_ps();
    acc_m[a] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < t.nb; ++b) {
    if (pf0 != 0) {
      const uintptr_t o = static_cast<uintptr_t>(b * L::kBytes);
      for (int64_t l = 0; l < L::kBytes + 63; l += 64) {  // every line the super-block touches
        const uintptr_t at = o + static_cast<uintptr_t>(std::min<int64_t>(l, L::kBytes - 1));
        if (na >= 4) {
          _mm_prefetch(reinterpret_cast<const char*>(pf0 + at), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(pf1 + at), _MM_HINT_T1);
        } else {
          _mm_prefetch(reinterpret_cast<const char*>(pf0 + at), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(pf1 + at), _MM_HINT_T0);
        }
      }
    }
    KPpBlock k;
    pp_unpack<K>(w0 + b * L::kBytes, w1 + b * L::kBytes, k);
    const uint8_t* yq = t.qs + b * t.qs_b;
    const float* dy = t.d + b * na;
    for (int a = 0; a < na; ++a, yq += t.qs_a) {
      __m512i s0 = k.start, s1 = _mm512_setzero_si512();  // two chains, added at the end (exact)
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i yc = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(yq + 32 * c)));
        // q4_K: nibbles (unsigned) x y; q6_K: y + 128 (unsigned) x q - 32 (signed)
        const __m512i p16 = K == KGemmKind::q6_K ? _mm512_maddubs_epi16(yc, k.q[c]) : _mm512_maddubs_epi16(k.q[c], yc);
        if (c % 2)
          s1 = _mm512_dpwssd_epi32(s1, k.sc[c], p16);
        else
          s0 = _mm512_dpwssd_epi32(s0, k.sc[c], p16);
      }
      acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dy[a]), k.dw), _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                               acc[a]);
      if constexpr (L::kMin) {  // lane l of a row: m[2l] * (bsums[4l] + bsums[4l+1]) + m[2l+1] * (..)
        __m256i m = _mm256_madd_epi16(k.mins, _mm256_broadcastsi128_si256(t.bsum2[b * na + a]));
        if constexpr (K == KGemmKind::q5_K) {  // one sum per row, in all 4 of its lanes (exact)
          m = _mm256_add_epi32(m, _mm256_shuffle_epi32(m, 0x4e));
          m = _mm256_add_epi32(m, _mm256_shuffle_epi32(m, 0xb1));
        }
        acc_m[a] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dy[a]), k.ndmin), _mm256_cvtepi32_ps(m), acc_m[a]);
      }
    }
  }
  for (int a = 0; a < na; ++a) {
    const __m256 lo = _mm512_castps512_ps256(acc[a]);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[a]), 1));
    const __m128 m_lo = _mm256_castps256_ps128(acc_m[a]), m_hi = _mm256_extractf128_ps(acc_m[a], 1);
    out[a] = k_finish<K>(lo, m_lo, _mm_cvtss_f32(m_lo));  // q5_K: summs, lane 0 of the row's four
    out[na + a] = k_finish<K>(hi, m_hi, _mm_cvtss_f32(m_hi));
  }
}

// Prepares rows y (ys bytes apart) of an activation tile into buf (reused: a thread's scratch).
struct alignas(16) PpUnit {
  uint8_t bytes[16];
};
template <KGemmKind K>
MK_AVX512VNNI_FN inline PpActTile pp_prepare(const uint8_t* y, size_t ys, int na, int64_t nb, std::vector<PpUnit>& buf) {
  constexpr bool kFlip = K == KGemmKind::q6_K;
  const size_t n_ab = static_cast<size_t>(na * nb);
  // 16-byte units: d (4 per unit), bsum2 (q4_K), the flipped quants (q6_K, 16 per row and super-block)
  const size_t d_units = (n_ab + 3) / 4, q_units = kFlip ? 16 * n_ab : 0, b_units = kFlip ? 0 : n_ab;
  if (buf.size() < d_units + q_units + b_units) buf.resize(d_units + q_units + b_units);
  __m128i* qs = reinterpret_cast<__m128i*>(buf.data());
  __m128i* bsum2 = qs + q_units;
  float* d = reinterpret_cast<float*>(bsum2 + b_units);
  for (int64_t b = 0; b < nb; ++b)
    for (int a = 0; a < na; ++a) {
      const uint8_t* yb = y + static_cast<size_t>(a) * ys + b * kQ8KBytes;
      const size_t e = static_cast<size_t>(b * na + a);
      d[e] = q8k_d(yb);
      if constexpr (kFlip) {
        const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
        for (int j = 0; j < 4; ++j)
          _mm512_storeu_si512(qs + 16 * e + 4 * j, _mm512_xor_si512(_mm512_loadu_si512(yb + kQ8KQs + 64 * j), top));
      } else {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + kQ8KBsums));
        bsum2[e] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
      }
    }
  if constexpr (kFlip)
    return {na, nb, reinterpret_cast<const uint8_t*>(qs), static_cast<size_t>(na) * 256, 256, d, nullptr};
  else
    return {na, nb, y + kQ8KQs, kQ8KBytes, ys, d, bsum2};
}

// gemm_act over kgemm_pp_tile: activation rows in tiles of at most kPpMaxRows, split evenly (17 rows:
// 9 + 8, not 16 + 1), and per activation tile the weight rows in pairs (an odd last row paired with
// itself), so the activation tile stays in L1 while the weights stream past it.
template <KGemmKind K>
void kgemm_pp_rows(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t x_stride, int64_t na, int64_t n,
                   float* out, int64_t ldo) {
  thread_local std::vector<PpUnit> buf;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(xq);
  const int64_t n_tiles = (na + kPpMaxRows - 1) / kPpMaxRows;
  for (int64_t t = 0, a0 = 0; t < n_tiles; ++t) {
    const int cols = static_cast<int>((na - a0) / (n_tiles - t) + ((na - a0) % (n_tiles - t) != 0));
    const PpActTile at = pp_prepare<K>(xb + static_cast<size_t>(a0) * x_stride, x_stride, cols, n / 256, buf);
    for (int64_t i0 = 0; i0 < nw; i0 += 2) {
      const int rows = static_cast<int>(std::min<int64_t>(2, nw - i0));
      float r[2 * kPpMaxRows];
      const uintptr_t pf = i0 + 4 < nw ? reinterpret_cast<uintptr_t>(wb) + static_cast<uintptr_t>(i0 + 4) * w_stride : 0;
      kgemm_pp_tile<K>(wb + static_cast<size_t>(i0) * w_stride, wb + static_cast<size_t>(i0 + rows - 1) * w_stride, at, r,
                       pf, pf != 0 && i0 + 5 < nw ? pf + w_stride : pf);  // the pair after next
      for (int i = 0; i < rows; ++i)
        for (int a = 0; a < cols; ++a) out[(a0 + a) * ldo + i0 + i] = r[i * cols + a];
    }
    a0 += cols;
  }
}

}  // namespace mk::quant::detail
