// q4_0 (ggml id 2): 32 elements in 18 bytes, { f16 d; u8 qs[16] }; element j < 16 is the low
// nibble of qs[j], element j + 16 its high nibble; value d * (q - 8) (ggml-common.h block_q4_0).
#include <algorithm>

#include "quant/avx2.h"
#include "quant/blockint_amx.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 18;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// ggml quantize_row_q4_0_ref: d = (value of largest magnitude) / -8.
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    const float max = max_by_magnitude(x, kQK);
    const float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      b[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_AVX2_FN float dot_avx2_hand(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, x += kQK) {
    const __m256 d = _mm256_set1_ps(ld_f16(p));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i ql = _mm_and_si128(q, m4), qh = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
#define W8(v) _mm256_mul_ps(d, to_ps(_mm256_sub_epi32(v, eight)))  // d * (q - 8)
    acc32(lo, hi, x, W8(u8_lo(ql)), W8(u8_hi(ql)), W8(u8_lo(qh)), W8(u8_hi(qh)));
  }
  return reduce16(lo, hi);
}
#undef W8

MK_QUANT_DOT_HAND_AVX2(dot, kQK, kBytes, dequant_block, dot_avx2_hand)

// Integer block for dot_act: q - 8 and d.
inline void unpack_block(const uint8_t* b, int8_t* q, float* d, float*) {
  *d = ld_f16(b);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((b[2 + j] & 0x0f) - 8);
    q[j + 16] = static_cast<int8_t>((b[2 + j] >> 4) - 8);
  }
}

// Block-integer numerics (quant.h): an exact integer dot per block, then one float fma per block.
MK_QUANT_DOT_ACT_SPEC(dot_act, (dot_act_blocks_int<kBytes, unpack_block, false>))
MK_QUANT_GEMM_ACT_BLOCKINT(gemm_act, BiKind::q4_0, dot_act_generic)
}  // namespace

extern const QuantType kQ4_0 = {DType::Q4_0, "q4_0", 2, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_0Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                nullptr, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_amx},
    gemm_act_packed_bytes, gemm_act_pack, gemm_act_packed, {nullptr, gemm_act_packed_avx2, gemm_act_packed_avxvnni, gemm_act_packed_avx512vnni,
                                                                gemm_act_packed_amx}};
}  // namespace mk::quant
