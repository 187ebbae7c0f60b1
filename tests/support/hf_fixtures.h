// The Hugging Face fixtures in ../shared/fixtures/hf (one directory per family and dtype, each with
// transformers' reference.json: prompt_ids, logits_last, logits_all_argmax, greedy_ids) and the
// comparison a backend is held to on them.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"

namespace mk::test {

inline const std::filesystem::path kHfFixtures = std::filesystem::path(MK_SHARED_DIR) / "fixtures" / "hf";

// "<family>_float32" and "<family>_bfloat16" for every family the fixtures cover.
inline std::vector<std::string> hf_fixture_names() {
  std::vector<std::string> r;
  for (const char* fam : {"gemma", "gpt2", "llama3_scaled_tied", "llama_gqa", "llama_mha_headdim", "mistral", "phi3",
                          "qwen2_bias", "qwen3_qknorm"})
    for (const char* dt : {"float32", "bfloat16"}) r.push_back(std::string(fam) + "_" + dt);
  return r;
}

struct HfReference {
  std::vector<int32_t> prompt;       // prompt_ids
  std::vector<float> logits_last;    // [n_vocab] transformers' logits at the last prompt position
  std::vector<int32_t> argmax_all;   // [n_prompt] argmax at every prompt position
  std::vector<int32_t> greedy;       // greedy_ids after the prompt
};

inline HfReference read_hf_reference(const std::filesystem::path& dir) {
  std::ifstream in(dir / "reference.json");
  EXPECT_TRUE(in.good()) << "missing " << (dir / "reference.json");
  const auto ref = nlohmann::json::parse(in);
  return {ref.at("prompt_ids").get<std::vector<int32_t>>(), ref.at("logits_last").get<std::vector<float>>(),
          ref.at("logits_all_argmax").get<std::vector<int32_t>>(), ref.at("greedy_ids").get<std::vector<int32_t>>()};
}

// The fixture's prompt prefilled on `backend` with logits at every position: the last row within
// relative L2 1e-4 (f32 weights) or 1e-2 (bf16) of transformers', every row's argmax equal. Skips
// (visibly) when the fixture is missing.
inline void expect_logits_match_transformers(const std::string& fixture, const std::string& backend,
                                             const BackendOptions& options) {
  const std::filesystem::path dir = kHfFixtures / fixture;
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "fixture missing: " << dir;
  const HfReference ref = read_hf_reference(dir);
  ModelFile m = load_model(dir.string());
  Graph all = build_graph(m, {static_cast<int64_t>(ref.prompt.size()) + 4, true});
  auto b = make_backend(backend, all, m, options);
  std::vector<float> logits = b->forward(ref.prompt, 0);
  const int64_t n_vocab = static_cast<int64_t>(ref.logits_last.size());
  ASSERT_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(ref.prompt.size()) * n_vocab);
  std::vector<float> last(logits.end() - n_vocab, logits.end());
  const double tol = fixture.find("bfloat16") != std::string::npos ? 1e-2 : 1e-4;
  EXPECT_LT(rel_l2(last, ref.logits_last), tol) << backend << " on " << fixture;
  std::vector<int32_t> got_argmax;
  for (size_t r = 0; r < ref.prompt.size(); ++r) {
    const float* row = logits.data() + static_cast<int64_t>(r) * n_vocab;
    got_argmax.push_back(static_cast<int32_t>(std::max_element(row, row + n_vocab) - row));
  }
  EXPECT_EQ(got_argmax, ref.argmax_all) << backend << " on " << fixture;
}

}  // namespace mk::test
