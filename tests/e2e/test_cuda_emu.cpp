// cuda-emu: the CUDA megakernel's exact source, compiled for the host and run on emulated blocks
// and threads (backend/cuda/device/emu_host.h). What a GPU would be asked, asked here:
//   - stories260K reproduces llama2.c's greedy reference token for token, for the dynamic queue and
//     a static schedule, on several block counts;
//   - every HF fixture's last-position logits are within 1e-4 (f32) / 1e-2 (bf16) of transformers';
//   - the watchdog (a wait that can never complete) and a bad token id end in their errors;
//   - the race check finds the race in every unsafe mutant of a real program run without the
//     validator (drop a wait, lower its count, swap a waiter before its producer);
//   - quantized weights (every ggml block type, read raw by the device functions): logits equal the
//     cpu backend's within 1e-4, and SmolLM2-135M Q4_1 generates the cpu backend's greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <unistd.h>

#include "archs/arch.h"
#include "backend/backend.h"
#include "backend/cuda/device_runtime.h"
#include "model/hf.h"
#include "model/model_file.h"
#include "model/synth.h"
#include "passes/pass.h"
#include "quant/quant.h"
#include "runtime/session.h"
#include "support/cli.h"
#include "support/compare.h"
#include "support/hf_fixtures.h"
#include "support/quant_models.h"
#include "support/error.h"

