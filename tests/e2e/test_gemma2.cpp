// Gemma 2 (GGUF arch gemma2, HF model_type gemma2) against llama.cpp: the tiny model of
// tests/data/gemma2 (4 layers, 0 and 2 local with a sliding window of 8, 1 and 3 global; attention
// scores soft-capped at 2, logits at 6; head_dim 16 with n_embd / n_head 12; written by
// gen_gemma2.py, which also stores llama.cpp's logits at every position of a 24-token prompt).
//  - GGUF logits at every position equal llama.cpp's on reference, cpu and cuda-emu (prompt at once),
//    and on cpu and cuda-emu through prefill + one-token decode steps;
//  - the HF directory with the same weights (HF names, norms w instead of 1 + w) gives the same logits
//    as the GGUF on our engine;
//  - without either soft-cap (removed from the graph) the logits are far from llama.cpp's: each one
//    is what makes them agree; the listing names both.
// Tolerance as test_gemma3.cpp (llama.cpp's GELU through an f16 table): rel L2 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"
#include "support/error.h"

namespace mk {
namespace {

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/gemma2/";
const std::string kGguf = kDir + "gemma2-tiny.f32.gguf";
constexpr double kTolLlamaCpp = 1e-3;

struct Expected {
  std::vector<int32_t> prompt;
  std::vector<std::vector<float>> logits;  // [n_tokens][n_vocab]
  int64_t window = 0;
  double attn_softcap = 0, final_softcap = 0;
};

const Expected& expected() {
  static const Expected e = [] {
    std::ifstream in(kDir + "expected.json");
    const auto j = nlohmann::json::parse(in);
    return Expected{j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("logits").get<std::vector<std::vector<float>>>(),
                    j.at("window").get<int64_t>(), j.at("attn_softcap").get<double>(),
                    j.at("final_softcap").get<double>()};
  }();
  return e;
}

std::vector<float> run_prompt(const Graph& g, const ModelFile& m, const std::string& backend) {
  BackendOptions bo;
  bo.threads = 3;
  return make_backend(backend, g, m, bo)->forward(expected().prompt, 0);
}

std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  ModelFile m = load_model(path);
  return run_prompt(build_graph(m, {32, true}), m, backend);
}

class E2EGemma2 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EGemma2, GgufLogitsMatchLlamaCpp) {
  const Expected& e = expected();
  const std::vector<float> got = prompt_logits(kGguf, GetParam());
  const std::vector<float> want = test::flat_rows(e.logits);
  ASSERT_EQ(got.size(), want.size());
  const double err = test::rel_l2(got, want);
  EXPECT_LT(err, kTolLlamaCpp) << GetParam();
  const int64_t n_vocab = static_cast<int64_t>(e.logits[0].size());
  EXPECT_EQ(test::argmax_rows(got, n_vocab), test::argmax_rows(want, n_vocab));
  // The final soft-cap bounds every logit by the cap (llama.cpp's largest is within 0.1% of it).
  EXPECT_LE(*std::max_element(got.begin(), got.end()), e.final_softcap);
  RecordProperty("rel_l2", std::to_string(err));
}

