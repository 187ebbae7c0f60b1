// Quantized weight types (src/quant/): the block table against ggml's, dequantization bit-exact
// against gguf-py's gguf.quants (fixtures from tests/data/quant/gen_quant_fixtures.py), the
// reference quantizers of q4_0..q8_0 bit-exact against gguf-py, the K-quant quantizers' round-trip
// error, every dot variant equal to dequantize-then-dot, the 8-bit activation dots (q8_K bytes and
// the K-quants' dot_act bit-exact against llama.cpp's own code, tests/data/quant/gen_q8k_fixtures.py),
// and each type's matmul (and quantized embedding lookup) on the cpu and reference backends against
// an f64 product.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "archs/arch.h"
#include "backend/backend.h"
#include "backend/cuda/codegen.h"
#include "ir/graph.h"
#include "model/model_file.h"
#include "passes/pass.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"
#include "support/compare.h"
#include "support/error.h"
#include "support/errors.h"

using namespace mk;
using quant::QuantType;

namespace {

std::vector<uint8_t> read_bin(const std::string& name) {
  const std::string path = std::string(MK_SOURCE_DIR) + "/tests/data/quant/" + name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing fixture " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

std::string type_name(const QuantType* q) { return std::string(q->name); }

// The CPU interpreter's dot (backend/cpu/kernels.cpp): 16 lanes, fixed tree.
float dot16(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % 16] += a[i] * b[i];
  for (int s = 8; s > 0; s /= 2)
    for (int l = 0; l < s; ++l) acc[l] += acc[l + s];
  return acc[0];
}

// Random float32 data with a few outliers, as real weight rows have.
std::vector<float> random_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  for (int64_t i = 0; i < n; i += 97) v[static_cast<size_t>(i)] *= 8;
  return v;
}

std::vector<uint8_t> quantize(const QuantType* q, const std::vector<float>& f) {
  std::vector<uint8_t> b(dtype_bytes(q->dtype, static_cast<int64_t>(f.size())));
  q->quantize_row(f.data(), b.data(), static_cast<int64_t>(f.size()));
  return b;
}

}  // namespace

TEST(QuantTable, LayoutsAndIdsAreGgmls) {
  // ggml.h enum ggml_type ids and ggml-common.h block sizes (gguf-py GGML_QUANT_SIZES).
  struct Row {
    DType t;
    const char* name;
    uint32_t id;
    int64_t elems, bytes;
  } rows[] = {{DType::Q4_0, "q4_0", 2, 32, 18},    {DType::Q4_1, "q4_1", 3, 32, 20},   {DType::Q5_0, "q5_0", 6, 32, 22},
              {DType::Q5_1, "q5_1", 7, 32, 24},    {DType::Q8_0, "q8_0", 8, 32, 34},   {DType::Q2_K, "q2_K", 10, 256, 84},
              {DType::Q3_K, "q3_K", 11, 256, 110}, {DType::Q4_K, "q4_K", 12, 256, 144}, {DType::Q5_K, "q5_K", 13, 256, 176},
              {DType::Q6_K, "q6_K", 14, 256, 210}, {DType::IQ4_NL, "iq4_nl", 20, 32, 18},
              {DType::IQ4_XS, "iq4_xs", 23, 256, 136}};
  ASSERT_EQ(quant::quant_types().size(), std::size(rows));
  for (const Row& r : rows) {
    const QuantType* q = quant::quant_type(r.t);
    ASSERT_NE(q, nullptr) << r.name;
    EXPECT_EQ(q->name, r.name);
    EXPECT_EQ(dtype_name(r.t), r.name);
    EXPECT_EQ(q->ggml_type, r.id) << r.name;
    EXPECT_EQ(quant::quant_type_from_ggml(r.id), q);
    EXPECT_EQ(dtype_block_size(r.t), r.elems) << r.name;
    EXPECT_EQ(dtype_block_bytes(r.t), r.bytes) << r.name;
    EXPECT_TRUE(dtype_is_quantized(r.t));
    EXPECT_EQ(dtype_bytes(r.t, 2 * r.elems), static_cast<size_t>(2 * r.bytes));
    EXPECT_THROW(dtype_bytes(r.t, r.elems + 16), Error) << r.name;
  }
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32}) EXPECT_EQ(quant::quant_type(t), nullptr);
  for (uint32_t id : {0u, 1u, 9u, 15u, 16u, 30u, 1000u}) EXPECT_EQ(quant::quant_type_from_ggml(id), nullptr) << id;
}

TEST(QuantDequant, FastHalfConversionIsExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = quant::detail::f16_to_f32_fast(static_cast<uint16_t>(h)), b = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(a)) << h;
    } else {
      uint32_t ua, ub;
      std::memcpy(&ua, &a, 4);
      std::memcpy(&ub, &b, 4);
      ASSERT_EQ(ua, ub) << "half " << h << ": " << a << " vs " << b;
    }
  }
}

// st_f16 (F16C where the build has it) stores f32_to_f16's bits for every float but NaN: each
// float of the exponents that reach or border the half range (every one of their low 14 mantissa
// bits: the rounding and the tie-to-even bit, under a few high ones), and of the others, a sample.
TEST(QuantDequant, StoredHalfEqualsF32ToF16) {
  auto check = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) return true;
    uint8_t p[2];
    quant::detail::st_f16(p, f);
    return quant::detail::ld_u16(p) == f32_to_f16(f);
  };
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 256; ++e) {
      const bool near = e >= 100 && e <= 145;
      for (uint32_t hi : {0u, 0x155u, 0x2aau, 0x1ffu}) {
        const uint32_t step = near ? 1 : 97;
        for (uint32_t lo = 0; lo < 16384; lo += step) {
          const uint32_t u = sign | (e << 23) | (hi << 14) | lo;
          ASSERT_TRUE(check(u)) << std::hex << u;
        }
      }
    }
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u, 0x00000001u})
    EXPECT_TRUE(check(u)) << std::hex << u;  // inf, 65520 (to inf), just below, half of 2^-24, denormal
}