namespace mk {
namespace {

namespace fs = std::filesystem;
const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/";

nlohmann::json greedy_cases() {
  std::ifstream f(kStories + "reference_greedy.json");
  EXPECT_TRUE(f.good()) << "missing " << kStories << "reference_greedy.json";
  return nlohmann::json::parse(f);
}

// `megakernel ARGS` with `env` (VAR=value ...) set, stdout and stderr together.
std::string run_cli(const std::string& env, const std::string& args, int* status) {
  return test::run_shell(env + " " + std::string(MK_CLI_PATH) + " " + args + " 2>&1", status);
}

class E2ECudaEmuStories : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(E2ECudaEmuStories, ReproducesRunCGreedy) {
  auto [blocks, schedule] = GetParam();
  SessionOptions so;
  so.model_path = kStories + "stories260K.gguf";
  so.backend = "cuda-emu";
  so.backend_options.threads = blocks;
  so.backend_options.schedule = schedule;
  Session s(so);
  for (const auto& c : greedy_cases()) {
    s.reset();
    GenerateOptions go;
    go.prompt = c["prompt"].get<std::string>();
    go.sampler.temperature = 0;
    go.n_new = static_cast<int>(c["generated_ids"].size());
    GenerateResult r = generate(s, go);
    EXPECT_EQ(r.prompt_ids, c["prompt_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(r.generated_ids, c["generated_ids"].get<std::vector<int32_t>>())
        << blocks << " blocks, " << schedule << ", prompt '" << go.prompt << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(E2ECudaEmu, E2ECudaEmuStories,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values("dynamic", "static-cp")),
                         [](const auto& info) {
                           std::string s = "b" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// Greedy decoding several steps per wait (MK_CUDA_DECODE_STEPS, default 8: each step's id goes to the
// next step's input on the device) gives what one step per wait gives: the same ids, stop reasons
// and n_past when a generation ends inside a chunk (max tokens not a multiple of 8, an end-of-
// generation id, the context), and the cache rows computed past the stop change nothing for the
// next generation on the same session.
TEST(E2ECudaEmuDecodeSteps, AheadRowsChangeNothing) {
  struct Out {
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::string> stops;
    std::vector<int64_t> n_past;
  };
  auto session_run = [](const char* steps, int32_t eos) {
    setenv("MK_CUDA_DECODE_STEPS", steps, 1);
    SessionOptions so;
    so.model_path = kStories + "stories260K.gguf";
    so.backend = "cuda-emu";
    so.backend_options.threads = 2;
    so.n_ctx = 48;
    Session s(so);
    unsetenv("MK_CUDA_DECODE_STEPS");
    EXPECT_EQ(s.backend->decode_steps(), std::atoi(steps));
    Out o;
    auto gen = [&](GenerateOptions go) {
      go.sampler.temperature = 0;
      const GenerateResult r = generate(s, go);
      o.ids.push_back(r.generated_ids);
      o.stops.push_back(r.stop_reason);
      o.n_past.push_back(s.n_past);
    };
    GenerateOptions go;
    go.prompt = "Once upon a time";
    go.n_new = 13;
    gen(go);  // 13 tokens: chunks of 8 and 4 after the prompt's row
    go = {};
    go.prompt_ids = {300, 301, 302};
    go.add_bos = false;
    go.n_new = 6;
    gen(go);  // goes on from there (n_past 17 + 3)
    go.n_new = 100;
    gen(go);  // to the end of the 48-token context
    s.reset();
    if (eos >= 0) s.tokenizer->extra_eos_ids.push_back(eos);
    go = {};
    go.prompt = "Once upon a time";
    go.n_new = 30;
    gen(go);  // stops at the end-of-generation id inside a chunk
    go = {};
    go.prompt_ids = {300, 301, 302};
    go.add_bos = false;
    go.n_new = 5;
    gen(go);
    return o;
  };
  const Out one = session_run("1", -1);
  ASSERT_EQ(one.ids.size(), 5u);
  EXPECT_EQ(one.stops[0], "n_new");
  EXPECT_EQ(one.n_past[0], 5 + 12);  // the last token is not fed
  EXPECT_EQ(one.stops[2], "context");
  EXPECT_EQ(one.n_past[2], 48);
  // The end-of-generation id: the first id at index >= 10 not generated before it.
  const std::vector<int32_t>& first = one.ids[3];
  int eos_at = -1;
  for (size_t k = 10; k < first.size() && eos_at < 0; ++k)
    if (std::find(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(k), first[k]) == first.begin() + static_cast<std::ptrdiff_t>(k))
      eos_at = static_cast<int>(k);
  ASSERT_GE(eos_at, 10);
  const Out one_eos = session_run("1", first[static_cast<size_t>(eos_at)]);
  EXPECT_EQ(one_eos.stops[3], "eos");
  EXPECT_EQ(one_eos.ids[3].size(), static_cast<size_t>(eos_at));
  for (const char* steps : {"8", "3"}) {
    const Out many = session_run(steps, first[static_cast<size_t>(eos_at)]);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(many.ids[i], one_eos.ids[i]) << steps << " steps, generation " << i;
      EXPECT_EQ(many.stops[i], one_eos.stops[i]) << steps << " steps, generation " << i;
      EXPECT_EQ(many.n_past[i], one_eos.n_past[i]) << steps << " steps, generation " << i;
    }
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(one_eos.ids[i], one.ids[i]) << "generation " << i;
}

class E2ECudaEmuHf : public testing::TestWithParam<std::string> {};

TEST_P(E2ECudaEmuHf, LogitsMatchTransformers) {
  BackendOptions bo;
  bo.threads = 3;
  test::expect_logits_match_transformers(GetParam(), "cuda-emu", bo);
}

INSTANTIATE_TEST_SUITE_P(E2ECudaEmu, E2ECudaEmuHf, ::testing::ValuesIn(test::hf_fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(E2ECudaEmuErrors, WatchdogNamesTheWait) {
  int st = 0;
  const std::string out = run_cli("MK_DEBUG_BREAK_WAIT=1 MK_CUDA_WAIT_TIMEOUT_MS=300",
                                  "run --backend cuda-emu -t 2 --temp 0 -n 4 -p 'Once' -m " + kStories + "stories260K.gguf", &st);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("waited more than 300 ms for counter"), std::string::npos) << out;
  // The prompt was streamed before the step failed: its line is ended, so the error starts a line.
  EXPECT_NE(out.find("Once\nerror: cuda-emu: instruction"), std::string::npos) << out;
}

// chat after a device error: the backend is reset with a new conversation, so the next turn runs
// (here it fails again on the same broken wait) instead of being refused by the stopped backend.
TEST(E2ECudaEmuErrors, ChatGoesOnAfterADeviceError) {
  int st = 0;
  const std::string out = run_cli("printf 'Once\\nOnce\\n' | MK_DEBUG_BREAK_WAIT=1 MK_CUDA_WAIT_TIMEOUT_MS=300",
                                  "chat --backend cuda-emu -t 2 --temp 0 -n 4 -m " + kStories + "stories260K.gguf --chat-template-file " +
                                      std::string(MK_SOURCE_DIR) + "/tests/chat/templates/chatml.jinja",
                                  &st);
  EXPECT_NE(st, 0) << out;
  size_t waits = 0;
  for (size_t at = out.find("waited more than 300 ms"); at != std::string::npos; at = out.find("waited more than 300 ms", at + 1))
    ++waits;
  EXPECT_EQ(waits, 2u) << out;
  EXPECT_EQ(out.find("stopped after a device error ("), std::string::npos) << out;
  EXPECT_NE(out.find("note: the backend stopped after a device error; a new conversation starts"), std::string::npos) << out;
}

TEST(E2ECudaEmuErrors, BadTokenIdIsReported) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, {32, false});
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend("cuda-emu", g, m, bo);
  const std::vector<int32_t> ids = {1, 700};
  try {
    b->forward(ids, 0);
    FAIL() << "token id 700 of a 512-token vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 700 out of range [0, 512)"), std::string::npos) << e.what();
  }
  // The backend refuses further steps until reset, then works again.
  EXPECT_THROW(b->forward(std::vector<int32_t>{1}, 0), Error);
  b->reset();
  EXPECT_EQ(b->forward(std::vector<int32_t>{1, 403}, 0).size(), 512u);
}

// Mutants of the stories260K program (2 workers) that the validator rejects, run without it: the
// emulator's race check (or, for a wait that can never complete, the watchdog) must catch each.
TEST(CudaEmuRaceCheck, FindsTheRaceInEveryUnsafeMutant) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, {16, false});
  CompileOptions co;
  co.workers = 2;
  co.max_tokens = 8;
  const Program base = compile_program(g, co);
  ASSERT_TRUE(check_program(base).empty());
  std::vector<std::pair<std::string, Program>> mutants;
  for (size_t i = 0; i < base.instrs.size(); ++i) {
    const Instr& in = base.instrs[i];
    for (size_t w = 0; w < in.waits.size(); ++w) {
      Program drop = base;
      drop.instrs[i].waits.erase(drop.instrs[i].waits.begin() + static_cast<long>(w));
      mutants.emplace_back(fmt::format("drop wait {} of instruction {}", w, i), std::move(drop));
      if (in.waits[w].count > 1) {
        Program lower = base;
        lower.instrs[i].waits[w].count -= 1;
        mutants.emplace_back(fmt::format("lower wait {} of instruction {}", w, i), std::move(lower));
      }
    }
  }
  BackendOptions bo;
  cuda::EmuOptions eo;
  eo.blocks = 2;
  eo.threads = 32;
  setenv("MK_CUDA_WAIT_TIMEOUT_MS", "2000", 1);
  int checked = 0, races = 0;
  std::vector<std::string> missed;
  const std::vector<int32_t> prompt = {1, 403, 407, 261};
  for (auto& [what, prog] : mutants) {
    if (check_program(prog).empty()) continue;  // the validator accepts it: not a mutant this test is about
    ++checked;
    auto b = make_cuda_emu_program_backend(std::move(prog), m, bo, eo);
    try {
      // The second step asks for top-k candidates: only such a step runs the topk op's selection
      // (MkSym::want_topk), so a mutant dropping one of its waits races there.
      b->forward(prompt, 0);
      b->forward_topk(std::vector<int32_t>{300}, static_cast<int64_t>(prompt.size()));
      missed.push_back(what);
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find("race:") != std::string::npos) ++races;
      else if (msg.find("waited more than") == std::string::npos) missed.push_back(what + ": " + msg);
    }
  }
  unsetenv("MK_CUDA_WAIT_TIMEOUT_MS");
  EXPECT_GE(checked, 50) << "the suite must hold at least 50 unsafe mutants";
  EXPECT_GE(races, 50);
  EXPECT_TRUE(missed.empty()) << missed.size() << " of " << checked << " unsafe mutants ran without an error, e.g. "
                              << missed.front();
}

// Warp 0 waits on an instruction's counters in parallel (lane l: waits l, l+32, ...). An instruction
// given 40 waits on distinct counters, two of which can never complete (wait 35: lane 3's second
// round, which lane 3 reaches first on the emulator; wait 9: lane 9), must report wait 9, the first
// stuck one in the instruction's order, as a serial wait would.
TEST(E2ECudaEmuErrors, ParallelWaitNamesTheFirstStuckCounter) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, {16, false});
  CompileOptions co;
  co.workers = 2;
  co.max_tokens = 8;
  Program p = compile_program(g, co);
  // The last instruction with waits: nothing waits on it, so no other wait can time out first.
  int i = static_cast<int>(p.instrs.size()) - 1;
  while (i >= 0 && p.instrs[static_cast<size_t>(i)].waits.empty()) --i;
  ASSERT_GE(i, 0);
  std::vector<Wait>& waits = p.instrs[static_cast<size_t>(i)].waits;
  // Add complete waits of earlier instructions (their producers come earlier in the order).
  for (int j = 0; j < i && waits.size() < 40; ++j)
    for (const Wait& w : p.instrs[static_cast<size_t>(j)].waits)
      if (waits.size() < 40 &&
          std::none_of(waits.begin(), waits.end(), [&](const Wait& x) { return x.counter == w.counter; }))
        waits.push_back(w);
  ASSERT_EQ(waits.size(), 40u);
  waits[35].count += 1;
  waits[9].count += 1;
  const Wait stuck = waits[9];
  BackendOptions bo;
  cuda::EmuOptions eo;
  eo.blocks = 2;
  eo.threads = 64;
  setenv("MK_CUDA_WAIT_TIMEOUT_MS", "300", 1);
  auto b = make_cuda_emu_program_backend(std::move(p), m, bo, eo);
  try {
    b->forward(std::vector<int32_t>{1, 403}, 0);
    ADD_FAILURE() << "a wait that can never complete did not time out";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fmt::format("instruction {} (", i)), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("waited more than 300 ms for counter {} (", stuck.counter)), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(fmt::format("expected {} (", stuck.count)), std::string::npos) << msg;  // step 1
  }
  unsetenv("MK_CUDA_WAIT_TIMEOUT_MS");
}

