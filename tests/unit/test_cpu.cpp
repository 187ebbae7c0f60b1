// The CPU interpreter against the reference backend, and its determinism.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "archs/arch.h"
#include "backend/backend.h"
#include "backend/cpu/interpreter.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/vmath.h"
#include "model/synth.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "support/compare.h"
#include "support/error.h"
#include "support/tiny_model.h"

using namespace mk;

namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/";

// Logits of a prompt step then `decode` single-token steps, concatenated.
std::vector<float> run_steps(Backend& b, const std::vector<int32_t>& prompt, int decode, int32_t vocab) {
  std::vector<float> all = b.forward(prompt, 0);
  int64_t n_past = static_cast<int64_t>(prompt.size());
  int32_t tok = prompt.back();
  for (int i = 0; i < decode; ++i) {
    tok = static_cast<int32_t>((tok * 7 + 3) % vocab);
    auto l = b.forward(std::span<const int32_t>(&tok, 1), n_past++);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_err = std::max(max_err, std::abs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
  }
  EXPECT_LE(max_err, tol * std::max(1.0, max_ref)) << what << ": max abs error " << max_err << " (max |ref| " << max_ref << ")";
}

BackendOptions cpu_opts(int threads, const std::string& schedule = "dynamic") {
  BackendOptions o;
  o.threads = threads;
  o.schedule = schedule;
  return o;
}

}  // namespace

TEST(CpuBackend, MatchesReferenceOnTinyModels) {
  struct Case {
    const char* what;
    test::TinyLlama cfg;
  };
  std::vector<Case> cases;
  cases.push_back({"f32 gqa", {}});
  test::TinyLlama tied;
  tied.tied = true;
  tied.n_head_kv = 4;
  cases.push_back({"tied mha", tied});
  test::TinyLlama bf;
  bf.dtype = DType::BF16;
  cases.push_back({"bf16", bf});
  test::TinyLlama hf;
  hf.dtype = DType::F16;
  hf.n_head_kv = 1;
  cases.push_back({"f16 mqa", hf});
  // more query heads per KV head than one attention pass takes (kAttnPassHeads = 8): 16 = 8 + 8, 12 = 8 + 4
  test::TinyLlama mqa16;
  mqa16.n_embd = 64, mqa16.n_head = 16, mqa16.n_head_kv = 1;
  cases.push_back({"f32 mqa 16 heads", mqa16});
  test::TinyLlama gqa12;
  gqa12.n_embd = 96, gqa12.n_head = 24, gqa12.n_head_kv = 2;
  cases.push_back({"f32 gqa 12 heads per group", gqa12});
  for (const auto& c : cases) {
    ModelFile m = test::make_tiny_llama(c.cfg);
    Graph g = build_graph(m, BuildOptions{c.cfg.n_ctx, false});
    auto ref = make_backend("reference", g, m, {});
    std::vector<int32_t> prompt = {1, 5, 9, 13, 2, 40, 7};
    auto want = run_steps(*ref, prompt, 6, static_cast<int32_t>(c.cfg.n_vocab));
    for (int threads : {1, 3}) {
      auto cpu = make_backend("cpu", g, m, cpu_opts(threads));
      expect_close(run_steps(*cpu, prompt, 6, static_cast<int32_t>(c.cfg.n_vocab)), want, 2e-5,
                   std::string(c.what) + " threads " + std::to_string(threads));
    }
  }
}

TEST(CpuBackend, AllLogitsAndChunkedPrefillMatchReference) {
  test::TinyLlama cfg;
  cfg.n_ctx = 600;
  ModelFile m = test::make_tiny_llama(cfg);
  for (bool all : {true, false}) {
    Graph g = build_graph(m, BuildOptions{cfg.n_ctx, all});
    auto ref = make_backend("reference", g, m, {});
    std::vector<int32_t> prompt;
    for (int i = 0; i < 300; ++i) prompt.push_back((i * 5 + 1) % 48);  // > max_tokens (256): two steps
    auto cpu = make_backend("cpu", g, m, cpu_opts(2));
    expect_close(cpu->forward(prompt, 0), ref->forward(prompt, 0), 2e-5, all ? "all logits" : "last logits");
  }
}

