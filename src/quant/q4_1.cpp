// q4_1 (ggml id 3): 32 elements in 20 bytes, { f16 d; f16 m; u8 qs[16] }; nibbles as q4_0; value
// d * q + m (ggml-common.h block_q4_1).
#include <algorithm>

#include "quant/avx2.h"
#include "quant/blockint_amx.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 20;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b), m = ld_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// ggml quantize_row_q4_1_ref: d = (max - min) / 15, m = min.
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < kQK; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 15, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    st_f16(b + 2, mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - mn) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - mn) * id + 0.5f)));
      b[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0, 2}); }

MK_AVX2_FN float dot_avx2_hand(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, x += kQK) {
    const __m256 d = _mm256_set1_ps(ld_f16(p)), m = _mm256_set1_ps(ld_f16(p + 2));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i ql = _mm_and_si128(q, m4), qh = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
#define W8(v) _mm256_add_ps(_mm256_mul_ps(d, to_ps(v)), m)  // d * q + m
    acc32(lo, hi, x, W8(u8_lo(ql)), W8(u8_hi(ql)), W8(u8_lo(qh)), W8(u8_hi(qh)));
  }
  return reduce16(lo, hi);
}
#undef W8

MK_QUANT_DOT_HAND_AVX2(dot, kQK, kBytes, dequant_block, dot_avx2_hand)

// Integer block for dot_act: q, d and m.
inline void unpack_block(const uint8_t* b, int8_t* q, float* d, float* m) {
  *d = ld_f16(b);
  *m = ld_f16(b + 2);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(b[4 + j] & 0x0f);
    q[j + 16] = static_cast<int8_t>(b[4 + j] >> 4);
  }
}

// Block-integer numerics (quant.h): an exact integer dot per block, then one float fma per block.
MK_QUANT_DOT_ACT_SPEC(dot_act, (dot_act_blocks_int<kBytes, unpack_block, true>))

MK_QUANT_GEMM_ACT_BLOCKINT(gemm_act, BiKind::q4_1, dot_act_generic)
}  // namespace

extern const QuantType kQ4_1 = {DType::Q4_1, "q4_1", 3, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_1Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                nullptr, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_amx},
    gemm_act_packed_bytes, gemm_act_pack, gemm_act_packed, {nullptr, gemm_act_packed_avx2, gemm_act_packed_avxvnni, gemm_act_packed_avx512vnni,
                                                                gemm_act_packed_amx}};
}  // namespace mk::quant
