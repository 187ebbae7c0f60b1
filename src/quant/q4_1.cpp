// q4_1 (ggml id 3): 32 elements in 20 bytes, { f16 d; f16 m; u8 qs[16] }; nibbles as q4_0; value
// d * q + m (ggml-common.h block_q4_1).
#include <algorithm>

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

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)
}  // namespace

extern const QuantType kQ4_1 = {DType::Q4_1, "q4_1", 3, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale};
}  // namespace mk::quant