namespace {
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST(QuantDequant, HalfConversionKnownValues) {
  const std::pair<uint16_t, uint32_t> cases[] = {
      {0x0000, 0x00000000}, {0x8000, 0x80000000}, {0x3c00, 0x3f800000},  // +0, -0, 1
      {0xc000, 0xc0000000}, {0x7bff, 0x477fe000},                         // -2, 65504 (max)
      {0x0001, 0x33800000}, {0x03ff, 0x387fc000}, {0x0400, 0x38800000},  // 2^-24, largest subnormal, 2^-14
      {0x7c00, 0x7f800000}, {0xfc00, 0xff800000},                         // +-inf
      {0x7e00, 0x7fc00000}, {0xfe01, 0xffc02000},                         // quiet NaNs keep sign and payload
      {0x7c01, 0x7fc02000}, {0x7d55, 0x7feaa000},                         // signalling NaNs are quieted
  };
  for (auto [h, want] : cases) {
    EXPECT_EQ(float_bits(f16_to_f32(h)), want) << std::hex << h;
    float row = 0;
    f16_to_f32_row(&h, &row, 1);
    EXPECT_EQ(float_bits(row), want) << std::hex << h << " " << f16_row_isa();
  }
}

// The run-time picked (F16C / AVX-512) row conversion gives the portable one's bits for every half,
// NaN payloads included, at every alignment and tail length.
TEST(QuantDequant, HalfRowConversionMatchesPortable) {
  std::vector<uint8_t> src(2 * 65536 + 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(src.data() + 2 * h, &v, 2);
  }
  std::vector<float> fast(65537), portable(65537);
  for (int64_t shift : {0, 1}) {  // 1: every load misaligned by a byte
    if (shift) std::memmove(src.data() + 1, src.data(), 2 * 65536);
    f16_to_f32_row(src.data() + shift, fast.data(), 65536);
    f16_to_f32_row(src.data() + shift, portable.data(), 65536, /*portable=*/true);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(float_bits(portable[h]), float_bits(f16_to_f32(static_cast<uint16_t>(h)))) << h;
      ASSERT_EQ(float_bits(fast[h]), float_bits(portable[h])) << "half " << h << " shift " << shift << " " << f16_row_isa();
    }
  }
  for (int64_t n = 0; n <= 40; ++n) {  // vector body plus every tail length; dst[n] is left alone
    std::fill(fast.begin(), fast.end(), -7.0f);
    f16_to_f32_row(src.data() + 1 + 2 * 1000, fast.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(float_bits(fast[i]), float_bits(f16_to_f32(static_cast<uint16_t>(1000 + i))));
    ASSERT_EQ(fast[n], -7.0f) << n;
  }
}

TEST(QuantDequant, BitExactAgainstGgufPy) {
  for (const QuantType* q : quant::quant_types()) {
    SCOPED_TRACE(type_name(q));
    const auto blocks = read_bin(type_name(q) + ".blocks.bin");
    const auto expected = as_floats(read_bin(type_name(q) + ".f32.bin"));
    ASSERT_FALSE(blocks.empty());
    const int64_t nb = static_cast<int64_t>(blocks.size()) / q->block_bytes;
    ASSERT_EQ(static_cast<int64_t>(expected.size()), nb * q->block_size);
    EXPECT_EQ(q->find_bad_scale(blocks.data(), nb), -1);
    // The whole run as one row, then each block on its own (a row's tail block included), then via to_f32.
    std::vector<float> got(expected.size(), NAN);
    q->dequantize_row(blocks.data(), got.data(), nb * q->block_size);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * 4), 0);
    for (int64_t b = 0; b < nb; ++b) {
      std::vector<float> one(static_cast<size_t>(q->block_size), NAN);
      q->dequantize_row(blocks.data() + b * q->block_bytes, one.data(), q->block_size);
      for (int64_t i = 0; i < q->block_size; ++i) {
        const float e = expected[static_cast<size_t>(b * q->block_size + i)];
        uint32_t ub, ue;
        std::memcpy(&ub, &one[static_cast<size_t>(i)], 4);
        std::memcpy(&ue, &e, 4);
        ASSERT_EQ(ub, ue) << "block " << b << " element " << i << ": " << one[static_cast<size_t>(i)] << " vs " << e;
      }
    }
    std::vector<float> via(expected.size());
    to_f32(q->dtype, blocks.data(), via.data(), nb * q->block_size);
    EXPECT_EQ(std::memcmp(via.data(), expected.data(), via.size() * 4), 0);
  }
}

TEST(QuantQuantize, ReferenceQuantizersBitExactAgainstGgufPy) {
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0}) {
    const QuantType* q = quant::quant_type(t);
    SCOPED_TRACE(type_name(q));
    const auto in = as_floats(read_bin(type_name(q) + ".qin.bin"));
    const auto expected = read_bin(type_name(q) + ".qout.bin");
    ASSERT_EQ(expected.size(), dtype_bytes(t, static_cast<int64_t>(in.size())));
    const auto got = quantize(q, in);
    for (size_t b = 0; b < got.size() / static_cast<size_t>(q->block_bytes); ++b)
      EXPECT_EQ(std::memcmp(got.data() + b * q->block_bytes, expected.data() + b * q->block_bytes, q->block_bytes), 0)
          << "block " << b;
  }
}

TEST(QuantQuantize, RoundTripErrorPerType) {
  // rel. L2 of dequantize(quantize(w)) on Gaussian rows with outliers: bounds a few times above the
  // measured values (bits per weight: q2_K 2.6 ... q8_0 8.5); a packing bug gives errors near 1.
  struct Bound {
    DType t;
    double max_rel;
  } bounds[] = {{DType::Q8_0, 0.015}, {DType::Q6_K, 0.04}, {DType::Q5_0, 0.1}, {DType::Q5_1, 0.1},
                {DType::Q5_K, 0.1},  {DType::Q4_0, 0.2}, {DType::Q4_1, 0.2}, {DType::Q4_K, 0.2},
                {DType::Q3_K, 0.35}, {DType::Q2_K, 0.6}};
  const auto w = random_weights(4096, 7);
  for (const Bound& b : bounds) {
    const QuantType* q = quant::quant_type(b.t);
    const auto bytes = quantize(q, w);
    EXPECT_EQ(q->find_bad_scale(bytes.data(), 4096 / q->block_size), -1);
    std::vector<float> back(w.size());
    q->dequantize_row(bytes.data(), back.data(), 4096);
    const double err = test::rel_l2(back, w);
    EXPECT_LT(err, b.max_rel) << q->name;
    EXPECT_GT(err, 0.0) << q->name;
    std::printf("  %s round trip rel. L2 %.4f\n", std::string(q->name).c_str(), err);
  }
  // Degenerate blocks: all zero and one repeated value stay exact (zero) or close.
  for (const QuantType* q : quant::quant_types()) {
    std::vector<float> zero(256, 0.0f), same(256, 0.25f), back(256, 1.0f);
    q->dequantize_row(quantize(q, zero).data(), back.data(), 256);
    for (float v : back) ASSERT_EQ(v, 0.0f) << q->name;
    q->dequantize_row(quantize(q, same).data(), back.data(), 256);
    for (float v : back) ASSERT_NEAR(v, 0.25f, 0.25f * 0.3) << q->name;
  }
}