TEST(CpuBackend, MatchesReferenceOnStories260K) {
  ModelFile m = load_model(kStories + "stories260K.bin");
  Graph g = build_graph(m, BuildOptions{512, false});
  auto ref = make_backend("reference", g, m, {});
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432};
  auto want = run_steps(*ref, prompt, 20, 512);
  auto cpu = make_backend("cpu", g, m, cpu_opts(2));
  expect_close(run_steps(*cpu, prompt, 20, 512), want, 1e-5, "stories260K");
}

TEST(CpuBackend, BitwiseIdenticalAcrossThreadsSchedulesAndFusion) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, BuildOptions{128, false});
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286};
  auto base_backend = make_backend("cpu", g, m, cpu_opts(1));
  const auto base = run_steps(*base_backend, prompt, 12, 512);
  for (int threads : {1, 2, 3, 4, 8})
    for (const char* schedule : {"dynamic", "static-rr", "static-cp"}) {
      auto b = make_backend("cpu", g, m, cpu_opts(threads, schedule));
      auto got = run_steps(*b, prompt, 12, 512);
      ASSERT_EQ(got.size(), base.size());
      EXPECT_EQ(0, std::memcmp(got.data(), base.data(), base.size() * 4)) << threads << " threads, " << schedule;
    }
}

TEST(CpuBackend, FusedAndUnfusedProgramsGiveTheSameBits) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, BuildOptions{64, false});
  std::vector<int32_t> prompt = {1, 403, 407, 261};
  std::vector<std::vector<float>> out;
  for (std::vector<std::string> skip : {std::vector<std::string>{}, {"fuse"}, {"dce", "fuse"}}) {
    CompileOptions co;
    co.workers = 2;
    co.skip = skip;
    cpu::Interpreter it(compile_program(g, co), m);
    it.step(prompt, 0);
    auto l = it.output("logits");
    out.emplace_back(l.begin(), l.end());
  }
  for (size_t i = 1; i < out.size(); ++i) {
    ASSERT_EQ(out[i].size(), out[0].size());
    EXPECT_EQ(0, std::memcmp(out[i].data(), out[0].data(), out[0].size() * 4)) << "variant " << i;
  }
}

TEST(CpuBackend, RepeatedRunsAreBitwiseIdentical) {
  ModelFile m = load_model(kStories + "stories260K.bin");
  Graph g = build_graph(m, BuildOptions{64, false});
  auto b = make_backend("cpu", g, m, cpu_opts(2));
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  const auto first = run_steps(*b, prompt, 3, 512);
  for (int rep = 0; rep < 50; ++rep) {
    b->reset();
    auto again = run_steps(*b, prompt, 3, 512);
    ASSERT_EQ(0, std::memcmp(again.data(), first.data(), first.size() * 4)) << "run " << rep;
  }
}

TEST(CpuBackend, OneCompilationServesAWholeGeneration) {
  SessionOptions so;
  so.model_path = kStories + "stories260K.bin";
  so.backend = "cpu";
  so.backend_options.threads = 2;
  const uint64_t before = programs_compiled();
  Session s(so);
  EXPECT_EQ(programs_compiled(), before + 1);
  GenerateOptions go;
  go.prompt = "Once upon a time";
  go.n_new = 40;
  go.sampler.temperature = 0;
  go.ignore_eos = true;
  GenerateResult r = generate(s, go);
  EXPECT_EQ(r.generated_ids.size(), 40u);
  EXPECT_EQ(programs_compiled(), before + 1) << "a step recompiled the program";
}

