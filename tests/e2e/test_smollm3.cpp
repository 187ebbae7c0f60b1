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
#include "support/arch_fixture.h"
#include "support/cli.h"

namespace mk {
namespace {

const test::ArchFixture& fixture() { return test::arch_fixture("smollm3"); }
const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/smollm3/";
const std::string kGguf = kDir + "smollm3-tiny.f32.gguf";
constexpr double kTol = 1e-4;

class E2ESmolLM3 : public ::testing::TestWithParam<std::string> {};

TEST_P(E2ESmolLM3, GgufLogitsMatchLlamaCpp) { test::expect_fixture_logits(kGguf, fixture(), GetParam(), kTol); }

TEST_P(E2ESmolLM3, PrefillThenOneTokenStepsMatchLlamaCpp) {
  if (GetParam() == "reference") GTEST_SKIP() << "the prompt at once covers it";
  test::expect_stepped_logits(kGguf, fixture(), GetParam(), kTol);
}

INSTANTIATE_TEST_SUITE_P(Backends, E2ESmolLM3, ::testing::Values("reference", "cpu", "cuda-emu"), test::backend_test_name);

std::vector<float> prompt_logits(const std::string& path, const std::string& backend) {
  return test::fixture_logits(path, fixture(), backend);
}


TEST(E2ESmolLM3Graph, RopeOnlyOutsideTheNopeLayers) {
  for (const std::string& path : {kGguf, kDir + "hf"}) {
    ModelFile m = load_model(path);
    Graph g = build_graph(m, {64, true});
    std::vector<int64_t> roped;
    for (const Node& n : g.nodes)
      if (n.op == Op::rope && n.name.ends_with(".q_rope")) roped.push_back(std::stoll(n.name.substr(4)));
    std::vector<int64_t> want;
    const auto nope = fixture().expected.at("nope_layers").get<std::vector<int64_t>>();
    for (int64_t il = 0; il < 8; ++il)
      if (std::find(nope.begin(), nope.end(), il) == nope.end()) want.push_back(il);
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
  const std::string path = test::gguf_variant(kGguf, "", [](ModelFile& m) {
    nlohmann::ordered_json renamed = nlohmann::ordered_json::object();
    for (const auto& [k, v] : m.metadata.items()) renamed[k.starts_with("smollm3.") ? "llama." + k.substr(8) : k] = v;
    renamed["general.architecture"] = "llama";
    m.metadata = renamed;
  });
  EXPECT_GT(test::rel_l2(prompt_logits(path, "cpu"), test::flat_rows(fixture().logits)), 100 * kTol);
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