TEST(QuantDot, EveryVariantEqualsDequantizeThenDot) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const QuantType* q : quant::quant_types()) {
    SCOPED_TRACE(type_name(q));
    // Fixture blocks (extreme scales) and quantized rows, several lengths.
    std::vector<std::vector<uint8_t>> rows = {read_bin(type_name(q) + ".blocks.bin"),
                                              quantize(q, random_weights(4 * q->block_size, 11)),
                                              quantize(q, random_weights(q->block_size, 12))};
    for (const auto& row : rows) {
      const int64_t n = static_cast<int64_t>(row.size()) / q->block_bytes * q->block_size;
      std::vector<float> w(static_cast<size_t>(n)), x(static_cast<size_t>(n));
      for (auto& v : x) v = u(rng);
      q->dequantize_row(row.data(), w.data(), n);
      const float want = dot16(x.data(), w.data(), n);
      uint32_t bw, bg;
      std::memcpy(&bw, &want, 4);
      const float got = q->dot(row.data(), x.data(), n);
      std::memcpy(&bg, &got, 4);
      EXPECT_EQ(bg, bw) << "dot: " << got << " vs " << want << " (n " << n << ")";
      for (int i = 0; i < 3; ++i) {
        const auto isa = static_cast<quant::DotIsa>(i);
        if (!quant::dot_isa_available(isa)) continue;
        const float v = q->dot_variants[i](row.data(), x.data(), n);
        std::memcpy(&bg, &v, 4);
        EXPECT_EQ(bg, bw) << quant::dot_isa_name(isa) << ": " << v << " vs " << want;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 8-bit activation blocks and integer dots (quant.h ActQuant, QuantType::dot_act).

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// The integers a 32-element block of q4_0 .. q8_0 stores (ggml-common.h block_*, value d * q (+ m)).
std::array<int32_t, 32> block_ints(DType t, const uint8_t* b) {
  std::array<int32_t, 32> q{};
  const auto nib = [&](int off, int j) { return j < 16 ? b[off + j] & 0x0f : b[off + j - 16] >> 4; };
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) switch (t) {
      case DType::Q4_0: q[j] = nib(2, j) - 8; break;
      case DType::Q4_1: q[j] = nib(4, j); break;
      case DType::Q5_0:
        std::memcpy(&qh, b + 2, 4);
        q[j] = (nib(6, j) | static_cast<int>(((qh >> j) & 1) << 4)) - 16;
        break;
      case DType::Q5_1:
        std::memcpy(&qh, b + 4, 4);
        q[j] = nib(8, j) | static_cast<int>(((qh >> j) & 1) << 4);
        break;
      case DType::IQ4_NL: {  // ggml-common.h kvalues_iq4nl
        static constexpr int kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        q[j] = kValues[nib(2, j)];
        break;
      }
      default: q[j] = static_cast<int8_t>(b[2 + j]);  // q8_0
    }
  return q;
}

// The model of quant.h's dot_act for the 32-element types. q4_0, q4_1, q8_0: block-integer numerics,
// an exact integer dot per block, acc = fma(d_w * d_x, dot, acc) (q4_1: and summs = fma(m_w, s_x,
// summs)) in block order, acc (+ summs). q5_0, q5_1: ggml's AVX2 ggml_vec_dot_*_q8_*
// (arch/x86/quants.c), lanes of 4 integer products, fma(d_w * d_x, lane, acc), hsum_float_8, plus sum
// of fma(m_w, s_x, .) for q5_1. iq4_nl: ggml_vec_dot_iq4_nl_q8_0 (AVX2): those lanes for blocks in
// pairs, the even block of a pair in one accumulator and the odd in another, hsum_float_8 of their
// sum, then a last unpaired block added as d_x * d_w * (its integer dot).
float dot_act_model(const QuantType* q, const uint8_t* wrow, const uint8_t* xq, int64_t n) {
  const bool has_min = q->act->block_bytes == 36;
  const int xqs = has_min ? 4 : 2;
  if (q->dtype == DType::IQ4_NL) {
    float acc[2][8] = {};
    const int64_t nb = n / 32;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2)
      for (int k = 0; k < 2; ++k) {
        const uint8_t* blk = wrow + (b + k) * q->block_bytes;
        const uint8_t* y = xq + (b + k) * q->act->block_bytes;
        const auto qw = block_ints(q->dtype, blk);
        for (int l = 0; l < 8; ++l) {
          int32_t s = 0;
          for (int e = 4 * l; e < 4 * l + 4; ++e) s += qw[static_cast<size_t>(e)] * static_cast<int8_t>(y[xqs + e]);
          acc[k][l] = std::fma(f16_at(y) * f16_at(blk), static_cast<float>(s), acc[k][l]);
        }
      }
    float a[8];
    for (int l = 0; l < 8; ++l) a[l] = acc[0][l] + acc[1][l];
    const float t0 = a[4] + a[0], t1 = a[5] + a[1], t2 = a[6] + a[2], t3 = a[7] + a[3];
    float r = (t0 + t2) + (t1 + t3);
    if (b < nb) {
      const uint8_t* blk = wrow + b * q->block_bytes;
      const uint8_t* y = xq + b * q->act->block_bytes;
      const auto qw = block_ints(q->dtype, blk);
      int32_t s = 0;
      for (int e = 0; e < 32; ++e) s += qw[static_cast<size_t>(e)] * static_cast<int8_t>(y[xqs + e]);
      r += f16_at(y) * f16_at(blk) * static_cast<float>(s);
    }
    return r;
  }
  if (q->dtype == DType::Q4_0 || q->dtype == DType::Q4_1 || q->dtype == DType::Q8_0) {
    float acc = 0, summs = 0;
    for (int64_t b = 0; b < n / 32; ++b) {
      const uint8_t* blk = wrow + b * q->block_bytes;
      const uint8_t* y = xq + b * q->act->block_bytes;
      const auto qw = block_ints(q->dtype, blk);
      int32_t s = 0;
      for (int e = 0; e < 32; ++e) s += qw[static_cast<size_t>(e)] * static_cast<int8_t>(y[xqs + e]);
      acc = std::fma(f16_at(blk) * f16_at(y), static_cast<float>(s), acc);
      if (has_min) summs = std::fma(f16_at(blk + 2), f16_at(y + 2), summs);
    }
    return has_min ? acc + summs : acc;
  }
  float acc[8] = {}, summs = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = wrow + b * q->block_bytes;
    const uint8_t* y = xq + b * q->act->block_bytes;
    const float dw = f16_at(blk), mw = has_min ? f16_at(blk + 2) : 0.0f, dx = f16_at(y);
    if (has_min) summs = std::fma(mw, f16_at(y + 2), summs);
    const auto qw = block_ints(q->dtype, blk);
    for (int l = 0; l < 8; ++l) {
      int32_t s = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) s += qw[static_cast<size_t>(e)] * static_cast<int8_t>(y[xqs + e]);
      acc[l] = std::fma(dw * dx, static_cast<float>(s), acc[l]);
    }
  }
  const float t0 = acc[4] + acc[0], t1 = acc[5] + acc[1], t2 = acc[6] + acc[2], t3 = acc[7] + acc[3];
  return (t0 + t2) + (t1 + t3) + summs;
}

}  // namespace

TEST(QuantAct, Q8BlocksRoundToNearestEvenWithinHalfAStep) {
  for (const quant::ActQuant* a : {&quant::act_q8_0(), &quant::act_q8_1()}) {
    SCOPED_TRACE(std::string(a->name));
    const bool has_s = a->name == "q8_1";
    EXPECT_EQ(a->block_size, 32);
    EXPECT_EQ(a->block_bytes, has_s ? 36 : 34);
    const int qs = has_s ? 4 : 2;
    // Block 0: amax 127 so that x * 127 / amax = x; 2.5 and -3.5 are ties (to even: 2, -4).
    // Block 1: random values. Block 2: all zero (d = 0, q = 0).
    std::vector<float> x(96, 0.0f);
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j) - 10.0f;
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -3.5f;
    x[3] = 0.5f;
    const auto rnd = random_weights(32, 9);
    std::copy(rnd.begin(), rnd.end(), x.begin() + 32);
    std::vector<uint8_t> b(static_cast<size_t>(3 * a->block_bytes));
    a->quantize_row(x.data(), b.data(), 96);
    const auto q_at = [&](int blk, int j) { return static_cast<int8_t>(b[static_cast<size_t>(blk * a->block_bytes + qs + j)]); };
    EXPECT_EQ(f16_at(b.data()), 1.0f);
    EXPECT_EQ(q_at(0, 0), 127);
    EXPECT_EQ(q_at(0, 1), 2);
    EXPECT_EQ(q_at(0, 2), -4);
    EXPECT_EQ(q_at(0, 3), 0);
    for (int j = 4; j < 32; ++j) EXPECT_EQ(q_at(0, j), j - 10);
    for (int blk = 0; blk < 3; ++blk) {
      const uint8_t* p = b.data() + blk * a->block_bytes;
      float amax = 0;
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(blk * 32 + j)]));
      const float d = amax / 127;
      EXPECT_EQ(f16_at(p), f16_to_f32(f32_to_f16(d)));
      for (int j = 0; j < 32; ++j) {
        const int8_t v = q_at(blk, j);
        sum += v;
        EXPECT_LE(std::abs(v), 127);
        EXPECT_LE(std::fabs(v * d - x[static_cast<size_t>(blk * 32 + j)]), d * 0.5001f) << blk << " " << j;
      }
      if (has_s) {
        EXPECT_EQ(f16_at(p + 2), f16_to_f32(f32_to_f16(d * static_cast<float>(sum))));
      }
    }
    EXPECT_EQ(f16_at(b.data() + 2 * a->block_bytes), 0.0f);
    // quantize_row (AVX2 where the CPU has it) gives the scalar quantizer's bytes.
    std::vector<float> big = random_weights(32 * 40, 17);
    std::copy(x.begin(), x.end(), big.begin());
    std::vector<uint8_t> fast(static_cast<size_t>(40 * a->block_bytes)), scalar(fast.size());
    a->quantize_row(big.data(), fast.data(), 32 * 40);
    quant::detail::act_quantize_generic(has_s, big.data(), scalar.data(), 32 * 40);
    EXPECT_EQ(fast, scalar);
  }
}

