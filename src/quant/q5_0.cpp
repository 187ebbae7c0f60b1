// q5_0 (ggml id 6): 32 elements in 22 bytes, { f16 d; u8 qh[4]; u8 qs[16] }; the low 4 bits as q4_0,
// bit j of the little-endian u32 qh is element j's 5th bit; value d * (q - 16) (block_q5_0).
#include <algorithm>

#include "quant/gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 22;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const uint32_t qh = ld_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - 16;
    const int x1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
    y[j] = d * static_cast<float>(x0);
    y[j + 16] = d * static_cast<float>(x1);
  }
}

// ggml quantize_row_q5_0_ref: d = (value of largest magnitude) / -16.
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    const float max = max_by_magnitude(x, kQK);
    const float d = max / -16, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
      b[6 + j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(b + 2, &qh, 4);
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// Integer block for dot_act: the 5-bit q - 16, d.
inline void unpack_block(const uint8_t* b, int8_t* q, float* d, float*) {
  *d = ld_f16(b);
  const uint32_t qh = ld_u32(b + 2);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(static_cast<int>((b[6 + j] & 0x0fu) | (((qh >> j) & 1u) << 4)) - 16);
    q[j + 16] = static_cast<int8_t>(static_cast<int>((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
  }
}
MK_QUANT_DOT_ACT(dot_act, kBytes, unpack_block, false)
MK_QUANT_GEMM_ACT(gemm_act, GemmKind::q5_0, dot_act_generic)
}  // namespace

extern const QuantType kQ5_0 = {DType::Q5_0, "q5_0", 6, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_0Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                nullptr, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
