// q8_0 (ggml id 8): 32 elements in 34 bytes, { f16 d; i8 qs[32] }; value d * q (block_q8_0).
#include "quant/avx2.h"
#include "quant/blockint_amx.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 34;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// ggml quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d).
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    const float d = amax(x, kQK) / 127, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    for (int j = 0; j < kQK; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_AVX2_FN float dot_avx2_hand(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, x += kQK) {
    const __m256 d = _mm256_set1_ps(ld_f16(p));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18));
#define W8(v) _mm256_mul_ps(to_ps(v), d)  // q * d
    acc32(lo, hi, x, W8(i8_lo(q0)), W8(i8_hi(q0)), W8(i8_lo(q1)), W8(i8_hi(q1)));
  }
  return reduce16(lo, hi);
}
#undef W8

MK_QUANT_DOT_HAND_AVX2(dot, kQK, kBytes, dequant_block, dot_avx2_hand)

// Integer block for dot_act: q and d.
inline void unpack_block(const uint8_t* b, int8_t* q, float* d, float*) {
  *d = ld_f16(b);
  std::memcpy(q, b + 2, 32);
}

// Block-integer numerics (quant.h): an exact integer dot per block, then one float fma per block.
MK_QUANT_DOT_ACT_SPEC(dot_act, (dot_act_blocks_int<kBytes, unpack_block, false>))
MK_QUANT_GEMM_ACT_BLOCKINT(gemm_act, BiKind::q8_0, dot_act_generic)
}  // namespace

extern const QuantType kQ8_0 = {DType::Q8_0, "q8_0", 8, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_0Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                nullptr, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_amx},
    gemm_act_packed_bytes, gemm_act_pack, gemm_act_packed, {nullptr, gemm_act_packed_avx2, gemm_act_packed_avxvnni, gemm_act_packed_avx512vnni,
                                                                gemm_act_packed_amx}};
}  // namespace mk::quant