TEST(CpuBackend, ContextOverflowAndBadTokensAreErrors) {
  test::TinyLlama cfg;
  cfg.n_ctx = 8;
  ModelFile m = test::make_tiny_llama(cfg);
  Graph g = build_graph(m, BuildOptions{8, false});
  auto b = make_backend("cpu", g, m, cpu_opts(2));
  std::vector<int32_t> nine(9, 1);
  EXPECT_THROW(b->forward(nine, 0), Error);
  std::vector<int32_t> bad = {1, 1000};
  EXPECT_THROW(b->forward(bad, 0), Error);
  std::vector<int32_t> ok = {1, 2};
  EXPECT_EQ(b->forward(ok, 0).size(), static_cast<size_t>(cfg.n_vocab));
}

TEST(CpuBackend, UnknownScheduleIsAnError) {
  test::TinyLlama cfg;
  ModelFile m = test::make_tiny_llama(cfg);
  Graph g = build_graph(m, BuildOptions{16, false});
  EXPECT_THROW(make_backend("cpu", g, m, cpu_opts(2, "random")), Error);
}

TEST(CpuBackend, TraceHasOneTrackPerWorkerAndASlicePerInstruction) {
  ModelFile m = load_model(kStories + "stories260K.bin");
  Graph g = build_graph(m, BuildOptions{64, false});
  const std::string path = ::testing::TempDir() + "/mk_trace.json";
  BackendOptions o = cpu_opts(3, "static-cp");
  o.trace_path = path;
  CompileOptions co;
  co.workers = 3;
  co.schedule = ScheduleKind::static_cp;
  co.max_tokens = 64;
  const size_t n_instrs = compile_program(g, co).instrs.size();
  {
    auto b = make_backend("cpu", g, m, o);
    run_steps(*b, {1, 403, 407}, 4, 512);  // 5 steps
    b->finish();
  }
  std::ifstream f(path);
  ASSERT_TRUE(f.good());
  auto j = nlohmann::json::parse(f);
  std::set<int> tracks;
  size_t slices = 0, waits = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks.insert(e["tid"].get<int>());
    if (e["ph"] != "X") continue;
    if (e["name"] == "wait") {
      ++waits;
      continue;
    }
    ++slices;
    EXPECT_TRUE(e["args"].contains("op") && e["args"].contains("layer") && e["args"].contains("tile")) << e.dump();
  }
  EXPECT_EQ(tracks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(slices, 5 * n_instrs);
  EXPECT_GT(waits, 0u);
}

TEST(CpuBackend, TraceSummaryListsWorkersAndOpcodes) {
  ModelFile m = load_model(kStories + "stories260K.bin");
  Graph g = build_graph(m, BuildOptions{64, false});
  CompileOptions co;
  co.workers = 2;
  cpu::Interpreter it(compile_program(g, co), m, true);
  std::vector<int32_t> t = {1, 2, 3};
  it.step(t, 0);
  std::string s = cpu::trace_summary(it);
  EXPECT_NE(s.find("busy"), std::string::npos) << s;
  EXPECT_NE(s.find("attention"), std::string::npos) << s;
  EXPECT_NE(s.find("matmul"), std::string::npos) << s;
}

// vmath.h's exp (softmax and SiLU of the interpreter): within 1 ulp of exp computed in double and
// rounded to float over [-87.33, 88] (dense in softmax's [-20, 0], then evenly and randomly spread),
// 0 below the normal range, +inf above 88.73, NaN kept; a span gives every element the bits of the
// scalar path wherever it falls (16-lane body or tail), and silu_mul_span those of silu_f32.
TEST(CpuVmath, ExpWithinOneUlpAndSpansEqualScalar) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> any(-87.33f, 88.0f);
  int64_t worst = 0;
  float worst_x = 0;
  for (int i = 0; i < 3000000; ++i) {
    const float x = i < 1000000 ? -20.0f * static_cast<float>(i) / 1e6f
                    : i < 2000000 ? -87.33f + 175.33f * static_cast<float>(i - 1000000) / 1e6f
                                  : any(rng);
    const float got = cpu::exp_f32(x), want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t ulp = std::llabs(static_cast<long long>(std::bit_cast<int32_t>(got)) - std::bit_cast<int32_t>(want));
    if (ulp > worst) worst = ulp, worst_x = x;
  }
  EXPECT_LE(worst, 1) << "at x = " << worst_x;
  EXPECT_EQ(cpu::exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::exp_f32(89.0f), INFINITY);
  EXPECT_TRUE(std::isnan(cpu::exp_f32(NAN)));
  EXPECT_EQ(cpu::exp_f32(0.0f), 1.0f);
  std::vector<float> x(37), y(37), t(37), u(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = t[i] = any(rng) / 4, u[i] = any(rng) / 8;
  cpu::exp_sub_span(x.data(), y.data(), 37, 0.75f);
  std::vector<float> tv = t;
  cpu::silu_mul_span(tv.data(), u.data(), 37);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(cpu::exp_f32(x[i] - 0.75f))) << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(tv[i]), std::bit_cast<uint32_t>(cpu::silu_f32(t[i]) * u[i])) << i;
  }
}