// Prefill of 5 rows, then one token per step: the decode path's scores (cpu: the f32 cache's
// portable loop; cuda-emu: the device's) cross the window of the local layers.
TEST_P(E2EGemma2, PrefillThenOneTokenStepsMatchLlamaCpp) {
  const Expected& e = expected();
  ModelFile m = load_model(kGguf);
  Graph g = build_graph(m, {32, false});
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend(GetParam(), g, m, bo);
  const size_t n_prefill = 5;
  std::vector<float> got = b->forward(std::span<const int32_t>(e.prompt.data(), n_prefill), 0);
  for (size_t p = n_prefill; p < e.prompt.size(); ++p) {
    std::vector<float> l = b->forward(std::span<const int32_t>(e.prompt.data() + p, 1), static_cast<int64_t>(p));
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LT(test::rel_l2(got, test::flat_rows(e.logits, n_prefill - 1)), kTolLlamaCpp) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EGemma2, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

// With llama.cpp's numerics (--act-quant on: GELU through ggml's f16 table; an f32 KV cache as the
// oracle's), the cpu's logits at every position are llama.cpp's within 1e-5 (measured ~9e-7 on the last
// row); without the table they are ~2e-4 away.
TEST(E2EGemma2Numerics, CpuWithLlamaCppsGeluMatchesTo1e5) {
  ModelFile m = load_model(kGguf);
  Graph g = build_graph(m, {32, true});
  BackendOptions bo;
  bo.threads = 2;
  bo.act_quant = "on";
  bo.kv_type = "f32";
  const std::vector<float> got = make_backend("cpu", g, m, bo)->forward(expected().prompt, 0);
  EXPECT_LT(test::rel_l2(got, test::flat_rows(expected().logits)), 1e-5);
  bo.act_quant = "off";
  EXPECT_GT(test::rel_l2(make_backend("cpu", g, m, bo)->forward(expected().prompt, 0), test::flat_rows(expected().logits)), 2e-5);
}

TEST(E2EGemma2Hf, HfDirectoryEqualsGguf) {
  const std::vector<float> gguf = prompt_logits(kGguf, "cpu");
  const std::vector<float> hf = prompt_logits(kDir + "hf", "cpu");
  EXPECT_LT(test::rel_l2(hf, gguf), 1e-6);
  EXPECT_LT(test::rel_l2(hf, test::flat_rows(expected().logits)), kTolLlamaCpp);
}

TEST(E2EGemma2Graph, WindowsAndSoftCapsAsTheFileSays) {
  const Expected& e = expected();
  for (const std::string& path : {kGguf, kDir + "hf"}) {
    ModelFile m = load_model(path);
    Graph g = build_graph(m, {32, true});
    std::vector<int64_t> windows;
    int capped = 0, final_caps = 0;
    for (const Node& n : g.nodes) {
      if (n.op == Op::attention) {
        windows.push_back(n.attr_int("window", 0));
        EXPECT_EQ(n.attr_float("softcap"), e.attn_softcap) << path << " " << n.name;
        ++capped;
      }
      if (n.op == Op::softcap) {
        EXPECT_EQ(n.attr_float("cap"), e.final_softcap) << path;
        ++final_caps;
      }
    }
    EXPECT_EQ(windows, (std::vector<int64_t>{e.window, 0, e.window, 0})) << path;  // even layers local
    EXPECT_EQ(capped, 4) << path;
    EXPECT_EQ(final_caps, 1) << path;
  }
}

// Each soft-cap removed on its own (the attention attribute erased; the final cap raised so far that
// tanh(x / cap) * cap is x): the logits leave llama.cpp's by far more than the tolerance.
TEST(E2EGemma2Graph, WithoutEitherSoftCapTheLogitsDiffer) {
  ModelFile m = load_model(kGguf);
  const std::vector<float> want = test::flat_rows(expected().logits);
  for (const bool attn : {true, false}) {
    Graph g = build_graph(m, {32, true});
    for (Node& n : g.nodes) {
      if (attn && n.op == Op::attention) n.attrs.erase("softcap");
      if (!attn && n.op == Op::softcap) n.attrs["cap"] = 1e9;
    }
    for (const char* backend : {"reference", "cpu"})
      EXPECT_GT(test::rel_l2(run_prompt(g, m, backend), want), 20 * kTolLlamaCpp)
          << (attn ? "attention" : "final") << " soft-cap removed, " << backend;
  }
}

// Bad soft-cap values in a config.json are named.
TEST(E2EGemma2Hf, BadSoftCapIsNamed) {
  const std::string dir = testing::TempDir() + "gemma2_badcap";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "hf/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(kDir + "hf/config.json"));
  for (const auto& bad : {nlohmann::json(-1.0), nlohmann::json("50"), nlohmann::json(0)}) {
    c["attn_logit_softcapping"] = bad;
    std::ofstream(dir + "/config.json") << c.dump();
    ModelFile m = load_model(dir);
    try {
      build_graph(m, {32, true});
      ADD_FAILURE() << "accepted attn_logit_softcapping = " << bad.dump();
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("attn_logit_softcapping"), std::string::npos) << err.what();
    }
  }
  // query_pre_attn_scalar: null is refused by name (transformers fails on None ** -0.5); absent is 256.
  c["query_pre_attn_scalar"] = nullptr;
  std::ofstream(dir + "/config.json") << c.dump();
  {
    ModelFile m = load_model(dir);
    try {
      build_graph(m, {32, true});
      ADD_FAILURE() << "accepted query_pre_attn_scalar = null";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("query_pre_attn_scalar = null must be a positive number"), std::string::npos)
          << err.what();
    }
  }
  c.erase("query_pre_attn_scalar");
  // null: no capping (transformers skips the tanh), so the logits are far from the capped ones.
  c["attn_logit_softcapping"] = nullptr;
  std::ofstream(dir + "/config.json") << c.dump();
  const std::vector<float> uncapped = prompt_logits(dir, "cpu");
  EXPECT_GT(test::rel_l2(uncapped, test::flat_rows(expected().logits)), 20 * kTolLlamaCpp);
}

}  // namespace
}  // namespace mk
