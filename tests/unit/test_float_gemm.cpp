// The float32 many-row matmul tiles (src/backend/cpu/float_gemm.h): every ISA variant this CPU runs
// gives dot_f32's bits per (row, column) for row and column counts that are not multiples of the
// tile, K with tails, and strided rows; and end to end, a batched decode step of several sequences
// (the many-row tiles, the GLU's gate and up included) gives each sequence the bits it gets alone
// (one row: dot()).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "archs/arch.h"
#include "backend/backend.h"
#include "backend/cpu/float_gemm.h"
#include "model/model_file.h"

namespace mk {
namespace {

using cpu::FloatIsa;

const FloatIsa kIsas[] = {FloatIsa::portable, FloatIsa::avx2, FloatIsa::avx512};

// Values over several binades and both signs, so that the order of the adds decides low bits.
std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> m(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 6);
  std::vector<float> v(n);
  for (float& f : v) f = std::ldexp(m(rng), e(rng));
  return v;
}

TEST(FloatGemm, EveryIsaEqualsDotPerElementForAllShapes) {
  const int64_t Ks[] = {1, 7, 15, 16, 17, 31, 48, 100, 259};
  const int64_t Rs[] = {1, 2, 3, 4, 5, 6, 7, 9, 16, 17};
  const int64_t Cs[] = {1, 2, 3, 4, 5, 6, 7, 9};
  int ran = 0;
  for (FloatIsa isa : kIsas) {
    if (!cpu::float_isa_runs(isa)) {
      std::printf("[ SKIPPED  ] %s: this CPU does not run it\n", cpu::float_isa_name(isa));
      continue;
    }
    ++ran;
    for (int64_t K : Ks) {
      const int64_t ldx = K + 3;  // strided activation rows
      const std::vector<float> x = random_floats(static_cast<size_t>(17 * ldx), static_cast<uint32_t>(K));
      const std::vector<float> wall = random_floats(static_cast<size_t>(9 * K), static_cast<uint32_t>(1000 + K));
      std::vector<const float*> w;
      for (int64_t j = 8; j >= 0; --j) w.push_back(wall.data() + j * K);  // rows in any order
      for (int64_t R : Rs)
        for (int64_t C : Cs) {
          const int64_t ldo = C + 2;
          std::vector<float> out(static_cast<size_t>(R * ldo), -7.0f);
          cpu::gemm_f32(x.data(), ldx, R, w.data(), C, K, out.data(), ldo, isa);
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < ldo; ++j) {
              const float got = out[static_cast<size_t>(r * ldo + j)];
              const float want = j < C ? cpu::dot_f32(x.data() + r * ldx, w[static_cast<size_t>(j)], K) : -7.0f;
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << cpu::float_isa_name(isa) << " R=" << R << " C=" << C << " K=" << K << " row " << r << " column "
                  << j << (j >= C ? " (past C: must stay untouched)" : "") << ": " << got << " vs " << want;
            }
        }
    }
  }
  EXPECT_GE(ran, 1);
  EXPECT_EQ(cpu::float_isa_runs(cpu::float_isa()), true);
}

// The bit-for-bit checks above mean something: the same products summed in index order (one lane)
// differ from dot_f32's 16 lanes and tree in low bits for this data.
TEST(FloatGemm, LaneOrderChangesBitsSoTheCheckCanFail) {
  const int64_t K = 259;
  const std::vector<float> a = random_floats(K, 1), b = random_floats(K, 2);
  int differ = 0;
  for (int64_t off = 0; off < 16; ++off) {
    float seq = 0;
    for (int64_t i = off; i < K; ++i) seq += a[static_cast<size_t>(i)] * b[static_cast<size_t>(i)];
    differ +=
        std::bit_cast<uint32_t>(seq) != std::bit_cast<uint32_t>(cpu::dot_f32(a.data() + off, b.data() + off, K - off));
  }
  EXPECT_GT(differ, 0);
}

TEST(FloatGemm, DotF32KeepsSixteenLanesAndTheTree) {
  // 1e8 in lane 0 swallows a 1 added in sequence order, but lanes 1..15 each hold their own 1 until the tree.
  std::vector<float> a(32, 1.0f), b(32, 1.0f);
  a[0] = 1e8f;
  a[16] = -1e8f;
  EXPECT_EQ(cpu::dot_f32(a.data(), b.data(), 32), 30.0f);  // lane 0: 1e8 - 1e8 = 0; 15 lanes of 2
}

