// The 12-byte scale/min packing shared by q4_K and q5_K (ggml-quants.c get_scale_min_k4): eight
// 6-bit scales and eight 6-bit mins. j < 4: sc = s[j] & 63, m = s[j + 4] & 63; j >= 4: the low 4 bits
// in s[j + 4] (scale low nibble, min high nibble), the top 2 bits in bits 6..7 of s[j - 4] (scale)
// and s[j] (min).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "quant/quant_impl.h"

namespace mk::quant::detail {

inline void get_scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// All eight scales and mins at once, with word operations: out bytes 0..7 the scales, 8..15 the
// mins (the values get_scale_min_k4 gives for j = 0..7).
inline void scales_mins_k4(const uint8_t* s, uint32_t out[4]) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  out[0] = a & 0x3f3f3f3f;
  out[1] = (c & 0x0f0f0f0f) | (((a >> 6) & 0x03030303) << 4);
  out[2] = b & 0x3f3f3f3f;
  out[3] = ((c >> 4) & 0x0f0f0f0f) | (((b >> 6) & 0x03030303) << 4);
}

// q3_K's 16 signed 6-bit scales (sc - 32) from its 12 scale bytes s (ggml-quants.c dequantize_row_q3_K):
// low 4 bits in s[k] (k < 8) or s[k - 8] >> 4, top 2 bits in bits 2 (k / 4) of s[8 + k % 4].
inline int scale6(const uint8_t* s, int k) {
  const int lo = k < 8 ? (s[k] & 0x0f) : (s[k - 8] >> 4);
  const int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// iq4_xs's signed scale of sub-block s < 8 (ls - 32) from its block b (ggml-common.h block_iq4_xs:
// scales_h:u16@2, scales_l:u8[4]@4): the low 4 bits nibble s % 2 of scales_l[s / 2], the top 2 bits
// bits 2s..2s+1 of scales_h (dequantize_row_iq4_xs).
inline int iq4_xs_scale(const uint8_t* b, int s) {
  const unsigned h = static_cast<unsigned>(b[2]) | static_cast<unsigned>(b[3]) << 8;
  return static_cast<int>(((b[4 + s / 2] >> (4 * (s % 2))) & 0x0fu) | (((h >> (2 * s)) & 3u) << 4)) - 32;
}
inline void pack_scale_min_k4(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 12; ++j) s[j] = 0;
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= sc[j];
      s[j + 4] |= m[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((sc[j] & 0x0f) | ((m[j] & 0x0f) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
}

// Per sub-block of 32: scale (max - min) / qmax and min -min (min clamped to <= 0), then 6-bit
// super-block quantization of both. Writes f16 d and dmin and returns their rounded values.
inline void quantize_scale_min(const float* x, int qmax, uint8_t* d_out, uint8_t* dmin_out, uint8_t* sc, uint8_t* m,
                               float* d, float* dmin) {
  float scale[8], mins[8], max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; ++s) {
    float mn = 0, mx = x[32 * s];
    for (int l = 0; l < 32; ++l) {
      mn = std::min(mn, x[32 * s + l]);
      mx = std::max(mx, x[32 * s + l]);
    }
    scale[s] = (mx - mn) / static_cast<float>(qmax);
    mins[s] = -mn;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, mins[s]);
  }
  st_f16(d_out, max_scale / 63);
  st_f16(dmin_out, max_min / 63);
  *d = ld_f16(d_out);
  *dmin = ld_f16(dmin_out);
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(*d > 0 ? std::clamp(nearest_int(scale[s] / *d), 0, 63) : 0);
    m[s] = static_cast<uint8_t>(*dmin > 0 ? std::clamp(nearest_int(mins[s] / *dmin), 0, 63) : 0);
  }
}

}  // namespace mk::quant::detail