// attention over an f16 KV cache on AVX-512 (kernels.cpp attention_f16: scores 16 positions at a
// time through dot_f32's lane tree, K and V converted in registers) gives the portable path's bits,
// for head_dim 64 (5 heads per KV group: a pass of 4 heads and one of 1) and 128 (3 per group), over
// ragged batches whose rows attend to 1 .. 70 positions (tails of 16 and of the prefetch window),
// with and without soft-capped scores.
TEST(CpuAttention, Avx512F16PathEqualsPortable) {
  if (!cpu::attention_avx512_enabled()) GTEST_SKIP() << "built without AVX-512";
  for (const SynthSpec& spec : {SynthSpec{"attn64", 96, 640, 2, 10, 2, 128, 128, DType::Q8_0},
                                SynthSpec{"attn128", 96, 384, 2, 3, 1, 128, 128, DType::Q8_0}}) {
    const ModelFile m = make_synthetic_model(spec, true);
    BuildOptions bo{128, false};
    bo.kv_pool_tokens = 4 * 128;
    Graph g = build_graph(m, bo);
    auto run = [&](bool avx512) {
      cpu::set_attention_avx512(avx512);
      auto b = make_backend("cpu", g, m, cpu_opts(2));
      std::vector<float> all;
      StepBatch p;  // prefills of 1, 17, 33 and 50 positions in one step
      const int lens[4] = {1, 17, 33, 50};
      for (int s = 0; s < 4; ++s) {
        p.block_tables.push_back({});
        for (int j = 0; j < 8; ++j) p.block_tables.back().push_back(j * 4 + s);  // blocks interleaved
        for (int i = 0; i < lens[s]; ++i) {
          p.tokens.push_back((i * 37 + s * 11 + 1) % 96);
          p.positions.push_back(i);
          p.seq.push_back(s);
        }
      }
      for (int32_t i = 0; i < static_cast<int32_t>(p.tokens.size()); ++i) p.logit_rows.push_back(i);
      all = b->forward(p);
      for (int step = 0; step < 20; ++step) {  // then decode rows of all four (n_kv up to 70)
        StepBatch d;
        d.block_tables = p.block_tables;
        for (int s = 0; s < 4; ++s) {
          d.tokens.push_back((step * 31 + s * 7) % 96);
          d.positions.push_back(lens[s] + step);
          d.seq.push_back(s);
          d.logit_rows.push_back(s);
        }
        const auto l = b->forward(d);
        all.insert(all.end(), l.begin(), l.end());
      }
      return all;
    };
    std::vector<float> uncapped;
    for (const double cap : {0.0, 0.75}) {  // Gemma 2's soft-capped scores (0 = none)
      for (Node& n : g.nodes)
        if (n.op == Op::attention) n.attrs["softcap"] = cap;
      const std::vector<float> fast = run(true), portable = run(false);
      cpu::set_attention_avx512(true);
      ASSERT_EQ(fast.size(), portable.size());
      size_t differ = 0;
      for (size_t i = 0; i < fast.size(); ++i) differ += std::bit_cast<uint32_t>(fast[i]) != std::bit_cast<uint32_t>(portable[i]);
      EXPECT_EQ(differ, 0u) << spec.name << " softcap " << cap << ": " << differ << " of " << fast.size() << " logits differ";
      if (cap == 0) uncapped = fast;
      else EXPECT_GT(test::rel_l2(fast, uncapped), 1e-3) << spec.name << ": the cap changed nothing";
    }
  }
}

