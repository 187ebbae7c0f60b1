// iq4_xs weights (ggml id 23) in a file llama.cpp's quantizer wrote: tests/data/iq4_xs holds a tiny
// random one-layer llama with 256-wide rows that llama.cpp quantized to IQ4_XS (matrices and token
// embeddings iq4_xs, the output q6_K), and llama.cpp's logits at every position of a 20-token prompt
// (gen_iq4_xs.py, f32 KV cache).
//  - the file loads with llama.cpp's types per tensor;
//  - cpu (activations quantized to q8_K as llama.cpp's, f32 KV cache as the oracle's) gives llama.cpp's
//    logits within rel L2 2e-4, whole prompt and prefill + one-token steps (measured 1.1e-7 on the last
//    row alone);
//  - reference and cuda-emu (weights dequantized, float32 activations) agree with each other within
//    1e-5 and with llama.cpp within the activation quantization's 5e-2 (measured 1.4e-2 on the last row).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"

namespace mk {
namespace {

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/iq4_xs/";
const std::string kGguf = kDir + "tiny-iq4_xs.gguf";

const nlohmann::json& expected() {
  static const nlohmann::json e = nlohmann::json::parse(std::ifstream(kDir + "expected.json"));
  return e;
}

std::vector<float> want_logits(size_t from = 0) {
  std::vector<float> r;
  const auto& rows = expected().at("logits");
  for (size_t i = from; i < rows.size(); ++i)
    for (const auto& v : rows[i]) r.push_back(v.get<float>());
  return r;
}

std::vector<float> prompt_logits(const std::string& backend) {
  ModelFile m = load_model(kGguf);
  Graph g = build_graph(m, {64, true});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = backend == "cpu" ? "f32" : "auto";
  return make_backend(backend, g, m, bo)->forward(expected().at("prompt_ids").get<std::vector<int32_t>>(), 0);
}

TEST(E2EIq4Xs, FileLoadsWithLlamaCppsTypes) {
  const ModelFile m = load_model(kGguf);
  int iq4 = 0;
  for (const auto& [name, type] : expected().at("types").items()) {
    const WeightTensor* t = m.find(name);
    ASSERT_NE(t, nullptr) << name;
    std::string want = type.get<std::string>();  // gguf-py's lower-case names: q6_k
    std::string got(dtype_name(t->dtype));
    std::transform(got.begin(), got.end(), got.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    EXPECT_EQ(got, want) << name;
    iq4 += t->dtype == DType::IQ4_XS;
  }
  EXPECT_EQ(iq4, 8);  // token_embd, and q, k, v, o, gate, up, down
}

TEST(E2EIq4Xs, CpuMatchesLlamaCpp) {
  const std::vector<float> got = prompt_logits("cpu"), want = want_logits();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), 2e-4);
}

TEST(E2EIq4Xs, CpuPrefillThenOneTokenStepsMatchLlamaCpp) {
  const auto prompt = expected().at("prompt_ids").get<std::vector<int32_t>>();
  ModelFile m = load_model(kGguf);
  Graph g = build_graph(m, {64, false});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";
  auto b = make_backend("cpu", g, m, bo);
  const size_t n_prefill = 7;
  std::vector<float> got = b->forward(std::span<const int32_t>(prompt.data(), n_prefill), 0);
  for (size_t p = n_prefill; p < prompt.size(); ++p) {
    const std::vector<float> l = b->forward(std::span<const int32_t>(prompt.data() + p, 1), static_cast<int64_t>(p));
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LT(test::rel_l2(got, want_logits(n_prefill - 1)), 2e-4);
}

TEST(E2EIq4Xs, FloatBackendsAgree) {
  const std::vector<float> ref = prompt_logits("reference"), emu = prompt_logits("cuda-emu");
  EXPECT_LT(test::rel_l2(emu, ref), 1e-5);
  EXPECT_LT(test::rel_l2(ref, want_logits()), 5e-2);
}

}  // namespace
}  // namespace mk
