// StarCoder2 (GGUF arch starcoder2, HF model_type starcoder2) against llama.cpp: the tiny model of
// tests/data/starcoder2 (4 layers, LayerNorms and projections with biases, an ungated GELU MLP; 4 heads
// / 2 KV heads of 16; written by gen_starcoder2.py, which also stores llama.cpp's logits at every
// position of a 24-token prompt and the same weights as an HF directory).
//  - GGUF logits at every position within 1e-3 of llama.cpp's on reference, cpu and cuda-emu (5.3e-4
//    on the last row: llama.cpp's GELU goes through an f16 table; a float64 numpy StarCoder2 is 7e-7
//    from ours and, with that table, 1e-4 from llama.cpp), and through prefill + one-token steps;
//  - the HF directory gives the GGUF's logits; its sliding_window windows every layer;
//  - missing biases are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"
#include "support/error.h"
#include "support/gguf_write.h"

namespace mk {
namespace {

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/starcoder2/";
const std::string kGguf = kDir + "starcoder2-tiny.f32.gguf";
constexpr double kTol = 1e-3;

struct Expected {
  std::vector<int32_t> prompt;
  std::vector<std::vector<float>> logits;  // [n_tokens][n_vocab]
};

const Expected& expected() {
  static const Expected e = [] {
    std::ifstream in(kDir + "expected.json");
    const auto j = nlohmann::json::parse(in);
    return Expected{j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("logits").get<std::vector<std::vector<float>>>()};
  }();
  return e;
}

std::vector<float> prompt_logits(const ModelFile& m, const std::string& backend) {
  Graph g = build_graph(m, {64, true});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";  // as the oracle's cache
  return make_backend(backend, g, m, bo)->forward(expected().prompt, 0);
}
std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  return prompt_logits(load_model(path), backend);
}

class E2EStarcoder2 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EStarcoder2, GgufLogitsMatchLlamaCpp) {
  const Expected& e = expected();
  const std::vector<float> got = prompt_logits(kGguf, GetParam());
  const std::vector<float> want = test::flat_rows(e.logits);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), kTol) << GetParam();
  const int64_t n_vocab = static_cast<int64_t>(e.logits[0].size());
  EXPECT_EQ(test::argmax_rows(got, n_vocab), test::argmax_rows(want, n_vocab));
}

TEST_P(E2EStarcoder2, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  const Expected& e = expected();
  ModelFile m = load_model(kGguf);
  Graph g = build_graph(m, {64, false});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";
  auto b = make_backend(GetParam(), g, m, bo);
  const size_t n_prefill = 5;
  std::vector<float> got = b->forward(std::span<const int32_t>(e.prompt.data(), n_prefill), 0);
  for (size_t p = n_prefill; p < e.prompt.size(); ++p) {
    std::vector<float> l = b->forward(std::span<const int32_t>(e.prompt.data() + p, 1), static_cast<int64_t>(p));
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LT(test::rel_l2(got, test::flat_rows(e.logits, n_prefill - 1)), kTol) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EStarcoder2, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

TEST(E2EStarcoder2Hf, HfDirectoryEqualsGguf) {
  EXPECT_LT(test::rel_l2(prompt_logits(kDir + "hf", "cpu"), prompt_logits(kGguf, "cpu")), 1e-5);
}

TEST(E2EStarcoder2Graph, BiasesAreRequiredAndTheHfWindowCoversEveryLayer) {
  for (const char* drop : {"blk.2.attn_k.bias", "blk.0.ffn_up.bias", "blk.3.ffn_norm.bias", "output_norm.bias"}) {
    ModelFile raw = load_gguf(kGguf), m;
    m.path = raw.path;
    m.format = raw.format;
    m.metadata = raw.metadata;
    for (const WeightTensor& t : raw.tensors())
      if (t.name != drop) m.add_tensor(t);
    try {
      build_graph(m, {64, false});
      ADD_FAILURE() << "built without " << drop;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("missing tensor ") + drop), std::string::npos) << e.what();
    }
  }
  for (const std::string& path : {kGguf, kDir + "hf"}) {  // no window in either as written
    Graph g = build_graph(load_model(path), {64, true});
    for (const Node& n : g.nodes)
      if (n.op == Op::attention) {
        EXPECT_EQ(n.attr_int("window", 0), 0) << path;
      }
  }
  const std::string dir = testing::TempDir() + "starcoder2_window";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "hf/model.safetensors", dir + "/model.safetensors", std::filesystem::copy_options::overwrite_existing);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(kDir + "hf/config.json"));
  c["sliding_window"] = 8;
  std::ofstream(dir + "/config.json") << c.dump();
  int windowed = 0;
  for (const Node& n : build_graph(load_model(dir), {64, true}).nodes)
    if (n.op == Op::attention) windowed += n.attr_int("window", 0) == 8;
  EXPECT_EQ(windowed, 4);
  EXPECT_GT(test::rel_l2(prompt_logits(dir, "cpu"), test::flat_rows(expected().logits)), 10 * kTol);
}

}  // namespace
}  // namespace mk
