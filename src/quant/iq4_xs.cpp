// iq4_xs (ggml id 23): 256 elements in 136 bytes, { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }
// (ggml-common.h block_iq4_xs). Eight sub-blocks of 32, each with a signed 6-bit scale ls - 32
// (k_scales.h iq4_xs_scale); element j < 16 of sub-block s is the low nibble of qs[16 s + j], element
// j + 16 its high nibble, each an index into kvalues_iq4nl; value (d * (ls - 32)) * kvalues_iq4nl[q]
// (dequantize_row_iq4_xs). llama.cpp's IQ4_XS files are made of it (rows that are not whole
// super-blocks fall back to iq4_nl).
#include <algorithm>
#include <cmath>

#include "quant/k_act.h"
#include "quant/k_gemm_x86.h"
#include "quant/k_scales.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 136;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  for (int s = 0; s < 8; ++s, y += 32) {
    const float dl = d * static_cast<float>(iq4_xs_scale(b, s));
    const uint8_t* qs = b + 8 + 16 * s;
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kValuesIq4nl[qs[j] & 0x0f]);
      y[j + 16] = dl * static_cast<float>(kValuesIq4nl[qs[j] >> 4]);
    }
  }
}

// Per sub-block the scale that maps its largest-magnitude element to the table's -127; d = -(the
// largest of those) / 32, so that scale rounds to ls - 32 = -32 (ggml quantize_row_iq4_xs_impl's
// start, without its search over nearby scales or an importance matrix), each element then to the
// nearest table entry under its sub-block's d * (ls - 32).
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    float sub[8], max_scale = 0;
    for (int s = 0; s < 8; ++s) {
      sub[s] = max_by_magnitude(x + 32 * s, 32) / static_cast<float>(kValuesIq4nl[0]);
      if (std::fabs(sub[s]) > std::fabs(max_scale)) max_scale = sub[s];
    }
    const float d = -max_scale / 32, id = d != 0 ? 1 / d : 0;
    std::fill(b, b + kBytes, uint8_t{0});
    st_f16(b, d);
    const float dr = ld_f16(b);  // the stored d
    unsigned scales_h = 0;
    for (int s = 0; s < 8; ++s) {
      const int l = std::clamp(nearest_int(id * sub[s]), -32, 31);
      b[4 + s / 2] |= static_cast<uint8_t>((l + 32) & 0x0f) << (4 * (s % 2));
      scales_h |= static_cast<unsigned>((l + 32) >> 4) << (2 * s);
      const float dl = dr * static_cast<float>(l), idl = dl != 0 ? 1 / dl : 0;
      for (int j = 0; j < 16; ++j) {
        const int q0 = nearest_iq4nl_index(x[32 * s + j] * idl), q1 = nearest_iq4nl_index(x[32 * s + j + 16] * idl);
        b[8 + 16 * s + j] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
    b[2] = static_cast<uint8_t>(scales_h & 0xff);
    b[3] = static_cast<uint8_t>(scales_h >> 8);
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// dot_act against q8_K (k_act.h) with ggml_vec_dot_iq4_xs_q8_K's AVX2 arithmetic: per super-block the
// table values times the activations in 8 exact int32 lanes, each sub-block's part times its scale
// ls - 32, then acc[l] = fma(d_w * d_x, float(lane), acc[l]); hsum_float_8 at the end.
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    int8_t q[256];
    int32_t sc16[16], sumi[8];
    for (int s = 0; s < 8; ++s) {
      sc16[2 * s] = sc16[2 * s + 1] = iq4_xs_scale(p, s);
      for (int j = 0; j < 16; ++j) {
        q[32 * s + j] = kValuesIq4nl[p[8 + 16 * s + j] & 0x0f];
        q[32 * s + j + 16] = kValuesIq4nl[p[8 + 16 * s + j] >> 4];
      }
    }
    k_lanes(q, sc16, y, sumi);
    const float d = ld_f16(p) * q8k_d(y);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc);
}

// The AVX2 dot_act: the K tile (k_gemm_x86.h) with one weight row and one activation row.
MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* wr[1] = {static_cast<const uint8_t*>(w)};
  const uint8_t* yr[1] = {static_cast<const uint8_t*>(xq)};
  float out;
  kgemm_tile256_avx2<KGemmKind::iq4_xs, 1, 1>(wr, yr, n / kQK, &out);
  return out;
}
MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)

MK_QUANT_DOT_ACT4_K(dot_act4, KGemmKind::iq4_xs, dot_act)
MK_QUANT_GEMM_ACT_K(gemm_act, KGemmKind::iq4_xs, dot_act_generic, dot_act_avx2_hand)
}  // namespace

extern const QuantType kIQ4_XS = {DType::IQ4_XS, "iq4_xs", 23, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                  quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                  &kQ8_KAct, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                  dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                       gemm_act_avx512vnni}};
}  // namespace mk::quant