TEST(CudaEmuRaceCheck, ValidProgramHasNoRace) {
  // The same program unmutated, several steps (prefill and decode), on 3 blocks: no report.
  ModelFile m = load_model(kStories + "stories260K.gguf");
  Graph g = build_graph(m, {32, false});
  CompileOptions co;
  co.workers = 3;
  co.max_tokens = 8;
  Program p = compile_program(g, co);
  BackendOptions bo;
  cuda::EmuOptions eo;
  eo.blocks = 3;
  eo.threads = 64;
  auto b = make_cuda_emu_program_backend(std::move(p), m, bo, eo);
  std::vector<float> l = b->forward(std::vector<int32_t>{1, 403, 407, 261, 378}, 0);
  for (int64_t pos = 5; pos < 12; ++pos) l = b->forward(std::vector<int32_t>{static_cast<int32_t>(pos * 7)}, pos);
  EXPECT_EQ(l.size(), 512u);
}

// ---- RMS statistic once per op (CompileOptions::rms_partials) -------------------------------------

Program stories_program(bool rms_partials, int workers) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  CompileOptions co;
  co.workers = workers;
  co.max_tokens = 8;
  co.rms_partials = rms_partials;
  return compile_program(build_graph(m, {32, false}), co);
}

// The writer of every pro_rms matmul's x also writes per-tile partials; the matmuls read them. No
// counter or wait changes (the matmuls already wait for every tile of x's writer), the validator
// accepts it, and without the option nothing changes at all.
TEST(CudaEmuRmsPartials, ProgramAddsPartialsButNoWaits) {
  const Program off = stories_program(false, 3), on = stories_program(true, 3);
  ASSERT_TRUE(check_program(on).empty()) << check_program(on).front();
  ASSERT_EQ(on.instrs.size(), off.instrs.size());
  EXPECT_EQ(on.counters.size(), off.counters.size());
  for (size_t i = 0; i < on.instrs.size(); ++i) EXPECT_EQ(on.instrs[i].waits, off.instrs[i].waits) << on.instr_str(static_cast<int>(i));
  int pro_rms = 0, with_partials = 0;
  std::set<int> partial_buffers;
  for (const OpDesc& o : off.ops) EXPECT_TRUE(o.ss < 0 && o.ss_out < 0) << o.name;
  for (const OpDesc& o : on.ops) {
    if (o.opcode != Opcode::matmul || !o.pro_rms) continue;
    ++pro_rms;
    if (o.ss < 0) continue;
    ++with_partials;
    partial_buffers.insert(o.ss);
    int writers = 0, tiles = 0;
    for (size_t w = 0; w < on.ops.size(); ++w)
      if (on.ops[w].ss_out == o.ss) {
        ++writers;
        EXPECT_EQ(on.ops[w].out, o.x) << o.name << ": the partials' writer is not the writer of x";
        for (const Instr& in : on.instrs) tiles += in.op == static_cast<int>(w);
      }
    EXPECT_EQ(writers, 1) << o.name;
    EXPECT_EQ(on.buffers[static_cast<size_t>(o.ss)].cols, 2 * tiles) << o.name;
  }
  // stories260K (5 layers): attn_norm (q, k, v), ffn_norm (gate/up) per layer, output_norm.
  EXPECT_EQ(pro_rms, with_partials);
  EXPECT_EQ(static_cast<int>(partial_buffers.size()), 2 * 5 + 1);
  EXPECT_EQ(on.buffers.size(), off.buffers.size() + partial_buffers.size());
}