TEST(QuantAct, EveryVariantOfDotActIsItsModel) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  int with_act = 0;
  for (const QuantType* q : quant::quant_types()) {
    SCOPED_TRACE(type_name(q));
    ASSERT_NE(q->act, nullptr);
    ASSERT_NE(q->dot_act, nullptr);
    if (q->block_size == 256) {  // the K-quants against q8_K: QuantActK below
      EXPECT_EQ(q->act, &quant::act_q8_K());
      continue;
    }
    ++with_act;
    EXPECT_EQ(q->act, q->ggml_type == 3 || q->ggml_type == 7 ? &quant::act_q8_1() : &quant::act_q8_0());
    std::vector<std::vector<uint8_t>> rows = {read_bin(type_name(q) + ".blocks.bin"),
                                              quantize(q, random_weights(18 * 32, 21)), quantize(q, random_weights(32, 22))};
    for (const auto& row : rows) {
      const int64_t n = static_cast<int64_t>(row.size()) / q->block_bytes * q->block_size;
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = u(rng);
      x[0] = 0;  // a zero and a block's extreme
      x[1] = -3.0f;
      std::vector<uint8_t> xq(static_cast<size_t>(n / 32 * q->act->block_bytes));
      q->act->quantize_row(x.data(), xq.data(), n);
      const float want = dot_act_model(q, row.data(), xq.data(), n);
      const float got = q->dot_act(row.data(), xq.data(), n);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got));
        continue;
      }
      uint32_t bw, bg;
      std::memcpy(&bw, &want, 4);
      std::memcpy(&bg, &got, 4);
      EXPECT_EQ(bg, bw) << "dot_act: " << got << " vs " << want << " (n " << n << ")";
      for (int i = 0; i < 3; ++i) {
        const auto isa = static_cast<quant::DotIsa>(i);
        if (!quant::dot_isa_available(isa)) continue;
        const float v = q->dot_act_variants[i](row.data(), xq.data(), n);
        std::memcpy(&bg, &v, 4);
        EXPECT_EQ(bg, bw) << quant::dot_isa_name(isa) << ": " << v << " vs " << want;
      }
      if (q->dot_act4) {  // four activation rows (this one and three others): four dot_act results
        std::vector<std::vector<uint8_t>> xs(4, xq);
        for (int r = 1; r < 4; ++r) {
          std::vector<float> x2(x.size());
          for (auto& v : x2) v = u(rng);
          q->act->quantize_row(x2.data(), xs[static_cast<size_t>(r)].data(), n);
        }
        const void* ptrs[4] = {xs[0].data(), xs[1].data(), xs[2].data(), xs[3].data()};
        float out[4];
        q->dot_act4(row.data(), ptrs, n, out);
        for (int r = 0; r < 4; ++r) {
          const float w1 = dot_act_model(q, row.data(), xs[static_cast<size_t>(r)].data(), n);
          std::memcpy(&bw, &w1, 4);
          std::memcpy(&bg, &out[r], 4);
          if (!std::isnan(w1)) {
            EXPECT_EQ(bg, bw) << "dot_act4 row " << r;
          }
        }
      }
    }
  }
  EXPECT_EQ(with_act, 6);  // q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl
}

