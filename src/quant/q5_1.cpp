// q5_1 (ggml id 7): 32 elements in 24 bytes, { f16 d; f16 m; u8 qh[4]; u8 qs[16] }; bits as q5_0;
// value d * q + m (block_q5_1).
#include <algorithm>

#include "quant/gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 24;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b), m = ld_f16(b + 2);
  const uint32_t qh = ld_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const uint32_t x0 = (qs[j] & 0x0fu) | (((qh >> j) & 1u) << 4);
    const uint32_t x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(x0) + m;
    y[j + 16] = d * static_cast<float>(x1) + m;
  }
}

// ggml quantize_row_q5_1_ref: d = (max - min) / 31, m = min.
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < kQK; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 31, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    st_f16(b + 2, mn);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<uint8_t>((x[j] - mn) * id + 0.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<uint8_t>((x[j + 16] - mn) * id + 0.5f)));
      b[8 + j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(b + 4, &qh, 4);
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0, 2}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// Integer block for dot_act: the 5-bit q, d and m.
inline void unpack_block(const uint8_t* b, int8_t* q, float* d, float* m) {
  *d = ld_f16(b);
  *m = ld_f16(b + 2);
  const uint32_t qh = ld_u32(b + 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(static_cast<int>((b[8 + j] & 0x0fu) | (((qh >> j) & 1u) << 4)));
    q[j + 16] = static_cast<int8_t>(static_cast<int>((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)));
  }
}
MK_QUANT_DOT_ACT(dot_act, kBytes, unpack_block, true)
MK_QUANT_GEMM_ACT(gemm_act, GemmKind::q5_1, dot_act_generic)
}  // namespace

extern const QuantType kQ5_1 = {DType::Q5_1, "q5_1", 7, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_1Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                nullptr, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
