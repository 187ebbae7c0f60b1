// SmolLM2-135M-Instruct (GGUF, gpt2 vocabulary, Q4_1 weights) against llama.cpp's outputs
// (../shared/fixtures/smollm2/llamacpp_greedy.json). The model is not in the repo: scripts/get-model.sh
// smollm2 puts it in the user cache; without it these tests are skipped, saying so.
#include <gtest/gtest.h>

#include <unistd.h>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/model_file.h"
#include "model/tokenizer.h"
#include "runtime/chat.h"
#include "support/cli.h"

using mk::test::run_cli;

namespace mk {
namespace {

std::string smollm2_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string cache = xdg && *xdg ? xdg : std::string(home ? home : "") + "/.cache";
  return cache + "/megakernel/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

using mk::test::read_json;

#define MK_NEED_SMOLLM2()                                                                                  \
  if (!std::filesystem::exists(smollm2_path()))                                                            \
  GTEST_SKIP() << smollm2_path() << " is not there (scripts/get-model.sh smollm2 downloads it)"

TEST(E2ESmolLM2, PromptIdsAndRenderedChatMatchLlamaCpp) {
  MK_NEED_SMOLLM2();
  const ModelFile m = load_model_vocab(smollm2_path());  // metadata only: Q4_1 weights are not read
  EXPECT_TRUE(m.tensors().empty());
  const auto tok = load_model_tokenizer(m);
  EXPECT_EQ(tok->n_vocab(), 49152);
  EXPECT_FALSE(tok->add_bos);
  EXPECT_TRUE(tok->is_eos(2));  // <|im_end|>
  const auto ref = read_json(std::string(MK_SHARED_DIR) + "/fixtures/smollm2/llamacpp_greedy.json");
  ASSERT_EQ(ref["cases"].size(), 4u);
  for (const auto& c : ref["cases"]) {
    const auto want = c["prompt_ids"].get<std::vector<int32_t>>();
    if (c["kind"] == "raw") {
      EXPECT_EQ(tok->encode(c["prompt"].get<std::string>(), true), want) << c["prompt"];
    } else {
      const std::string rendered = render_model_chat(m, *tok, c["messages"]);
      EXPECT_EQ(rendered, c["rendered"].get<std::string>());
      EXPECT_EQ(tok->encode(rendered, false, true), want) << rendered;
    }
    // The reference's generated text decodes from its ids (a final <|im_end|> decodes to nothing).
    EXPECT_EQ(tok->decode(c["generated_ids"].get<std::vector<int32_t>>()), c["text"].get<std::string>());
  }
}

TEST(E2ESmolLM2, TokenizeCommandMatchesLlamaCpp) {
  MK_NEED_SMOLLM2();
  const auto ref = read_json(std::string(MK_SHARED_DIR) + "/fixtures/smollm2/llamacpp_greedy.json");
  for (const auto& c : ref["cases"]) {
    const std::string text = c["kind"] == "raw" ? c["prompt"].get<std::string>() : c["rendered"].get<std::string>();
    const auto tmp = std::filesystem::temp_directory_path() / ("mk_smollm2_" + std::to_string(getpid()) + ".txt");
    std::ofstream(tmp, std::ios::binary) << text;
    int status = 0;
    const std::string out = run_cli("tokenize -m " + smollm2_path() + " -f " + tmp.string() + " --json --parse-special", &status);
    std::filesystem::remove(tmp);
    ASSERT_EQ(status, 0) << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["ids"], c["prompt_ids"]) << text;
    std::string joined;
    for (const auto& p : j["pieces"]) joined += p.get<std::string>();
    EXPECT_EQ(joined, text);
  }
}

// Greedy generation with the Q4_1 weights: the prompt ids and the first 16 generated ids equal
// llama.cpp's (all of them, and the stop, where llama.cpp ends at <|im_end|> sooner). Raw cases run
// with -p, chat cases with --messages. Skipped, saying so, while Q4_1 tensors cannot be loaded.
TEST(E2ESmolLM2, GreedyFirstTokenMatchesLlamaCpp) {
  MK_NEED_SMOLLM2();
  const auto ref = read_json(std::string(MK_SHARED_DIR) + "/fixtures/smollm2/llamacpp_greedy.json");
  const std::string base = "run --json --temp 0 --backend cpu -t 2 -m " + smollm2_path();
  int status = 0;
  const std::string probe = run_cli(base + " -n 1 -p x", &status);
  if (status != 0 && probe.find("unsupported tensor type q4_1") != std::string::npos)
    GTEST_SKIP() << "Q4_1 weights are not supported by this build: " << probe;
  ASSERT_EQ(status, 0) << probe;
  const auto tmp = std::filesystem::temp_directory_path() / ("mk_smollm2_msgs_" + std::to_string(getpid()) + ".json");
  for (const auto& c : ref["cases"]) {
    std::string out;
    if (c["kind"] == "raw") {
      out = run_cli(base + " -n 16 -p '" + c["prompt"].get<std::string>() + "'", &status);
    } else {
      std::ofstream(tmp) << c["messages"].dump();
      out = run_cli(base + " -n 16 --messages " + tmp.string(), &status);
    }
    ASSERT_EQ(status, 0) << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["rendered"], c["rendered"]);
    EXPECT_EQ(j["prompt_ids"], c["prompt_ids"]);
    std::vector<int32_t> want = c["generated_ids"].get<std::vector<int32_t>>();
    if (want.size() > 16) want.resize(16);
    const bool stops = !want.empty() && want.back() == 2;  // <|im_end|>: we stop there and do not report it
    if (stops) want.pop_back();
    // The first generated token is the argmax of the prompt's logits: it must agree. Later tokens
    // sit on near-ties (top-2 logit margins of 0.01..0.1 at several steps), where llama.cpp's exact
    // arithmetic decides. The cpu backend follows it for GGUF files (--act-quant/--kv-type auto:
    // q8_1 activation blocks with ggml's integer dots, f16 K/V/query/probabilities; docs/quantization.md),
    // measured 2026-11-30: 16, 16, 6 (all, then <|im_end|>) and 2 tokens equal on the four cases (with
    // float32 activations and KV: 6, 16, 2, 2); since the block-integer dots (2026-12-03), on a Zen 1
    // (AVX2) on 2026-12-05: 16, 16, 2, 2. llama.cpp itself does not hold these ids across machines and
    // versions: 0.3.16 built on that Zen 1 shares 7, 16, 2 and 20 tokens with this fixture (0.3.36),
    // and the first 32 of ours there: 7, 27, all 11, 2 (docs/quantization.md). So only the first
    // token is asserted; the common prefix is printed.
    const auto got = j["generated_ids"].get<std::vector<int32_t>>();
    ASSERT_FALSE(got.empty()) << c["rendered"];
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(got[0], want[0]) << c["rendered"];
    size_t common = 0;
    while (common < got.size() && common < want.size() && got[common] == want[common]) ++common;
    std::printf("[ smollm2 ] %zu of %zu greedy tokens equal llama.cpp's before the first difference\n", common, want.size());
  }
  std::filesystem::remove(tmp);
}

// `compile --emit program` gives the program's float32 KV layout, and for a llama.cpp-like GGUF also
// what the cpu backend allocates by default (f16): 30 layers x {k, v} x 256 rows x 3 KV heads x 64
// x 2 bytes. It reported only the float32 size, twice what `run` uses. A float GGUF has no such line.
TEST(E2ESmolLM2, CompileReportsTheCpuF16KvCache) {
  MK_NEED_SMOLLM2();
  int status = 0;
  const std::string out = run_cli("compile -m " + smollm2_path() + " --emit program -c 256", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("kv cache " + std::to_string(30 * 2 * 256 * 3 * 64 * 4) + " bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("\n  kv cache on the cpu backend: " + std::to_string(30 * 2 * 256 * 3 * 64 * 2) +
                     " bytes (f16, its default for this GGUF: --kv-type auto)\n"),
            std::string::npos)
      << out;
  const std::string f32 =
      run_cli("compile -m " + std::string(MK_SOURCE_DIR) + "/tests/data/gemma3/gemma3-tiny.f32.gguf --emit program", &status);
  ASSERT_EQ(status, 0) << f32;
  EXPECT_EQ(f32.find("kv cache on the cpu backend"), std::string::npos) << f32;
}

}  // namespace
}  // namespace mk