namespace {

// q8_K written from ggml-common.h block_q8_K and quantize_row_q8_K_ref: a plain model for the tests.
struct Q8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
Q8K q8k_block(const uint8_t* p) {
  Q8K b;
  std::memcpy(&b.d, p, 4);
  std::memcpy(b.qs, p + 4, 256);
  std::memcpy(b.bsums, p + 260, 32);
  return b;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

}  // namespace

TEST(QuantActK, Q8KBytesEqualGgmlsQuantizer) {
  const quant::ActQuant& a = quant::act_q8_K();
  EXPECT_EQ(a.name, "q8_K");
  EXPECT_EQ(a.block_size, 256);
  EXPECT_EQ(a.block_bytes, 292);
  // ggml's own quantize_row_q8_K on 4 rows (tests/data/quant/gen_q8k_fixtures.py): normal values, a
  // zero block, ties at scale 1, a huge block, uniform and tiny values.
  const auto x = as_floats(read_bin("q8_K.in.bin"));
  const auto want = read_bin("q8_K.out.bin");
  ASSERT_EQ(x.size(), 4u * 1536);
  ASSERT_EQ(want.size(), 4u * 6 * 292);
  std::vector<uint8_t> got(want.size(), 0xAA);
  for (int r = 0; r < 4; ++r) a.quantize_row(x.data() + r * 1536, got.data() + r * 6 * 292, 1536);
  for (size_t b = 0; b < want.size() / 292; ++b)
    EXPECT_EQ(std::memcmp(got.data() + b * 292, want.data() + b * 292, 292), 0) << "block " << b;
  // The plain formula on random rows with an all-zero and an extreme block: the element of largest
  // magnitude maps to -127, d = 1 / (-127 / max), every q within half a step, bsums the sums of 16.
  std::vector<float> y = random_weights(256 * 5, 31);
  std::fill(y.begin() + 256, y.begin() + 512, 0.0f);
  for (int j = 0; j < 256; ++j) y[static_cast<size_t>(512 + j)] = (j % 2 ? -3e38f : 3e38f) * (static_cast<float>(j) / 256);
  y[1000] = -0.75f;  // block 3: a negative maximum
  y[1100] = 0.5f, y[1090] = -0.5f;  // block 4: +-0.5 of equal magnitude, the first one (-0.5) is max
  std::vector<uint8_t> q(5 * 292);
  a.quantize_row(y.data(), q.data(), 256 * 5);
  // quantize_row (AVX2 where the CPU has it) gives the scalar quantizer's bytes, here and on ggml's rows.
  std::vector<uint8_t> scalar(q.size());
  quant::detail::act_quantize_q8_K_generic(y.data(), scalar.data(), 256 * 5);
  EXPECT_EQ(q, scalar);
  EXPECT_EQ(q8k_block(q.data() + 4 * 292).qs[1090 - 1024], -127);
  std::vector<uint8_t> row(6 * 292);
  for (int r = 0; r < 4; ++r) {
    quant::detail::act_quantize_q8_K_generic(x.data() + r * 1536, row.data(), 1536);
    EXPECT_EQ(std::memcmp(row.data(), want.data() + r * 6 * 292, 6 * 292), 0) << "scalar, row " << r;
  }
  for (int b = 0; b < 5; ++b) {
    SCOPED_TRACE(b);
    const Q8K k = q8k_block(q.data() + b * 292);
    const float* xb = y.data() + b * 256;
    float max = 0, amax = 0;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
    if (amax == 0) {
      EXPECT_EQ(k.d, 0.0f);
      for (int j = 0; j < 256; ++j) EXPECT_EQ(k.qs[j], 0);
      for (int j = 0; j < 16; ++j) EXPECT_EQ(k.bsums[j], 0);
      continue;
    }
    const float iscale = -127.f / max;
    EXPECT_EQ(k.d, 1 / iscale);
    for (int j = 0; j < 256; ++j) {
      EXPECT_EQ(k.qs[j], std::min(127, static_cast<int>(std::nearbyint(iscale * xb[j])))) << j;
      EXPECT_LE(std::fabs(static_cast<double>(k.d) * k.qs[j] - xb[j]), std::fabs(static_cast<double>(k.d)) * 0.5001) << j;
      if (xb[j] == max) {
        EXPECT_EQ(k.qs[j], -127);
      }
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += k.qs[16 * g + j];
      EXPECT_EQ(k.bsums[g], sum) << g;
    }
  }
}

TEST(QuantActK, EveryVariantOfDotActEqualsGgmlsVecDot) {
  // ggml_vec_dot_qN_K_q8_K / ggml_vec_dot_iq4_xs_q8_K (llama.cpp's x86 build) of two weight rows per type (6 blocks with extreme f16
  // scales, 6 with realistic ones) against ggml's q8_K blocks of 4 activation rows: every variant,
  // and dot_act4, gives exactly ggml's bits.
  const auto xq = read_bin("q8_K.out.bin");
  ASSERT_EQ(xq.size(), 4u * 6 * 292);
  int n_types = 0;
  for (const QuantType* q : quant::quant_types()) {
    if (q->block_size != 256) continue;
    SCOPED_TRACE(type_name(q));
    ++n_types;
    ASSERT_EQ(q->act, &quant::act_q8_K());
    const auto want = as_floats(read_bin(type_name(q) + ".dot_q8K.bin"));
    ASSERT_EQ(want.size(), 8u);
    const std::vector<uint8_t> rows[2] = {read_bin(type_name(q) + ".blocks.bin"), read_bin(type_name(q) + ".wrand.bin")};
    for (int w = 0; w < 2; ++w) {
      ASSERT_EQ(rows[w].size(), static_cast<size_t>(6 * q->block_bytes));
      const void* x4[4];
      for (int r = 0; r < 4; ++r) {
        const uint8_t* x = xq.data() + r * 6 * 292;
        x4[r] = x;
        const float e = want[static_cast<size_t>(4 * w + r)];
        const float got = q->dot_act(rows[w].data(), x, 1536);
        EXPECT_TRUE(same_bits(got, e)) << "row " << w << "/" << r << ": " << got << " vs ggml " << e;
        for (int i = 0; i < 3; ++i) {
          const auto isa = static_cast<quant::DotIsa>(i);
          if (!quant::dot_isa_available(isa)) continue;
          const float v = q->dot_act_variants[i](rows[w].data(), x, 1536);
          EXPECT_TRUE(same_bits(v, e)) << quant::dot_isa_name(isa) << " row " << w << "/" << r << ": " << v << " vs " << e;
        }
      }
      if (q->dot_act4) {
        float out[4];
        q->dot_act4(rows[w].data(), x4, 1536, out);
        for (int r = 0; r < 4; ++r) EXPECT_TRUE(same_bits(out[r], want[static_cast<size_t>(4 * w + r)])) << "dot_act4 " << w << "/" << r;
      }
    }
  }
  EXPECT_EQ(n_types, 6);  // q2_K .. q6_K, iq4_xs
  EXPECT_NE(quant::quant_type(DType::Q4_K)->dot_act4, nullptr);
  EXPECT_NE(quant::quant_type(DType::Q6_K)->dot_act4, nullptr);
  EXPECT_NE(quant::quant_type(DType::Q5_K)->dot_act4, nullptr);
}

TEST(QuantActK, DotActWithinBudgetAndVariantsAgreeOnQuantizedRows) {
  // Rows our quantizers make (18 super-blocks) against random activations: every variant and
  // dot_act4 give the same bits, and the value is within rel. 1e-5 of the f64 dot of the
  // dequantized weights and the dequantized q8_K activations (|error| over the sum of |products|).
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 18 * 256;
  for (const QuantType* q : quant::quant_types()) {
    if (q->block_size != 256) continue;
    SCOPED_TRACE(type_name(q));
    const auto w = quantize(q, random_weights(n, 41));
    std::vector<float> wf(static_cast<size_t>(n));
    q->dequantize_row(w.data(), wf.data(), n);
    std::vector<std::vector<uint8_t>> xs(4, std::vector<uint8_t>(static_cast<size_t>(n / 256 * 292)));
    const void* x4[4];
    for (int r = 0; r < 4; ++r) {
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = nd(rng);
      q->act->quantize_row(x.data(), xs[static_cast<size_t>(r)].data(), n);
      x4[r] = xs[static_cast<size_t>(r)].data();
    }
    float out4[4];
    if (q->dot_act4) q->dot_act4(w.data(), x4, n, out4);
    for (int r = 0; r < 4; ++r) {
      const float got = q->dot_act(w.data(), x4[r], n);
      double exact = 0, mag = 0;
      for (int64_t b = 0; b < n / 256; ++b) {
        const Q8K k = q8k_block(static_cast<const uint8_t*>(x4[r]) + b * 292);
        for (int j = 0; j < 256; ++j) {
          const double p = static_cast<double>(wf[static_cast<size_t>(b * 256 + j)]) * k.d * k.qs[j];
          exact += p;
          mag += std::fabs(p);
        }
      }
      EXPECT_LT(std::fabs(got - exact), 1e-5 * mag) << got << " vs " << exact;
      for (int i = 0; i < 3; ++i)
        if (quant::dot_isa_available(static_cast<quant::DotIsa>(i))) {
          EXPECT_TRUE(same_bits(q->dot_act_variants[i](w.data(), x4[r], n), got)) << i;
        }
      if (q->dot_act4) {
        EXPECT_TRUE(same_bits(out4[r], got)) << "dot_act4 row " << r;
      }
    }
  }
}

// gemm_act: every variant and tile shape gives dot_act's bits per (weight row, activation row): row
// counts that are not a multiple of the tile (1..17 weight rows; 1..17 and 33 activation rows: every
// width of the K-quants' packed-pair tile, up to 16, and the even splits of 17 and 33 rows), padded
// strides, an output leading dimension wider than the tile, and a weight range starting at an odd row
// (a matmul tile's columns c0..c1).
TEST(QuantAct, GemmActEveryVariantEqualsDotActPerRow) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  int with_gemm = 0;
  for (const QuantType* q : quant::quant_types()) {
    if (!q->gemm_act) continue;
    SCOPED_TRACE(type_name(q));
    ++with_gemm;
    const bool k_quant = q->block_size == 256;  // 256-element super-blocks: fewer of them
    for (const int64_t blocks : {int64_t{1}, int64_t{k_quant ? 3 : 7}, int64_t{k_quant ? 5 : 18}}) {
      const int64_t n = blocks * q->block_size, n_w = 18, n_x = 33;
      const size_t wrow = static_cast<size_t>(blocks * q->block_bytes);
      const size_t xrow = static_cast<size_t>(n / q->act->block_size * q->act->block_bytes);
      const size_t ws = wrow + 6, xs = xrow + 10;  // padded strides
      // no padding after the last weight row (a tile reading past the matrix reads past the vector)
      std::vector<uint8_t> w(ws * (n_w - 1) + wrow), x(xs * n_x);
      for (int64_t i = 0; i < n_w; ++i) {
        std::vector<uint8_t> r = quantize(q, random_weights(n, 100 + static_cast<int>(i + n)));
        if (i == 3) {  // the fixture's blocks (extreme scales, every quant value) as far as they fit
          const std::vector<uint8_t> f = read_bin(type_name(q) + ".blocks.bin");
          std::copy_n(f.begin(), std::min(f.size(), r.size()), r.begin());
        }
        if (i == 4 && q->dtype == DType::Q8_0)  // all -128: the largest products of AVX2's |x| * sign(y, x) pairs
          for (int64_t b = 0; b < blocks; ++b) std::fill_n(r.begin() + b * q->block_bytes + 2, 32, uint8_t{0x80});
        std::copy(r.begin(), r.end(), w.begin() + static_cast<std::ptrdiff_t>(ws * i));
      }
      for (int64_t a = 0; a < n_x; ++a) {
        std::vector<float> xf(static_cast<size_t>(n));
        for (auto& v : xf) v = u(rng);
        // two rows at the 8-bit extremes (the first element of largest magnitude becomes -127): all
        // -127, and pairs of -127 and pairs of +127, the largest products the int16 steps see (q6_K's
        // flipped activations 1 and 255 next to each other)
        if (a == 5) std::fill(xf.begin(), xf.end(), 2.0f);
        if (a == 6)
          for (size_t j = 0; j < xf.size(); ++j) xf[j] = j % 4 < 2 ? -2.0f : 2.0f;
        q->act->quantize_row(xf.data(), x.data() + xs * a, n);
      }
      for (int v = 0; v < 5; ++v) {
        const auto isa = static_cast<quant::GemmIsa>(v);
        if (!quant::gemm_isa_available(isa)) continue;
        if (v > 0 && q->gemm_act_variants[v] == q->gemm_act_variants[v - 1]) continue;  // amx = avx512vnni
        SCOPED_TRACE(std::string(quant::gemm_isa_name(isa)));
        for (const int64_t w0 : {int64_t{0}, int64_t{1}})
          for (const int64_t nw : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{7}, int64_t{9},
                                   int64_t{13}, int64_t{17}}) {
            if (w0 + nw > n_w) continue;
            for (int64_t na = 1; na <= n_x; na = na == 17 ? 33 : na + 1) {  // 1..17, 33
              const int64_t ldo = nw + 3;
              std::vector<float> out(static_cast<size_t>(na * ldo), -7.0f);
              q->gemm_act_variants[v](w.data() + ws * w0, ws, nw, x.data(), xs, na, n, out.data(), ldo);
              for (int64_t a = 0; a < na; ++a)
                for (int64_t i = 0; i < ldo; ++i) {
                  const float got = out[static_cast<size_t>(a * ldo + i)];
                  if (i >= nw) {
                    EXPECT_EQ(got, -7.0f) << "wrote past the tile";
                    continue;
                  }
                  // the K-quants: their dot_act spec (checked against llama.cpp in QuantActK.*)
                  const uint8_t *wr = w.data() + ws * (w0 + i), *xr = x.data() + xs * a;
                  const float want = k_quant ? q->dot_act_variants[0](wr, xr, n) : dot_act_model(q, wr, xr, n);
                  if (std::isnan(want)) {
                    EXPECT_TRUE(std::isnan(got));
                    continue;
                  }
                  uint32_t bw, bg;
                  std::memcpy(&bw, &want, 4);
                  std::memcpy(&bg, &got, 4);
                  EXPECT_EQ(bg, bw) << "n " << n << " rows " << nw << " x " << na << " at (" << i << ", " << a << "): " << got
                                    << " vs " << want;
                }
            }
          }
      }
    }
  }
  EXPECT_EQ(with_gemm, static_cast<int>(quant::quant_types().size()));  // every type: the CPU matmul needs one
  EXPECT_TRUE(quant::gemm_isa_available(quant::gemm_isa()));
}

