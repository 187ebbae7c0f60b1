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
#include "support/arch_fixture.h"
#include "support/cli.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("granite"); }
const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/granite/";
const std::string kGguf = kDir + "granite-tiny.f32.gguf";
constexpr double kTol = 1e-4;

class E2EGranite : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EGranite, GgufLogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTol); }

TEST_P(E2EGranite, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTol);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EGranite, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  return test::fixture_logits(path, fixture(), backend);
}


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

// The GGUF with one metadata change, in a temporary file of its own.
std::string changed(const std::function<void(ModelFile&)>& change) { return test::gguf_variant(kGguf, "", change); }

TEST(E2EGraniteKeys, EachMultiplierMatters) {
  const std::vector<float> want = test::flat_rows(fixture().logits);
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
}

}  // namespace
}  // namespace mk
