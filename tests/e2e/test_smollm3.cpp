// SmolLM3 (GGUF arch smollm3, HF model_type smollm3) against llama.cpp: the tiny model of
// tests/data/smollm3 (8 layers, layers 3 and 7 without RoPE; 4 heads / 2 KV heads of 16; written by
// gen_smollm3.py, which also stores llama.cpp's logits at every position of a 24-token prompt and
// the same weights as an HF directory).
//  - GGUF logits at every position equal llama.cpp's on reference, cpu and cuda-emu (measured ~6e-6),
//    and through prefill + one-token steps on cpu and cuda-emu;
//  - the HF directory (q/k not permuted, RoPE on halves; NoPE layers from no_rope_layer_interval or an
//    explicit no_rope_layers list) gives the GGUF's logits;
//  - the same file read as a plain llama (RoPE in every layer) is far from llama.cpp's: the NoPE layers
//    are what makes them agree; the graph has RoPE in the other layers only.
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

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/smollm3/";
const std::string kGguf = kDir + "smollm3-tiny.f32.gguf";
constexpr double kTol = 1e-4;

struct Expected {
  std::vector<int32_t> prompt;
  std::vector<std::vector<float>> logits;  // [n_tokens][n_vocab]
  std::vector<int64_t> nope_layers;
};

const Expected& expected() {
  static const Expected e = [] {
    std::ifstream in(kDir + "expected.json");
    const auto j = nlohmann::json::parse(in);
    return Expected{j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("logits").get<std::vector<std::vector<float>>>(),
                    j.at("nope_layers").get<std::vector<int64_t>>()};
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

class E2ESmolLM3 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2ESmolLM3, GgufLogitsMatchLlamaCpp) {
  const Expected& e = expected();
  const std::vector<float> got = prompt_logits(kGguf, GetParam());
  const std::vector<float> want = test::flat_rows(e.logits);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), kTol) << GetParam();
  const int64_t n_vocab = static_cast<int64_t>(e.logits[0].size());
  EXPECT_EQ(test::argmax_rows(got, n_vocab), test::argmax_rows(want, n_vocab));
}

TEST_P(E2ESmolLM3, PrefillThenOneTokenStepsMatchLlamaCpp) {
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

INSTANTIATE_TEST_SUITE_P(Backends, E2ESmolLM3, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

TEST(E2ESmolLM3Graph, RopeOnlyOutsideTheNopeLayers) {
  for (const std::string& path : {kGguf, kDir + "hf"}) {
    ModelFile m = load_model(path);
    Graph g = build_graph(m, {64, true});
    std::vector<int64_t> roped;
    for (const Node& n : g.nodes)
      if (n.op == Op::rope && n.name.ends_with(".q_rope")) roped.push_back(std::stoll(n.name.substr(4)));
    std::vector<int64_t> want;
    for (int64_t il = 0; il < 8; ++il)
      if (std::find(expected().nope_layers.begin(), expected().nope_layers.end(), il) == expected().nope_layers.end())
        want.push_back(il);
    EXPECT_EQ(roped, want) << path;
  }
}

// `info` names the layers without RoPE (new-user trial 54: it did not show them).
TEST(E2ESmolLM3Graph, InfoNamesTheLayersWithoutRope) {
  int status = -1;
  const std::string out = test::run_cli("info -m " + kGguf, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("rope:         adjacent, n_rot 16, theta 10000; none in layers 3, 7\n"), std::string::npos) << out;
}

// The same GGUF as arch llama (RoPE everywhere): far from llama.cpp's SmolLM3 logits.
TEST(E2ESmolLM3Graph, RopeInEveryLayerDiffers) {
  ModelFile raw = load_gguf(kGguf);
  ModelFile m;
  m.path = raw.path;
  m.format = raw.format;
  for (const auto& [k, v] : raw.metadata.items()) m.metadata[k.starts_with("smollm3.") ? "llama." + k.substr(8) : k] = v;
  m.metadata["general.architecture"] = "llama";
  for (const WeightTensor& t : raw.tensors()) m.add_tensor(t);
  const std::string path = (std::filesystem::path(testing::TempDir()) / "mk_smollm3_as_llama.gguf").string();
  test::write_gguf(m, path);
  EXPECT_GT(test::rel_l2(prompt_logits(path, "cpu"), test::flat_rows(expected().logits)), 100 * kTol);
}

TEST(E2ESmolLM3Hf, HfDirectoryEqualsGguf) {
  const std::vector<float> gguf = prompt_logits(kGguf, "cpu");
  EXPECT_LT(test::rel_l2(prompt_logits(kDir + "hf", "cpu"), gguf), 1e-5);
  // an explicit no_rope_layers list (1 = RoPE) as the interval gives it, then one that differs
  const std::string dir = testing::TempDir() + "smollm3_list";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "hf/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(kDir + "hf/config.json"));
  c.erase("no_rope_layer_interval");
  c["no_rope_layers"] = {1, 1, 1, 0, 1, 1, 1, 0};
  std::ofstream(dir + "/config.json") << c.dump();
  EXPECT_LT(test::rel_l2(prompt_logits(dir, "cpu"), gguf), 1e-5);
  c["no_rope_layers"] = {1, 1, 1, 1, 1, 1, 1, 1};
  std::ofstream(dir + "/config.json") << c.dump();
  EXPECT_GT(test::rel_l2(prompt_logits(dir, "cpu"), gguf), 100 * kTol);
  for (const auto& [bad, why] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{1, 1, 1}, "no_rope_layers must list 0 or 1 for each of the 8 layers"},
           {{1, 1, 1, 2, 1, 1, 1, 0}, "no_rope_layers[3] = 2 must be 0 or 1"},
           {"all", "no_rope_layers must list 0 or 1"}}) {
    c["no_rope_layers"] = bad;
    std::ofstream(dir + "/config.json") << c.dump();
    try {
      prompt_logits(dir, "cpu");
      ADD_FAILURE() << "accepted no_rope_layers = " << bad.dump();
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(why), std::string::npos) << err.what();
    }
  }
  c.erase("no_rope_layers");
  c["use_sliding_window"] = true;
  c["sliding_window"] = 8;
  std::ofstream(dir + "/config.json") << c.dump();
  EXPECT_THROW(prompt_logits(dir, "cpu"), Error);
}

}  // namespace
}  // namespace mk