// Packed weights (QuantType::pack, gemm_act_packed): every packed variant this CPU runs gives
// dot_act's bits at every (weight row, activation row), for tiles starting at group 0 and group 1
// of a 35-row matrix (its last group padded), 1..17 and 33 activation rows, and writes nothing
// past its nw columns.
TEST(QuantAct, GemmActPackedEqualsDotActPerRow) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  int with_pack = 0, ran = 0;
  for (const QuantType* q : quant::quant_types()) {
    if (!q->pack) continue;
    SCOPED_TRACE(type_name(q));
    ++with_pack;
    ASSERT_TRUE(q->packed_bytes && q->gemm_act_packed);
    for (const int64_t blocks : {int64_t{1}, int64_t{7}, int64_t{18}}) {
      const int64_t n = blocks * q->block_size, n_w = 35, n_x = 33;
      const size_t wrow = static_cast<size_t>(blocks * q->block_bytes), ws = wrow + 6;
      const size_t xs = static_cast<size_t>(n / q->act->block_size * q->act->block_bytes) + 10;
      std::vector<uint8_t> w(ws * (n_w - 1) + wrow), x(xs * n_x);
      for (int64_t i = 0; i < n_w; ++i) {
        std::vector<uint8_t> r = quantize(q, random_weights(n, 300 + static_cast<int>(i + n)));
        if (i == 3) {
          const std::vector<uint8_t> f = read_bin(type_name(q) + ".blocks.bin");
          std::copy_n(f.begin(), std::min(f.size(), r.size()), r.begin());
        }
        std::copy(r.begin(), r.end(), w.begin() + static_cast<std::ptrdiff_t>(ws * i));
      }
      for (int64_t a = 0; a < n_x; ++a) {
        std::vector<float> xf(static_cast<size_t>(n));
        for (auto& v : xf) v = u(rng);
        q->act->quantize_row(xf.data(), x.data() + xs * a, n);
      }
      std::vector<uint8_t> packed(q->packed_bytes(n_w, n));
      EXPECT_EQ(packed.size(), 3 * q->packed_bytes(16, n));  // 3 groups of 16 rows
      q->pack(w.data(), ws, n_w, n, packed.data());
      for (int v = 0; v < 5; ++v) {
        if (!q->gemm_act_packed_variants[v] || !quant::gemm_isa_available(static_cast<quant::GemmIsa>(v))) continue;
        SCOPED_TRACE(std::string(quant::gemm_isa_name(static_cast<quant::GemmIsa>(v))));
        ++ran;
        for (const int64_t g0 : {int64_t{0}, int64_t{1}})
          for (const int64_t nw : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{17}, n_w - 16 * g0}) {
            if (16 * g0 + nw > n_w) continue;
            for (int64_t na = 1; na <= n_x; na = na == 17 ? 33 : na + 1) {
              const int64_t ldo = nw + 3;
              std::vector<float> out(static_cast<size_t>(na * ldo), -7.0f);
              q->gemm_act_packed_variants[v](packed.data() + g0 * q->packed_bytes(16, n), nw, x.data(), xs, na, n,
                                              out.data(), ldo);
              for (int64_t a = 0; a < na; ++a)
                for (int64_t i = 0; i < ldo; ++i) {
                  const float got = out[static_cast<size_t>(a * ldo + i)];
                  if (i >= nw) {
                    EXPECT_EQ(got, -7.0f) << "wrote past the tile";
                    continue;
                  }
                  const float want = dot_act_model(q, w.data() + ws * (16 * g0 + i), x.data() + xs * a, n);
                  if (std::isnan(want)) {
                    EXPECT_TRUE(std::isnan(got));
                    continue;
                  }
                  EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                      << "n " << n << " group " << g0 << " rows " << nw << " x " << na << " at (" << i << ", " << a
                      << "): " << got << " vs " << want;
                }
            }
          }
      }
    }
  }
  EXPECT_EQ(with_pack, 3);  // q4_0, q4_1, q8_0
  if (quant::gemm_packed_available()) {
    EXPECT_GT(ran, 0);
  }
}

