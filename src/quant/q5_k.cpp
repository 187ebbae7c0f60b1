// q5_K (ggml id 13): 256 elements in 176 bytes, { f16 d; f16 dmin; u8 scales[12]; u8 qh[32];
// u8 qs[128] } (ggml-common.h block_q5_K). As q4_K, plus a 5th bit: bit (2 c + h) of qh[l];
// value (d*sc) * q - (dmin*m), q in 0..31.
#include <algorithm>

#include "quant/k_scales.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 176;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b), dmin = ld_f16(b + 2);
  const uint8_t *qh = b + 16, *q = b + 48;
  for (int c = 0; c < 4; ++c, q += 32)
    for (int h = 0; h < 2; ++h) {
      uint8_t sc, m;
      get_scale_min_k4(2 * c + h, b + 4, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      const int bit = 2 * c + h;
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> (4 * h)) & 0x0f) | (((qh[l] >> bit) & 1) << 4);
        *y++ = d1 * static_cast<float>(v) - m1;
      }
    }
}

void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    std::memset(b, 0, kBytes);
    uint8_t sc[8], mn[8];
    float d, dmin;
    quantize_scale_min(x, 31, b, b + 2, sc, mn, &d, &dmin);
    pack_scale_min_k4(sc, mn, b + 4);
    for (int s = 0; s < 8; ++s) {
      const float d1 = d * static_cast<float>(sc[s]), m1 = dmin * static_cast<float>(mn[s]);
      const int c = s / 2, h = s % 2;
      for (int l = 0; l < 32; ++l) {
        const int q = d1 > 0 ? std::clamp(nearest_int((x[32 * s + l] + m1) / d1), 0, 31) : 0;
        b[48 + 32 * c + l] |= static_cast<uint8_t>((q & 0x0f) << (4 * h));
        b[16 + l] |= static_cast<uint8_t>((q >> 4) << s);
      }
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0, 2}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)
}  // namespace

extern const QuantType kQ5_K = {DType::Q5_K, "q5_K", 13, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale};
}  // namespace mk::quant
