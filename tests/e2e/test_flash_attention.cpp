// Flash-decoding attention (CompileOptions::attn_splits): attention_partial tiles (KV group x
// split of each row's cached positions) and attention_combine (log-sum-exp merge).
//   - op level: a graph of attention alone on random q/k/v (paged, ragged batch, rows shorter than
//     the split count) gives the unsplit op's output within 1e-6 (relative) for S = 2, 3, 4, 7, 16
//     on cpu and cuda-emu; with soft-capped scores too (S = 1, 3);
//   - stories260K reproduces llama2.c's greedy reference token for token with S = 1, 2, 4, 7 on cpu
//     and cuda-emu (prompt rows shorter than S included);
//   - the HF fixtures stay within their tolerances with 3 splits (all on cpu, float32 on cuda-emu);
//   - the program has the expected instructions, and the race check on cuda-emu finds no race;
//   - attention tiles over parts of the rows (CompileOptions::attn_row_parts) give the same bits as
//     whole rows on cpu and cuda-emu, and auto picks them where the KV groups leave workers idle;
//   - the q/k/v matmuls feeding adjacent-pair RoPE and attention tiled in parts of heads give the
//     same bits as whole-head tiles (CompileOptions::head_tiles) on cpu and cuda-emu.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "archs/arch.h"
#include "backend/backend.h"
#include "backend/cuda/device_runtime.h"
#include "ir/graph.h"
#include "ir/ops.h"
#include "model/hf.h"
#include "model/model_file.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "support/compare.h"
#include "support/hf_fixtures.h"
#include "support/tiny_model.h"