// gemm_act of each K-quant (every variant this CPU runs) against an f64 product of the dequantized
// weights and the dequantized q8_K activations: relative L2 error under 1e-3 at 1, 2, 16 and 33
// activation rows (decode, the narrowest prefill tile, a full packed-pair tile, three tiles). The
// tiles only regroup exact integer sums, so what is left is float32 rounding (about 1e-7); a wrong
// lane, scale, minimum or row gives an error of order 1.
TEST(QuantAct, GemmActWithinRelL2OfF64Product) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 3 * 256, n_w = 9, n_x = 33;
  int checked = 0;
  for (const QuantType* q : quant::quant_types()) {
    if (q->block_size != 256 || !q->gemm_act) continue;
    SCOPED_TRACE(type_name(q));
    const size_t wrow = static_cast<size_t>(n / 256 * q->block_bytes), xrow = static_cast<size_t>(n / 256 * 292);
    std::vector<uint8_t> w(wrow * n_w), x(xrow * n_x);
    std::vector<double> wf(static_cast<size_t>(n * n_w)), xf(static_cast<size_t>(n * n_x));
    for (int64_t i = 0; i < n_w; ++i) {
      const auto r = quantize(q, random_weights(n, 300 + static_cast<uint32_t>(i)));
      std::copy(r.begin(), r.end(), w.begin() + static_cast<std::ptrdiff_t>(wrow * i));
      std::vector<float> d(static_cast<size_t>(n));
      q->dequantize_row(r.data(), d.data(), n);
      std::copy(d.begin(), d.end(), wf.begin() + i * n);
    }
    for (int64_t a = 0; a < n_x; ++a) {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& e : v) e = nd(rng);
      q->act->quantize_row(v.data(), x.data() + xrow * a, n);
      for (int64_t b = 0; b < n / 256; ++b) {
        const Q8K k = q8k_block(x.data() + xrow * a + 292 * b);
        for (int j = 0; j < 256; ++j) xf[static_cast<size_t>(a * n + 256 * b + j)] = static_cast<double>(k.d) * k.qs[j];
      }
    }
    for (const int64_t na : {int64_t{1}, int64_t{2}, int64_t{16}, int64_t{33}}) {
      std::vector<double> want(static_cast<size_t>(na * n_w));
      for (int64_t a = 0; a < na; ++a)
        for (int64_t i = 0; i < n_w; ++i) {
          double s = 0;
          for (int64_t e = 0; e < n; ++e) s += wf[static_cast<size_t>(i * n + e)] * xf[static_cast<size_t>(a * n + e)];
          want[static_cast<size_t>(a * n_w + i)] = s;
        }
      for (int v = 0; v < 5; ++v) {
        const auto isa = static_cast<quant::GemmIsa>(v);
        if (!quant::gemm_isa_available(isa)) continue;
        if (v > 0 && q->gemm_act_variants[v] == q->gemm_act_variants[v - 1]) continue;  // amx = avx512vnni
        std::vector<float> got(static_cast<size_t>(na * n_w));
        q->gemm_act_variants[v](w.data(), wrow, n_w, x.data(), xrow, na, n, got.data(), n_w);
        const double err = test::rel_l2(got, want);
        EXPECT_LT(err, 1e-3) << quant::gemm_isa_name(isa) << ", " << na << " rows";
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 5 * 4);  // q2_K .. q6_K, 4 row counts, at least the generic variant
}

TEST(QuantDot, ScaleChecksFindNonFiniteScales) {
  // The f16 scale fields of each block (ggml-common.h): d, and m / dmin where the type has one.
  const std::pair<DType, std::vector<int>> fields[] = {
      {DType::Q4_0, {0}},     {DType::Q4_1, {0, 2}}, {DType::Q5_0, {0}},    {DType::Q5_1, {0, 2}}, {DType::Q8_0, {0}},
      {DType::Q2_K, {80, 82}}, {DType::Q3_K, {108}}, {DType::Q4_K, {0, 2}}, {DType::Q5_K, {0, 2}}, {DType::Q6_K, {208}}};
  for (const auto& [t, offsets] : fields) {
    const QuantType* q = quant::quant_type(t);
    const auto row = quantize(q, random_weights(3 * q->block_size, 5));
    ASSERT_EQ(q->find_bad_scale(row.data(), 3), -1) << q->name;
    for (int off : offsets)
      for (uint16_t h : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e01}}) {  // +inf, -inf, NaN
        auto bad = row;
        std::memcpy(bad.data() + 2 * q->block_bytes + off, &h, 2);
        EXPECT_EQ(q->find_bad_scale(bad.data(), 3), 2) << q->name << " offset " << off;
        EXPECT_EQ(q->find_bad_scale(bad.data(), 2), -1) << q->name << " offset " << off;
      }
  }
}

// ---------------------------------------------------------------------------------------------
// One matmul (and the embedding lookup feeding it) through the cpu and reference backends.

namespace {

struct OneMatmul {
  ModelFile m;
  Graph g;
};

// tokens -> embed(token_embd [V, K], emb_type) -> matmul(w [N, K], w_type) [-> GLU with w_up].
OneMatmul one_matmul(DType emb_type, DType w_type, int64_t K, int64_t N, bool glu) {
  const int64_t V = 16;
  OneMatmul r;
  r.m.path = "quant-test";
  r.m.format = "gguf";
  auto add = [&](const std::string& name, DType t, int64_t rows, int64_t cols, uint32_t seed) {
    auto f = random_weights(rows * cols, seed);
    if (name == "token_embd.weight")
      for (auto& v : f) v *= 50;  // activations of order 1
    WeightTensor w;
    w.name = name;
    w.dtype = t;
    w.shape = {rows, cols};
    auto buf = std::make_shared<std::vector<uint8_t>>();
    if (const QuantType* q = quant::quant_type(t)) {
      *buf = quantize(q, f);
    } else {
      buf->resize(f.size() * 4);
      std::memcpy(buf->data(), f.data(), buf->size());
    }
    w.data = buf->data();
    w.nbytes = buf->size();
    r.m.owned.push_back(buf);
    r.m.add_tensor(w);
  };
  add("token_embd.weight", emb_type, V, K, 1);
  add("w", w_type, N, K, 2);
  if (glu) add("w_up", w_type, N, K, 3);
  Graph& g = r.g;
  int tokens = g.add_input("tokens");
  int x = g.add(Op::embed, {g.add_weight("token_embd.weight", emb_type, {V, K}), tokens}, {}, "x");
  int y = g.add(Op::matmul, {x, g.add_weight("w", w_type, {N, K})}, {}, "y");
  if (glu) {
    int up = g.add(Op::matmul, {x, g.add_weight("w_up", w_type, {N, K})}, {}, "up");
    y = g.add(Op::mul, {g.add(Op::silu, {y}, {}, "gate"), up}, {}, "glu");
  }
  g.add_output(y, "logits");
  return r;
}

std::vector<float> dequantized(const ModelFile& m, const std::string& name) {
  const WeightTensor& t = m.get(name);
  std::vector<float> f(static_cast<size_t>(t.numel()));
  to_f32(t.dtype, t.data, f.data(), t.numel());
  return f;
}

// f64 product over the dequantized weights: the oracle of the budget. With `act`, the activations
// are first quantized to its 8-bit blocks and used as the integer dot reads them: d_x * q_x, and for
// q8_1 the block's s field (an f16 of d * sum(q)) in place of d_x * sum(q_x) times the weights' m.
std::vector<double> f64_product(const ModelFile& m, const std::vector<int32_t>& ids, int64_t K, int64_t N, bool glu,
                                const quant::ActQuant* act = nullptr) {
  const auto emb = dequantized(m, "token_embd.weight"), w = dequantized(m, "w");
  const auto up = glu ? dequantized(m, "w_up") : std::vector<float>{};
  std::vector<double> out;
  for (int32_t id : ids) {
    std::vector<double> x(emb.begin() + id * K, emb.begin() + (id + 1) * K);
    std::vector<double> s_fix(static_cast<size_t>(K / 32), 0.0);  // per block: s - d_x * sum(q_x)
    if (act) {
      std::vector<uint8_t> xq(static_cast<size_t>(K / act->block_size * act->block_bytes));
      act->quantize_row(emb.data() + id * K, xq.data(), K);
      const bool has_s = act->block_bytes == 36;
      if (act->block_size == 256)  // q8_K: d (f32) * q
        for (int64_t b = 0; b < K / 256; ++b) {
          const uint8_t* blk = xq.data() + b * act->block_bytes;
          float d;
          std::memcpy(&d, blk, 4);
          for (int e = 0; e < 256; ++e) x[static_cast<size_t>(b * 256 + e)] = static_cast<double>(d) * static_cast<int8_t>(blk[4 + e]);
        }
      for (int64_t b = 0; act->block_size == 32 && b < K / 32; ++b) {
        const uint8_t* blk = xq.data() + b * act->block_bytes;
        const double d = f16_at(blk);
        int32_t sum = 0;
        for (int e = 0; e < 32; ++e) {
          const int8_t q = static_cast<int8_t>(blk[(has_s ? 4 : 2) + e]);
          x[static_cast<size_t>(b * 32 + e)] = d * q;
          sum += q;
        }
        if (has_s) s_fix[static_cast<size_t>(b)] = f16_at(blk + 2) - d * sum;
      }
    }
    const auto m_w = [&](const std::string& name, int64_t row, int64_t b) {  // q4_1 / q5_1 block minimum
      return f16_at(m.get(name).data + (row * K / 32 + b) * quant::quant_type(m.get(name).dtype)->block_bytes + 2);
    };
    for (int64_t j = 0; j < N; ++j) {
      double a = 0, bb = 0;
      for (int64_t k = 0; k < K; ++k) {
        a += x[static_cast<size_t>(k)] * w[static_cast<size_t>(j * K + k)];
        if (glu) bb += x[static_cast<size_t>(k)] * up[static_cast<size_t>(j * K + k)];
      }
      if (act && act->block_bytes == 36)
        for (int64_t b = 0; b < K / 32; ++b) {
          a += m_w("w", j, b) * s_fix[static_cast<size_t>(b)];
          if (glu) bb += m_w("w_up", j, b) * s_fix[static_cast<size_t>(b)];
        }
      out.push_back(glu ? a / (1 + std::exp(-a)) * bb : a);
    }
  }
  return out;
}

}  // namespace

