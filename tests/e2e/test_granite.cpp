// Granite 3 (GGUF arch granite, HF model_type granite) against llama.cpp: the tiny model of
// tests/data/granite (8 layers, 4 heads / 2 KV heads of 16, Granite 3's multipliers: embeddings x 12,
// scores x 1/128, residual branches x 0.22, logits / 8; written by gen_granite.py, which also stores
// llama.cpp's logits at every position of a 24-token prompt and the same weights as an HF directory).
//  - GGUF logits at every position equal llama.cpp's on reference, cpu and cuda-emu (measured 5e-7 on
//    the last row), and through prefill + one-token steps on cpu and cuda-emu;
//  - the HF directory (the config's *_multiplier / logits_scaling) gives the GGUF's logits;
//  - each multiplier matters: the file with one of them neutral is far from llama.cpp's logits; as
//    llama.cpp, each key is required and 0 means none (not for the logit divisor); a negative one is
//    named.
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
#include "support/cli.h"
#include "support/gguf_write.h"

namespace mk {
namespace {

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/granite/";
const std::string kGguf = kDir + "granite-tiny.f32.gguf";
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

std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  ModelFile m = load_model(path);
  Graph g = build_graph(m, {64, true});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";  // as the oracle's cache
  return make_backend(backend, g, m, bo)->forward(expected().prompt, 0);
}

class E2EGranite : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EGranite, GgufLogitsMatchLlamaCpp) {
  const Expected& e = expected();
  const std::vector<float> got = prompt_logits(kGguf, GetParam());
  const std::vector<float> want = test::flat_rows(e.logits);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), kTol) << GetParam();
  const int64_t n_vocab = static_cast<int64_t>(e.logits[0].size());
  EXPECT_EQ(test::argmax_rows(got, n_vocab), test::argmax_rows(want, n_vocab));
}

TEST_P(E2EGranite, PrefillThenOneTokenStepsMatchLlamaCpp) {
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

INSTANTIATE_TEST_SUITE_P(Backends, E2EGranite, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

TEST(E2EGraniteHf, InfoShowsTheMultipliers) {
  int status = -1;
  const std::string out = test::run_cli("info -m " + kGguf, &status);
  EXPECT_EQ(status, 0) << out;
  for (const char* line : {"attention:    scale 0.0078125\n", "embeddings:   scaled by 12\n",
                           "residuals:    attention and feed-forward outputs scaled by 0.22\n", "logits:       divided by 8\n"})
    EXPECT_NE(out.find(line), std::string::npos) << line << out;
}

TEST(E2EGraniteHf, HfDirectoryEqualsGguf) {
  EXPECT_LT(test::rel_l2(prompt_logits(kDir + "hf", "cpu"), prompt_logits(kGguf, "cpu")), 1e-5);
}

// The GGUF with one metadata change, written to a temporary file.
std::string changed(const std::function<void(ModelFile&)>& change) {
  ModelFile raw = load_gguf(kGguf);
  ModelFile m;
  m.path = raw.path;
  m.format = raw.format;
  m.metadata = raw.metadata;
  for (const WeightTensor& t : raw.tensors()) m.add_tensor(t);
  change(m);
  static int n = 0;  // a file per change: a path stays what it was written as
  const std::string path = (std::filesystem::path(testing::TempDir()) / fmt::format("mk_granite_changed{}.gguf", n++)).string();
  test::write_gguf(m, path);
  return path;
}

TEST(E2EGraniteKeys, EachMultiplierMatters) {
  const std::vector<float> want = test::flat_rows(expected().logits);
  const std::vector<std::pair<const char*, double>> keys = {
      {"granite.embedding_scale", 1.0}, {"granite.attention.scale", 0.0}, {"granite.residual_scale", 1.0}, {"granite.logit_scale", 1.0}};
  for (const auto& [key, none] : keys) {
    // the neutral value (0 for the attention: 1/sqrt(head_dim)) is far from llama.cpp's logits
    const std::string neutral = changed([&](ModelFile& m) { m.metadata[key] = none; });
    EXPECT_GT(test::rel_l2(prompt_logits(neutral, "cpu"), want), 100 * kTol) << key << " = " << none;
    // 0 is llama.cpp's "none" where it can be (not for the logit divisor)
    if (std::string(key) != "granite.logit_scale") {
      EXPECT_EQ(prompt_logits(changed([&](ModelFile& m) { m.metadata[key] = 0.0; }), "cpu"),
                prompt_logits(changed([&](ModelFile& m) { m.metadata[key] = std::string(key) == "granite.attention.scale" ? 0.0 : 1.0; }), "cpu"))
          << key;
    }
    auto error_of = [&](const std::function<void(ModelFile&)>& change) {
      try {
        prompt_logits(changed(change), "cpu");
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    EXPECT_NE(error_of([&](ModelFile& m) { m.metadata.erase(key); }).find(std::string("missing metadata key ") + key), std::string::npos) << key;
    EXPECT_NE(error_of([&](ModelFile& m) { m.metadata[key] = -2.0; }).find(std::string(key) + " = -2 must be a positive number"), std::string::npos)
        << key;
  }
  EXPECT_NE([&] {
    try {
      prompt_logits(changed([](ModelFile& m) { m.metadata["granite.logit_scale"] = 0.0; }), "cpu");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }().find("granite.logit_scale = 0 must be a positive number"),
            std::string::npos);
  for (const auto& f : std::filesystem::directory_iterator(testing::TempDir()))
    if (f.path().filename().string().starts_with("mk_granite_changed")) std::filesystem::remove(f.path());
}

}  // namespace
}  // namespace mk