// A decode step of n sequences in one batch (n rows: the many-row tiles) against each sequence's
// decode alone (one row: dot), bit for bit, after the same prompts. Llama with SwiGLU (gate and up
// tiles), float32 and bfloat16 weights (converted rows).
void check_batched_decode_bits(const std::string& path, int n_seqs) {
  ModelFile m = load_model(path);
  BuildOptions o;
  o.n_ctx = 32;
  o.kv_pool_tokens = 32 * n_seqs;
  o.kv_block_size = 4;
  Graph g = build_graph(m, o);
  const int64_t n_vocab = read_hparams(m).n_vocab;
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend("cpu", g, m, bo);
  std::vector<std::vector<int32_t>> prompts, blocks;
  for (int s = 0; s < n_seqs; ++s) {
    std::vector<int32_t> p;
    for (int i = 0; i < 5 + s; ++i) p.push_back(static_cast<int32_t>((i * 37 + s * 11 + 1) % n_vocab));
    prompts.push_back(p);
    std::vector<int32_t> bl;
    for (int j = 0; j < 8; ++j) bl.push_back(j * n_seqs + s);  // interleaved pool blocks
    blocks.push_back(bl);
  }
  auto next_token = [&](int s) { return static_cast<int32_t>((s * 13 + 5) % n_vocab); };
  // Alone: each sequence's prompt, then one decode row.
  std::vector<std::vector<float>> alone;
  for (int s = 0; s < n_seqs; ++s) {
    b->reset();
    b->forward(prompts[static_cast<size_t>(s)], 0);
    const int32_t t = next_token(s);
    alone.push_back(
        b->forward(std::span<const int32_t>(&t, 1), static_cast<int64_t>(prompts[static_cast<size_t>(s)].size())));
  }
  // Batched: each prompt in its own step (rows per step <= n_ctx), then every decode row in one step.
  b->reset();
  StepBatch dec;
  dec.block_tables = blocks;
  for (int s = 0; s < n_seqs; ++s) {
    const auto& p = prompts[static_cast<size_t>(s)];
    StepBatch pre;
    pre.block_tables = blocks;
    for (size_t i = 0; i < p.size(); ++i) {
      pre.tokens.push_back(p[i]);
      pre.positions.push_back(static_cast<int32_t>(i));
      pre.seq.push_back(s);
    }
    pre.logit_rows.push_back(static_cast<int32_t>(p.size()) - 1);
    b->forward(pre);
    dec.tokens.push_back(next_token(s));
    dec.positions.push_back(static_cast<int32_t>(p.size()));
    dec.seq.push_back(s);
    dec.logit_rows.push_back(s);
  }
  const std::vector<float> got = b->forward(dec);
  ASSERT_EQ(got.size(), static_cast<size_t>(n_seqs * n_vocab));
  for (int s = 0; s < n_seqs; ++s) {
    ASSERT_EQ(alone[static_cast<size_t>(s)].size(), static_cast<size_t>(n_vocab));
    EXPECT_EQ(
        std::memcmp(got.data() + s * n_vocab, alone[static_cast<size_t>(s)].data(), static_cast<size_t>(n_vocab) * 4),
        0)
        << path << ": sequence " << s << " of " << n_seqs << " decoded in a batch differs from alone";
  }
}

const std::string kHf = std::string(MK_SHARED_DIR) + "/fixtures/hf/";

TEST(E2EFloatBatch, LlamaFloat32BatchedDecodeRowsHaveTheBitsOfRowsAlone) {
  for (int n : {4, 6, 9}) check_batched_decode_bits(kHf + "llama_gqa_float32", n);
}
TEST(E2EFloatBatch, LlamaBfloat16BatchedDecodeRowsHaveTheBitsOfRowsAlone) {
  check_batched_decode_bits(kHf + "llama_gqa_bfloat16", 6);
}
TEST(E2EFloatBatch, Stories260KBatchedDecodeRowsHaveTheBitsOfRowsAlone) {
  check_batched_decode_bits(std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.bin", 7);
}

}  // namespace
}  // namespace mk