TEST(QuantMatmul, EveryTypeWithinBudgetOfF64OnCpuAndReference) {
  const int64_t K = 512, N = 40;
  for (const QuantType* q : quant::quant_types())
    for (bool glu : {false, true})
      for (bool quant_emb : {false, true}) {
        SCOPED_TRACE(type_name(q) + (glu ? " glu" : "") + (quant_emb ? " quantized embedding" : ""));
        OneMatmul t = one_matmul(quant_emb ? q->dtype : DType::F32, q->dtype, K, N, glu);
        // The reference backend and the cpu backend with float32 activations within 1e-5. The cpu
        // backend quantizing activations to 8-bit blocks as llama.cpp (q8_0/q8_1 for q4_0 .. q8_0,
        // q8_K for the K-quants): within 1e-5 of the f64 product over those blocks, and its distance
        // to the float32-activation product printed: 0.002 .. 0.06 on these random rows, above the
        // issue's 1e-3 (the rounding of 8-bit activations itself, which llama.cpp has too), so
        // bounded here at 0.05 (q8_0/q8_1) and 0.1 (q8_K).
        for (const char* backend : {"cpu", "reference", "cpu-act-q8"}) {
          const bool act_q8 = std::string(backend) == "cpu-act-q8";
          if (act_q8 && !q->act) continue;
          BackendOptions o;
          o.threads = 2;
          o.act_quant = act_q8 ? "on" : "off";
          auto b = make_backend(act_q8 ? "cpu" : backend, t.g, t.m, o);
          // One row (decode: the fused block-by-block dot), then five (prefill: dequantized rows).
          for (std::vector<int32_t> ids : {std::vector<int32_t>{5}, std::vector<int32_t>{0, 3, 15, 7, 9}}) {
            b->reset();
            const auto got = b->forward(ids, 0);
            const auto want = f64_product(t.m, ids, K, N, glu);
            ASSERT_EQ(got.size(), want.size()) << backend;
            if (!act_q8) {
              EXPECT_LT(test::rel_l2(got, want), 1e-5) << backend << ", " << ids.size() << " rows";
              continue;
            }
            const auto want_q8 = f64_product(t.m, ids, K, N, glu, q->act);
            EXPECT_LT(test::rel_l2(got, want_q8), 1e-5) << backend << ", " << ids.size() << " rows";
            const double e = test::rel_l2(got, want);
            // q8_K's one scale per 256 elements rounds coarser than q8_0's per 32 (up to 0.06 here).
            EXPECT_LT(e, q->act->block_size == 256 ? 0.1 : 0.05) << backend << ", " << ids.size() << " rows";
            std::printf("  %s%s%s, %zu rows: 8-bit activations rel. L2 %.4f vs float32 activations\n", q->name.data(),
                        glu ? " glu" : "", quant_emb ? " q-emb" : "", ids.size(), e);
          }
        }
      }
}

TEST(QuantMatmul, DecodeAndPrefillRowsGiveTheSameBits) {
  // The fused decode dot and the prefill path (dequantize a row, then dot) agree bit for bit.
  for (const QuantType* q : quant::quant_types()) {
    for (const char* act_quant : {"off", "on"}) {
      OneMatmul t = one_matmul(q->dtype, q->dtype, 256, 24, true);
      BackendOptions o;
      o.threads = 3;
      o.act_quant = act_quant;
      auto b = make_backend("cpu", t.g, t.m, o);
      const std::vector<int32_t> ids = {2, 11, 4, 6, 1};
      const auto all = b->forward(ids, 0);
      for (size_t i = 0; i < ids.size(); ++i) {
        b->reset();
        const auto one = b->forward(std::span<const int32_t>(&ids[i], 1), 0);
        ASSERT_EQ(one.size(), 24u);
        EXPECT_EQ(std::memcmp(one.data(), all.data() + i * 24, 24 * 4), 0) << q->name << " row " << i << " act_quant " << act_quant;
      }
    }
  }
}

TEST(QuantCuda, CodegenReadsEveryTypeRaw) {
  // The CUDA device functions read every block type as it is (device/quant.cuh): the generated
  // source picks the type's struct per weight and bakes in the padded row stride.
  const ModelFile f32 = load_model(std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
  for (const quant::QuantType* q : quant::quant_types()) {
    if (q->block_size != 32) continue;  // stories260K's 64-wide rows hold whole 32-element blocks only
    const ModelFile m = quant::quantize_model(f32, q->dtype);
    CompileOptions co;
    co.workers = 4;
    const Program p = compile_program(build_graph(m, BuildOptions{64, false}), co);
    cuda::CudaCodegenOptions o;
    o.weight_dtypes = cuda::device_weight_dtypes(p);
    EXPECT_EQ(o.weight_dtypes.front(), p.weights.front().dtype);
    const std::string code = cuda::generate_cuda(p, o).code;
    std::string name = q->dtype == DType::IQ4_NL ? "MkIQ4_NL" : "MkQ" + std::string(q->name.substr(1));
    EXPECT_NE(code.find("using W = " + name + ";"), std::string::npos) << q->name;
    EXPECT_NE(code.find(fmt::format("WRS = {};", cuda::device_row_bytes(q->dtype, 64))), std::string::npos) << q->name;
  }
}