// The same tokens' logits with and without partials (the statistic summed in another order, in
// double: float-rounding apart at most), and the cpu backend's.
TEST(CudaEmuRmsPartials, LogitsMatchTheInTileStatistic) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  BackendOptions bo;
  cuda::EmuOptions eo;
  eo.blocks = 3;
  eo.threads = 64;
  std::vector<std::vector<float>> got;
  for (bool partials : {false, true}) {
    auto b = make_cuda_emu_program_backend(stories_program(partials, 3), m, bo, eo);
    std::vector<float> l = b->forward(std::vector<int32_t>{1, 403, 407, 261, 378}, 0);
    for (int64_t pos = 5; pos < 9; ++pos) {
      const std::vector<float> d = b->forward(std::vector<int32_t>{static_cast<int32_t>(pos * 7)}, pos);
      l.insert(l.end(), d.begin(), d.end());
    }
    got.push_back(l);
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  const double err = test::rel_l2(got[1], got[0]);
  EXPECT_LT(err, 1e-6);
  std::printf("  stories260K, partials vs in-tile RMS statistic: rel. L2 %.2e\n", err);
}

// The partials are an ordinary buffer to the validator and the race check. A program whose
// partials nobody writes (a writer's slot removed) is rejected by the validator. A device whose
// tiles write another tile's partials (the writer's tile width doubled: t = c0 / SS_TC sends tiles
// 2k and 2k + 1 to one column pair; the program's regions still say one pair per tile, so the
// validator cannot see it) is caught by the race check: two unordered tiles wrote one element.
TEST(CudaEmuRaceCheck, MisplacedRmsPartialsAreARace) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  const Program base = stories_program(true, 2);
  int victim = -1;
  for (size_t w = 0; w < base.ops.size() && victim < 0; ++w) {
    int tiles = 0;
    for (const Instr& in : base.instrs) tiles += in.op == static_cast<int>(w);
    if (base.ops[w].ss_out >= 0 && base.ops[w].layer == 2 && tiles >= 2) victim = static_cast<int>(w);
  }
  ASSERT_GE(victim, 0);
  const OpDesc& v = base.ops[static_cast<size_t>(victim)];
  const std::string name = base.buffers[static_cast<size_t>(v.ss_out)].name;
  Program unwritten = base;
  unwritten.ops[static_cast<size_t>(victim)].ss_out = -1;
  const auto issues = check_program(unwritten);
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues.front().find(name), std::string::npos) << issues.front();
  Program misplaced = base;
  misplaced.ops[static_cast<size_t>(victim)].tile_cols *= 2;
  ASSERT_TRUE(check_program(misplaced).empty());
  BackendOptions bo;
  cuda::EmuOptions eo;
  eo.blocks = 2;
  eo.threads = 32;
  auto b = make_cuda_emu_program_backend(std::move(misplaced), m, bo, eo);
  try {
    b->forward(std::vector<int32_t>{1, 403, 407}, 0);
    ADD_FAILURE() << "two tiles writing one partial went unreported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("race:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

// ---- quantized weights ---------------------------------------------------------------------------

std::vector<float> quant_logits(const ModelFile& m, const std::string& backend) {
  return test::prompt_then_decode_logits(m, backend, 32, "off");  // the device's numerics: float32
}

ModelFile synth_256() { return test::synth_256("quant-emu", 32); }

// Every 2-D matrix of a model in one of the ten types, spread so that each type is a plain matmul,
// a GLU pair or an embedding somewhere (a Q4_K_M-like file taken further).
ModelFile all_types_mix() {
  return quant::quantize_model(synth_256(), [](const WeightTensor& w) -> std::optional<DType> {
    if (w.shape.size() != 2) return std::nullopt;
    const bool l0 = w.name.starts_with("blk.0.");
    if (w.name == "token_embd.weight") return DType::Q4_1;
    if (w.name == "output.weight") return DType::Q8_0;
    if (w.name.ends_with("attn_q.weight")) return l0 ? DType::Q4_0 : DType::Q5_0;
    if (w.name.ends_with("attn_k.weight")) return l0 ? DType::Q5_1 : DType::Q2_K;
    if (w.name.ends_with("attn_v.weight")) return l0 ? DType::Q6_K : DType::Q3_K;
    if (w.name.ends_with("attn_output.weight")) return l0 ? DType::Q4_K : DType::Q5_K;
    if (w.name.ends_with("ffn_down.weight")) return l0 ? DType::Q6_K : DType::Q8_0;
    return l0 ? DType::Q4_K : DType::Q5_0;  // ffn_gate / ffn_up
  });
}

class E2ECudaEmuQuant : public testing::TestWithParam<std::string> {};

// Both backends dequantize exactly (the CPU dot and the device's deq32 compute ggml's values) and
// accumulate in f32; only the order of the sums differs.
TEST_P(E2ECudaEmuQuant, LogitsMatchTheCpuBackend) {
  const std::string name = GetParam();
  ModelFile m;
  if (name == "mix") {
    m = all_types_mix();
  } else {
    DType t = DType::F32;
    for (DType d : kAllDTypes)
      if (dtype_name(d) == name) t = d;
    ASSERT_TRUE(dtype_is_quantized(t)) << name;
    // The 32-element block types on stories260K (its 172-wide ffn_down stays f32: a mix of types),
    // the K-quants on the 256-wide synthetic model.
    const bool k_quant = quant::quant_type(t)->block_size == 256;
    m = quant::quantize_model(k_quant ? synth_256() : load_model(kStories + "stories260K.gguf"), t);
    ASSERT_EQ(m.get("token_embd.weight").dtype, t);
    ASSERT_EQ(m.get("blk.0.attn_q.weight").dtype, t);
  }
  const std::vector<float> cpu = quant_logits(m, "cpu");
  const std::vector<float> emu = quant_logits(m, "cuda-emu");
  ASSERT_EQ(emu.size(), cpu.size());
  const double err = test::rel_l2(emu, cpu);
  EXPECT_LT(err, 1e-4) << name;
  std::printf("  %-5s cuda-emu vs cpu rel. L2 %.2e\n", name.c_str(), err);
}

INSTANTIATE_TEST_SUITE_P(E2ECudaEmu, E2ECudaEmuQuant,
                         ::testing::Values("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q6_K", "q5_K", "q3_K", "q2_K", "iq4_nl", "iq4_xs", "mix"),
                         [](const auto& info) { return info.param; });

// Float matmuls with several K steps per lane (K = 288 and 768 > 256 elements a warp covers per
// step; 288 leaves a partial pass) on prompt rows (RB staged rows: the loads of a pass hoisted above
// the row guards) and decode rows: stories15m's shape in bf16, 2 layers, within float rounding of cpu.
TEST(E2ECudaEmuFloat, MultiStepMatmulRowsMatchTheCpuBackend) {
  SynthSpec spec = synthetic_spec("stories15m");
  spec.n_layer = 2;
  spec.dtype = DType::BF16;
  const ModelFile m = make_synthetic_model(spec);
  const std::vector<float> cpu = test::prompt_then_decode_logits(m, "cpu", 32, "off");
  const std::vector<float> emu = test::prompt_then_decode_logits(m, "cuda-emu", 32, "off");
  ASSERT_EQ(emu.size(), cpu.size());
  const double err = test::rel_l2(emu, cpu);
  EXPECT_LT(err, 1e-5);
  std::printf("  bf16 stories15m shape: cuda-emu vs cpu rel. L2 %.2e\n", err);
}

// Rows whose K is not a multiple of 8 (ffn_down reads n_ff-wide rows): vector loads as wide as the
// row offset allows (K % 4 == 0: 16 bytes f32 / 8 bytes bf16; K % 2 == 0: 8 / 4 bytes), the
// emulator faulting on a misaligned one as a GPU would (f32 K = 174 rows are 8-byte aligned only);
// odd K stays scalar. Prompt and decode rows,
// within float rounding of the cpu backend.
TEST(E2ECudaEmuFloat, OddKMatmulRowsMatchTheCpuBackend) {
  for (const auto& [dtype, n_ff] : std::vector<std::pair<DType, int64_t>>{
           {DType::F32, 174}, {DType::BF16, 172}, {DType::F16, 171}}) {  // f32, K = 172: stories260K
    SynthSpec spec = synthetic_spec("stories260k");
    spec.n_layer = 2;
    spec.n_ff = n_ff;
    spec.dtype = dtype;
    const ModelFile m = make_synthetic_model(spec);
    const std::vector<float> cpu = test::prompt_then_decode_logits(m, "cpu", 32, "off");
    const std::vector<float> emu = test::prompt_then_decode_logits(m, "cuda-emu", 32, "off");
    ASSERT_EQ(emu.size(), cpu.size());
    const double err = test::rel_l2(emu, cpu);
    EXPECT_LT(err, 1e-5) << dtype_name(dtype) << " n_ff " << n_ff;
    std::printf("  %s n_ff %lld: cuda-emu vs cpu rel. L2 %.2e\n", std::string(dtype_name(dtype)).c_str(),
                static_cast<long long>(n_ff), err);
  }
}

// SmolLM2-135M-Instruct Q4_1 (scripts/get-model.sh smollm2; skipped when absent): cuda-emu's greedy
// tokens are the cpu backend's.
TEST(E2ECudaEmuQuantModel, SmolLM2Q41GreedyEqualsCpu) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string path = (xdg && *xdg ? std::string(xdg) : std::string(home ? home : "") + "/.cache") +
                           "/megakernel/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is not there (scripts/get-model.sh smollm2 downloads it)";
  std::vector<std::vector<int32_t>> got;
  for (const char* backend : {"cpu", "cuda-emu"}) {
    SessionOptions so;
    so.model_path = path;
    so.backend = backend;
    so.n_ctx = 64;
    so.backend_options.threads = 2;
    so.backend_options.act_quant = "off";  // float32 numerics, as the device
    so.backend_options.kv_type = "f32";
    Session s(so);
    GenerateOptions go;
    go.prompt = "The capital of France is";
    go.sampler.temperature = 0;
    go.n_new = 8;
    go.ignore_eos = true;
    got.push_back(generate(s, go).generated_ids);
  }
  ASSERT_EQ(got[0].size(), 8u);
  EXPECT_EQ(got[1], got[0]);
}

