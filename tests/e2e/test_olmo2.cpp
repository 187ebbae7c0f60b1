// OLMo 2 (GGUF arch olmo2, HF model_type olmo2) against llama.cpp: the tiny model of tests/data/olmo2
// (4 layers without pre-norms, post-attention and post-FFN RMSNorms, q/k RMSNorms over the whole
// projections; 4 heads / 2 KV heads of 16; written by gen_olmo2.py, which also stores llama.cpp's
// logits at every position of a 24-token prompt and the same weights as an HF directory).
//  - GGUF logits at every position equal llama.cpp's on reference, cpu and cuda-emu (measured 5e-7 on
//    the last row), and through prefill + one-token steps on cpu and cuda-emu;
//  - the HF directory gives the GGUF's logits;
//  - the graph has no pre-norm and q/k norms as wide as the projections; a missing post-norm or q/k
//    norm is named.
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

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/olmo2/";
const std::string kGguf = kDir + "olmo2-tiny.f32.gguf";
constexpr double kTol = 1e-4;

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

class E2EOlmo2 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EOlmo2, GgufLogitsMatchLlamaCpp) {
  const Expected& e = expected();
  const std::vector<float> got = prompt_logits(kGguf, GetParam());
  const std::vector<float> want = test::flat_rows(e.logits);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), kTol) << GetParam();
  const int64_t n_vocab = static_cast<int64_t>(e.logits[0].size());
  EXPECT_EQ(test::argmax_rows(got, n_vocab), test::argmax_rows(want, n_vocab));
}

TEST_P(E2EOlmo2, PrefillThenOneTokenStepsMatchLlamaCpp) {
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

INSTANTIATE_TEST_SUITE_P(Backends, E2EOlmo2, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

TEST(E2EOlmo2Hf, HfDirectoryEqualsGguf) {
  EXPECT_LT(test::rel_l2(prompt_logits(kDir + "hf", "cpu"), prompt_logits(kGguf, "cpu")), 1e-5);
}

TEST(E2EOlmo2Graph, PostNormsOnlyAndWholeProjectionQkNorms) {
  for (const std::string& path : {kGguf, kDir + "hf"}) {
    Graph g = build_graph(load_model(path), {64, true});
    int norms = 0;
    for (const Node& n : g.nodes) {
      if (n.op != Op::rms_norm) continue;
      ++norms;
      EXPECT_EQ(n.name.find("attn_norm"), std::string::npos) << n.name;
      if (n.name.ends_with(".q_norm")) {
        EXPECT_EQ(n.attr_int("group", 0), 0) << n.name;  // the whole row
      }
    }
    EXPECT_EQ(norms, 4 * 4 + 1) << path;  // q, k, post-attention, post-FFN per layer; the output norm
  }
  for (const char* drop : {"blk.2.post_ffw_norm.weight", "blk.0.attn_k_norm.weight", "blk.3.post_attention_norm.weight"}) {
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
}

}  // namespace
}  // namespace mk