namespace mk {
namespace {

namespace fs = std::filesystem;
const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/";

// Attention alone: q, k, v are rows of random tables picked by the token ids (embed), K/V stored
// in a paged pool, the attention output is the graph's "logits" output (every row).
struct AttnModel {
  int64_t n_vocab = 40, n_head = 6, n_head_kv = 2, head_dim = 20, n_ctx = 48, block = 4, pool = 192;
  double softcap = 0;  // the attention op's score soft-cap (0 = none)
};

ModelFile attn_model(const AttnModel& c, uint64_t seed) {
  ModelFile m;
  m.path = "attention-test";
  m.format = "test";
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto add = [&](const std::string& name, int64_t cols, float scale) {
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(c.n_vocab * cols) * 4);
    float* f = reinterpret_cast<float*>(buf->data());
    for (int64_t i = 0; i < c.n_vocab * cols; ++i) f[i] = scale * nd(rng);
    WeightTensor t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = {c.n_vocab, cols};
    t.data = buf->data();
    t.nbytes = buf->size();
    m.owned.push_back(buf);
    m.add_tensor(t);
  };
  add("q.weight", c.n_head * c.head_dim, 1.0f);
  add("k.weight", c.n_head_kv * c.head_dim, 1.0f);
  add("v.weight", c.n_head_kv * c.head_dim, 1.0f);
  return m;
}

Graph attn_graph(const AttnModel& c) {
  Graph g;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  int tokens = g.add_input("tokens");
  g.add_input("positions");
  int q = g.add(Op::embed, {g.add_weight("q.weight", DType::F32, {c.n_vocab, c.n_head * c.head_dim}), tokens}, {}, "q");
  int k = g.add(Op::embed, {g.add_weight("k.weight", DType::F32, {c.n_vocab, kv_dim}), tokens}, {}, "k");
  int v = g.add(Op::embed, {g.add_weight("v.weight", DType::F32, {c.n_vocab, kv_dim}), tokens}, {}, "v");
  int kc = g.add(Op::kv_store, {k, g.add_kv_cache(0, "k", c.n_ctx, kv_dim, c.pool, c.block)}, {}, "k_cache");
  int vc = g.add(Op::kv_store, {v, g.add_kv_cache(0, "v", c.n_ctx, kv_dim, c.pool, c.block)}, {}, "v_cache");
  // A scale of 1.5 / sqrt(head_dim) sharpens the softmax, so that the splits' maxima differ.
  Attrs attrs = {{"n_head", c.n_head}, {"n_head_kv", c.n_head_kv}, {"head_dim", c.head_dim},
                 {"scale", 1.5 / std::sqrt(static_cast<double>(c.head_dim))}};
  if (c.softcap > 0) attrs["softcap"] = c.softcap;
  int a = g.add(Op::attention, {q, kc, vc}, attrs, "attn");
  g.add_output(a, "logits");
  return g;
}

// Three ragged steps over scattered blocks: sequence 0 prefills 9 rows (row 0 has one position,
// fewer than every S > 1) then decodes; sequence 1 has 1 row, then 30; sequence 2 arrives late
// with 2 rows. Returns every row's output of every step, concatenated.
std::vector<float> run_attn(const std::string& backend, int splits, int threads, const AttnModel& c, const ModelFile& m,
                            int row_parts = 0) {
  Graph g = attn_graph(c);
  BackendOptions bo;
  bo.threads = threads;
  bo.attn_splits = splits;
  bo.attn_row_parts = row_parts;
  auto b = make_backend(backend, g, m, bo);
  std::vector<std::vector<int32_t>> blocks = {{7, 30, 2, 11, 19, 40}, {1, 44, 5, 9, 33, 21, 16, 27, 3}, {12, 6}};
  struct Rows {
    int seq;
    int32_t from, n;
  };
  const std::vector<std::vector<Rows>> steps = {
      {{0, 0, 9}, {1, 0, 1}},
      {{1, 1, 30}, {0, 9, 1}, {2, 0, 2}},
      {{2, 2, 1}, {0, 10, 1}, {1, 31, 1}},
  };
  std::mt19937 rng(99);
  std::vector<float> all;
  for (const auto& step : steps) {
    StepBatch batch;
    batch.block_tables = blocks;
    for (const Rows& r : step)
      for (int32_t i = 0; i < r.n; ++i) {
        batch.tokens.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(c.n_vocab)));
        batch.positions.push_back(r.from + i);
        batch.seq.push_back(r.seq);
      }
    for (int32_t i = 0; i < static_cast<int32_t>(batch.tokens.size()); ++i) batch.logit_rows.push_back(i);
    std::vector<float> out = b->forward(batch);
    EXPECT_EQ(out.size(), batch.tokens.size() * static_cast<size_t>(c.n_head * c.head_dim));
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

class FlashAttentionOp : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FlashAttentionOp, CombinedPartialsEqualUnsplitAttention) {
  auto [backend, splits] = GetParam();
  AttnModel c;
  ModelFile m = attn_model(c, 5);
  const std::vector<float> want = run_attn("reference", -1, 1, c, m);
  const std::vector<float> unsplit = run_attn("cpu", 1, 2, c, m);
  ASSERT_EQ(unsplit.size(), want.size());
  EXPECT_LT(test::rel_l2(unsplit, want), 1e-6);
  const std::vector<float> got = run_attn(backend, splits, 3, c, m);
  ASSERT_EQ(got.size(), want.size());
  // Per head vector: relative to its own norm, so small outputs are held to the same standard.
  const int64_t hd = c.head_dim;
  double worst = 0;
  for (size_t i = 0; i < want.size(); i += static_cast<size_t>(hd)) {
    std::vector<float> a(got.begin() + static_cast<int64_t>(i), got.begin() + static_cast<int64_t>(i) + hd);
    std::vector<float> w(want.begin() + static_cast<int64_t>(i), want.begin() + static_cast<int64_t>(i) + hd);
    worst = std::max(worst, test::rel_l2(a, w));
  }
  EXPECT_LT(worst, 1e-6) << backend << " attn_splits " << splits;
  EXPECT_NE(got, std::vector<float>(want.size(), 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Splits, FlashAttentionOp,
                         ::testing::Combine(::testing::Values("cpu", "cuda-emu"), ::testing::Values(2, 3, 4, 7, 16)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_s" + std::to_string(std::get<1>(info.param));
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// Soft-capped scores (Gemma 2: s -> cap * tanh(s / cap) before the softmax) on every path: whole
// and split attention on cpu and cuda-emu equal the reference's double-precision op within 1e-6,
// and the cap changes the output (scores here have a spread of ~1.5, the cap is 1).
TEST(FlashAttentionSoftcap, EveryPathCapsTheScoresAsTheReference) {
  AttnModel c;
  c.softcap = 1.0;
  ModelFile m = attn_model(c, 5);
  const std::vector<float> want = run_attn("reference", -1, 1, c, m);
  AttnModel uncapped = c;
  uncapped.softcap = 0;
  EXPECT_GT(test::rel_l2(run_attn("reference", -1, 1, uncapped, m), want), 0.05);
  for (const char* backend : {"cpu", "cuda-emu"})
    for (const int splits : {1, 3}) {
      const std::vector<float> got = run_attn(backend, splits, 3, c, m);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LT(test::rel_l2(got, want), 1e-6) << backend << " attn_splits " << splits;
    }
}

TEST(FlashAttentionProgram, SplitsLowerToPartialAndCombine) {
  AttnModel c;
  Graph g = attn_graph(c);
  CompileOptions co;
  co.workers = 5;
  co.max_tokens = 8;
  co.attn_splits = 3;
  Program p = compile_program(g, co);
  int partial = 0, combine = 0, plain = 0;
  for (const Instr& in : p.instrs) {
    partial += in.opcode == Opcode::attention_partial;
    combine += in.opcode == Opcode::attention_combine;
    plain += in.opcode == Opcode::attention;
  }
  EXPECT_EQ(partial, c.n_head_kv * 3);  // one tile per (KV group, split)
  EXPECT_GE(combine, 1);
  EXPECT_EQ(plain, 0);
  // auto: ceil(workers / n_head_kv) splits; 1 keeps the single op.
  co.attn_splits = 0;
  co.workers = 9;
  p = compile_program(g, co);
  partial = 0;
  for (const Instr& in : p.instrs) partial += in.opcode == Opcode::attention_partial;
  EXPECT_EQ(partial, c.n_head_kv * 5);
  co.attn_splits = 1;
  p = compile_program(g, co);
  for (const Instr& in : p.instrs) EXPECT_NE(in.opcode, Opcode::attention_partial);
  co.attn_splits = -2;
  EXPECT_THROW(compile_program(g, co), Error);
}

// The validator accepts the split program, the race check on cuda-emu finds no race in it (prefill
// and decode, 3 blocks), and finds the race when a combine tile no longer waits for its partials.
TEST(FlashAttentionRaceCheck, SplitProgramHasNoRaceAndCombineWaitsForItsPartials) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, {32, false});
  CompileOptions co;
  co.workers = 3;
  co.max_tokens = 8;
  co.attn_splits = 4;
  Program p = compile_program(g, co);
  ASSERT_TRUE(check_program(p).empty());
  BackendOptions bo;
  cuda::EmuOptions eo;
  eo.blocks = 3;
  eo.threads = 64;
  {
    auto b = make_cuda_emu_program_backend(p, m, bo, eo);
    std::vector<float> l = b->forward(std::vector<int32_t>{1, 403, 407, 261, 378}, 0);
    for (int64_t pos = 5; pos < 12; ++pos) l = b->forward(std::vector<int32_t>{static_cast<int32_t>(pos * 7)}, pos);
    EXPECT_EQ(l.size(), 512u);
  }
  // Drop every wait of the last layer's first combine tile: it reads partials nobody ordered.
  int victim = -1;
  for (size_t i = 0; i < p.instrs.size(); ++i)
    if (p.instrs[i].opcode == Opcode::attention_combine) victim = static_cast<int>(i);
  ASSERT_GE(victim, 0);
  while (victim > 0 && p.instrs[static_cast<size_t>(victim - 1)].op == p.instrs[static_cast<size_t>(victim)].op) --victim;
  ASSERT_FALSE(p.instrs[static_cast<size_t>(victim)].waits.empty());
  p.instrs[static_cast<size_t>(victim)].waits.clear();
  EXPECT_FALSE(check_program(p).empty()) << "the validator must reject a combine that waits for nothing";
  auto b = make_cuda_emu_program_backend(std::move(p), m, bo, eo);
  std::string msg;
  try {
    for (int64_t pos = 0; pos < 12; ++pos) b->forward(std::vector<int32_t>{static_cast<int32_t>(1 + pos * 7)}, pos);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("race:"), std::string::npos) << msg;
}

// Row parts: every row's attention is computed alone, so cutting the rows among tiles changes no
// bit (the steps have 10, 33 and 3 rows: 8 parts leave some parts empty in the last step).
class AttnRowParts : public ::testing::TestWithParam<std::string> {};

TEST_P(AttnRowParts, AnyCutOfTheRowsGivesTheSameBits) {
  AttnModel c;
  c.n_head = 9;
  c.n_head_kv = 3;  // SmolLM2's grouping: 3 KV groups of 3 heads
  ModelFile m = attn_model(c, 11);
  const std::vector<float> whole = run_attn(GetParam(), 1, 2, c, m, 1);
  ASSERT_EQ(whole.size(), size_t{46} * static_cast<size_t>(c.n_head * c.head_dim));
  EXPECT_LT(test::rel_l2(whole, run_attn("reference", -1, 1, c, m)), 1e-6);
  for (int parts : {2, 3, 8}) EXPECT_EQ(run_attn(GetParam(), 1, 2, c, m, parts), whole) << GetParam() << " row parts " << parts;
  EXPECT_EQ(run_attn(GetParam(), 1, 3, c, m, 4), whole) << GetParam() << " 3 workers, 4 row parts";
  EXPECT_EQ(run_attn(GetParam(), 1, 2, c, m, 0), whole) << GetParam() << " auto (2 parts for 3 groups on 2 workers)";
}

INSTANTIATE_TEST_SUITE_P(Backends, AttnRowParts, ::testing::Values("cpu", "cuda-emu"),
                         [](const auto& info) { return info.param == "cpu" ? std::string("cpu") : std::string("cuda_emu"); });

TEST(AttnRowPartsProgram, AutoCutsTheRowsWhenTheGroupsLeaveWorkersIdle) {
  AttnModel c;
  c.n_head = 9;
  c.n_head_kv = 3;
  Graph g = attn_graph(c);
  CompileOptions co;
  co.max_tokens = 16;
  // (tiles, row parts) of the attention op: 3 KV groups of 3 heads (odd: never cut into heads)
  auto tiles = [&](int workers, int64_t asked) {
    co.workers = workers;
    co.attn_row_parts = asked;
    Program p = compile_program(g, co);
    EXPECT_TRUE(check_program(p).empty()) << workers << " workers";
    std::vector<const Instr*> a;
    for (const Instr& in : p.instrs)
      if (in.opcode == Opcode::attention) a.push_back(&in);
    EXPECT_FALSE(a.empty());
    for (const Instr* in : a) {  // tiles part-major: every column tile of part 0, then of part 1 ...
      EXPECT_EQ(in->row_parts, a[0]->row_parts);
      EXPECT_EQ(in->row_part, in->tile / 3) << "tile " << in->tile;
      EXPECT_EQ(in->c0, (in->tile % 3) * 3 * c.head_dim) << "tile " << in->tile;
    }
    return std::pair<size_t, int32_t>{a.size(), a.empty() ? 0 : a[0]->row_parts};
  };
  EXPECT_EQ(tiles(1, 0), (std::pair<size_t, int32_t>{3, 1}));  // one worker: nothing to balance
  EXPECT_EQ(tiles(2, 0), (std::pair<size_t, int32_t>{6, 2}));  // 3 tiles keep 2 workers 75% busy; 6: 100%
  EXPECT_EQ(tiles(3, 0), (std::pair<size_t, int32_t>{3, 1}));
  EXPECT_EQ(tiles(4, 0), (std::pair<size_t, int32_t>{12, 4}));
  EXPECT_EQ(tiles(16, 0), (std::pair<size_t, int32_t>{15, 5}));  // 15 of 16 workers: >= 90%
  EXPECT_EQ(tiles(2, 1), (std::pair<size_t, int32_t>{3, 1}));
  EXPECT_EQ(tiles(3, 5), (std::pair<size_t, int32_t>{15, 5}));
  co.max_tokens = 1;  // one row per step: nothing to cut
  EXPECT_EQ(tiles(2, 0), (std::pair<size_t, int32_t>{3, 1}));
  co.attn_row_parts = -1;
  EXPECT_THROW(compile_program(g, co), Error);
  // the listing names the part of a cut tile
  co.max_tokens = 16;
  co.workers = 2;
  co.attn_row_parts = 0;
  const std::string listing = compile_program(g, co).listing();
  EXPECT_NE(listing.find("[0:60) rows 1/2 wait"), std::string::npos) << listing;
}

// q/k/v tiles in 16-column units, parts of heads (the default since 2026-12-06; before, whole heads,
// which left a 1B's q/k/v on 48 of an H200's 132 SMs): RoPE over adjacent pairs and attention do not
// care where a tile starts, so the bits equal whole-head tiles'. Rotated-halves RoPE (a pair spans
// the head) keeps whole heads.
class HeadTiles : public ::testing::TestWithParam<std::string> {};

TEST_P(HeadTiles, PartsOfHeadsGiveTheSameBits) {
  test::TinyLlama c;
  c.n_vocab = 40, c.n_embd = 64, c.n_head = 2, c.n_head_kv = 1, c.n_ff = 48;  // head_dim 32: 2 units of 16
  const ModelFile m = test::make_tiny_llama(c);
  const Graph g = build_graph(m, BuildOptions{32, false});
  // Tiles of the RoPE matmuls (q, k) that start inside a head, and of the ones attention reads.
  auto inside = [&](bool head_tiles) {
    CompileOptions co;
    co.workers = 4;
    co.max_tokens = 8;
    co.head_tiles = head_tiles;
    const Program p = compile_program(g, co);
    int n = 0;
    for (const Instr& in : p.instrs) {
      const OpDesc& op = p.ops[static_cast<size_t>(in.op)];
      if (op.opcode == Opcode::matmul && op.head_dim > 0 && in.c0 % op.head_dim) ++n;
    }
    return n;
  };
  EXPECT_EQ(inside(true), 0);
  EXPECT_GE(inside(false), 4);  // q's and k's second half-heads, in both layers
  auto run = [&](bool head_tiles, const std::string& backend) {
    BackendOptions bo;
    bo.threads = 4;
    bo.head_tiles = head_tiles;
    auto b = make_backend(backend, g, m, bo);
    std::vector<float> all = b->forward(std::vector<int32_t>{1, 5, 9, 13, 17, 21}, 0);
    for (int32_t i = 0, tok = 3; i < 4; ++i, tok = (tok * 7 + 2) % 40) {
      const std::vector<float> l = b->forward(std::vector<int32_t>{tok}, 6 + i);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> heads = run(true, GetParam());
  ASSERT_EQ(heads.size(), size_t{5} * 40);
  EXPECT_EQ(run(false, GetParam()), heads) << GetParam();
  EXPECT_LT(test::rel_l2(heads, run(false, "reference")), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Backends, HeadTiles, ::testing::Values("cpu", "cuda-emu"),
                         [](const auto& info) { return info.param == "cpu" ? std::string("cpu") : std::string("cuda_emu"); });

TEST(HeadTilesProgram, RotatedHalvesKeepWholeHeads) {
  // An HF Llama rotates halves of each head: its q/k tiles stay whole heads on any worker count.
  const ModelFile m = load_model((test::kHfFixtures / "llama_gqa_float32").string());
  const Graph g = build_graph(m, BuildOptions{64, false});
  CompileOptions co;
  co.workers = 16;
  co.max_tokens = 8;
  const Program p = compile_program(g, co);
  int rope_tiles = 0;
  for (const Instr& in : p.instrs) {
    const OpDesc& op = p.ops[static_cast<size_t>(in.op)];
    if (op.opcode != Opcode::matmul || (op.epi != Epi::rope && op.epi != Epi::rope_store)) continue;
    ASSERT_TRUE(op.rope_halves) << op.name;
    EXPECT_EQ(in.c0 % op.head_dim, 0) << op.name;
    EXPECT_EQ((in.c1 - in.c0) % op.head_dim, 0) << op.name;
    ++rope_tiles;
  }
  EXPECT_GT(rope_tiles, 0);
}

nlohmann::json greedy_cases() {
  std::ifstream f(kStories + "reference_greedy.json");
  EXPECT_TRUE(f.good()) << "missing " << kStories << "reference_greedy.json";
  return nlohmann::json::parse(f);
}

class E2EFlashStories : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(E2EFlashStories, ReproducesRunCGreedy) {
  auto [backend, splits] = GetParam();
  SessionOptions so;
  so.model_path = kStories + "stories260K.gguf";
  so.backend = backend;
  so.backend_options.threads = 3;
  so.backend_options.attn_splits = splits;
  Session s(so);
  for (const auto& c : greedy_cases()) {
    s.reset();
    GenerateOptions go;
    go.prompt = c["prompt"].get<std::string>();
    go.sampler.temperature = 0;
    go.n_new = static_cast<int>(c["generated_ids"].size());
    GenerateResult r = generate(s, go);
    EXPECT_EQ(r.generated_ids, c["generated_ids"].get<std::vector<int32_t>>())
        << backend << " attn_splits " << splits << ", prompt '" << go.prompt << "'";
  }
}

// (cuda-emu with one op per KV group is E2ECudaEmuStories.)
INSTANTIATE_TEST_SUITE_P(E2EFlash, E2EFlashStories,
                         ::testing::Values(std::tuple<std::string, int>{"cpu", 1}, std::tuple<std::string, int>{"cpu", 2},
                                           std::tuple<std::string, int>{"cpu", 4}, std::tuple<std::string, int>{"cpu", 7},
                                           std::tuple<std::string, int>{"cuda-emu", 2},
                                           std::tuple<std::string, int>{"cuda-emu", 4},
                                           std::tuple<std::string, int>{"cuda-emu", 7}),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_s" + std::to_string(std::get<1>(info.param));
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

class E2EFlashHf : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(E2EFlashHf, LogitsMatchTransformers) {
  auto [backend, fixture] = GetParam();
  BackendOptions bo;
  bo.threads = 3;
  bo.attn_splits = 3;
  test::expect_logits_match_transformers(fixture, backend, bo);
}

// cuda-emu: the float32 fixtures (each builds its own device source on the host: seconds apiece;
// the bf16 ones differ only in the weight loads, which E2ECudaEmuHf covers).
std::vector<std::tuple<std::string, std::string>> hf_cases() {
  std::vector<std::tuple<std::string, std::string>> r;
  for (const std::string& f : test::hf_fixture_names()) {
    r.emplace_back("cpu", f);
    if (f.ends_with("_float32")) r.emplace_back("cuda-emu", f);
  }
  return r;
}
INSTANTIATE_TEST_SUITE_P(E2EFlash, E2EFlashHf, ::testing::ValuesIn(hf_cases()),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace mk