// The compiled object's cache (new-user trial 45): a cut cached object (dlopen would map it and fault
// past its end) is built again with a note; without the cache (MK_CUDA_CACHE=0), or when its folder
// cannot be made, the object is built in a temporary folder that is removed again.
TEST(E2ECudaEmuCache, DamagedEntryIsBuiltAgainAndNoCacheNeedsNoFolder) {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / fmt::format("mk_emu_cache_{}", ::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "tmp");
  const std::string args = "run --backend cuda-emu -t 2 --temp 0 -n 6 -p 'Once' -m " + kStories + "stories260K.gguf";
  int st = 0;
  const std::string first = run_cli("XDG_CACHE_HOME=" + root.string(), args, &st);
  ASSERT_EQ(st, 0) << first;
  const std::string text = first.substr(0, first.find('\n'));
  std::vector<std::filesystem::path> cached;
  for (const auto& e : std::filesystem::directory_iterator(root / "megakernel" / "emu"))
    if (e.path().extension() == ".so") cached.push_back(e.path());
  ASSERT_EQ(cached.size(), 1u);
  std::filesystem::resize_file(cached[0], std::filesystem::file_size(cached[0]) / 2);
  const std::string again = run_cli("XDG_CACHE_HOME=" + root.string(), args, &st);
  EXPECT_EQ(st, 0) << again;
  EXPECT_NE(again.find("is damaged: building it again"), std::string::npos) << again;
  EXPECT_NE(again.find(text), std::string::npos) << again;
  // XDG_CACHE_HOME a file: no cache folder can be made.
  { std::ofstream(root / "a_file") << "x"; }
  const std::string no_cache =
      run_cli("MK_CUDA_CACHE=0 TMPDIR=" + (root / "tmp").string() + " XDG_CACHE_HOME=" + (root / "a_file").string(), args, &st);
  EXPECT_EQ(st, 0) << no_cache;
  EXPECT_NE(no_cache.find(text), std::string::npos) << no_cache;
  EXPECT_TRUE(std::filesystem::is_empty(root / "tmp")) << "the temporary folder is removed";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace mk
