// Phi-3 LongRoPE against llama.cpp: the tiny model of tests/data/phi3_longrope (written by
// gen_phi3_longrope.py with llama.cpp's logits for a 24-token prompt at two contexts). As llama.cpp,
// a context beyond the original one (64 > 32) rotates with the long factors, else (32) with the
// short ones; both scale the rotated values by phi3.rope.scaling.attn_factor. The HF directory with
// the same weights (rope_scaling type longrope) gives the same logits as the GGUF.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"

namespace mk {
namespace {

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/phi3_longrope/";

const nlohmann::json& expected() {
  static const nlohmann::json j = [] {
    std::ifstream in(kDir + "expected.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::vector<float> flat(const nlohmann::json& rows) {
  std::vector<float> r;
  for (const auto& row : rows)
    for (const auto& x : row) r.push_back(x.get<float>());
  return r;
}

std::vector<float> logits(const std::string& path, const std::string& backend, int64_t n_ctx) {
  ModelFile m = load_model(path);
  Graph g = build_graph(m, {n_ctx, true});
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend(backend, g, m, bo);
  return b->forward(expected().at("prompt_ids").get<std::vector<int32_t>>(), 0);
}

class E2EPhi3LongRope : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EPhi3LongRope, GgufLogitsMatchLlamaCppForLongAndShortContexts) {
  for (const char* which : {"long", "short"}) {
    const auto& e = expected().at(which);
    const std::vector<float> want = flat(e.at("logits"));
    const std::vector<float> got = logits(kDir + "phi3-longrope.f32.gguf", GetParam(), e.at("n_ctx").get<int64_t>());
    const double err = test::rel_l2(got, want);
    EXPECT_LT(err, 2e-5) << which;  // measured 1e-6 (silu and RoPE in f32 on both sides)
    RecordProperty(std::string("rel_l2_") + which, std::to_string(err));
  }
  // The two factor sets give different logits: the choice is what makes both agree.
  EXPECT_GT(test::rel_l2(flat(expected().at("long").at("logits")), flat(expected().at("short").at("logits"))), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EPhi3LongRope, ::testing::Values("reference", "cpu"),
                         [](const auto& info) { return info.param; });

TEST(E2EPhi3LongRopeHf, HfDirectoryEqualsGguf) {
  for (int64_t n_ctx : {64, 32}) {
    const std::vector<float> gguf = logits(kDir + "phi3-longrope.f32.gguf", "cpu", n_ctx);
    const std::vector<float> hf = logits(kDir + "hf", "cpu", n_ctx);
    EXPECT_LT(test::rel_l2(hf, gguf), 1e-5) << "n_ctx " << n_ctx;
  }
}

}  // namespace
}  // namespace mk