// Which matmuls share prepared activation rows (kernels.h act_cache_keys, act_shared_slots): in a
// llama layer k and v take q's rows (same x, norm and block type); the attention output, the FFN
// and the logits prepare their own; shared slots go round in op order, and a reuse that an
// instruction could race with (its waits cleared here) gets no slot.
TEST(CpuActShared, KeysAndSlotsFollowTheLayerChain) {
  const ModelFile m = make_synthetic_model(synthetic_spec("stories260k"), false);  // 5 layers: 0, 1 are whole
  const Graph g = build_graph(m, BuildOptions{64, false});
  CompileOptions co;
  co.workers = 2;
  Program p = compile_program(g, co);
  std::vector<cpu::WeightRef> w(p.weights.size());
  for (auto& r : w) {
    r.act_q8 = true;
    r.quant = quant::quant_type(DType::Q8_0);
  }
  const auto op = [&](const std::string& name) {
    for (size_t i = 0; i < p.ops.size(); ++i)
      if (p.ops[i].name == name) return static_cast<int32_t>(i);
    ADD_FAILURE() << "no op " << name;
    return int32_t{-1};
  };
  const std::vector<int32_t> keys = cpu::act_cache_keys(p, w.data());
  for (const std::string l : {"blk.0.", "blk.1."}) {
    EXPECT_EQ(keys[op(l + "k_cache")], op(l + "q_rope")) << l;
    EXPECT_EQ(keys[op(l + "v_cache")], op(l + "q_rope")) << l;
    EXPECT_EQ(keys[op(l + "q_rope")], op(l + "q_rope")) << l;
    for (const std::string own : {"attn_residual", "ffn_gated", "ffn_residual"}) EXPECT_EQ(keys[op(l + own)], op(l + own)) << l + own;
  }
  const std::vector<int32_t> slots = cpu::act_shared_slots(p, w.data(), keys, 3);
  // q k v, attn_residual, ffn_gated, ffn_residual of layer 0, then layer 1, then the logits
  const std::vector<std::string> chain = {"blk.0.q_rope", "blk.0.attn_residual", "blk.0.ffn_gated", "blk.0.ffn_residual",
                                          "blk.1.q_rope", "blk.1.attn_residual", "blk.1.ffn_gated", "blk.1.ffn_residual"};
  for (size_t i = 0; i < chain.size(); ++i) EXPECT_EQ(slots[op(chain[i])], static_cast<int32_t>(i % 3)) << chain[i];
  EXPECT_EQ(slots[op("blk.1.k_cache")], slots[op("blk.1.q_rope")]);
  // One worker: nothing to share.
  Program p1 = p;
  p1.workers = 1;
  for (const int32_t s : cpu::act_shared_slots(p1, w.data(), keys, 3)) EXPECT_EQ(s, -1);
  // With one slot every key reuses the previous key's slot. A tile of blk.1.attn_residual that waits
  // for nothing could run while blk.1.q_rope's rows are still read: it gets none, and the next key
  // reuses the slot after blk.1.q_rope.
  Program p2 = p;
  for (Instr& in : p2.instrs)
    if (in.op == op("blk.1.attn_residual") && in.tile == 0) in.waits.clear();
  const std::vector<int32_t> s1 = cpu::act_shared_slots(p2, w.data(), keys, 1);
  EXPECT_EQ(s1[op("blk.0.attn_residual")], 0);
  EXPECT_EQ(s1[op("blk.1.q_rope")], 0);
  EXPECT_EQ(s1[op("blk.1.attn_residual")], -1);
  EXPECT_EQ(s1[op("blk.1.ffn_gated")], 0);
}
