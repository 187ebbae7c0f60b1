// iq4_nl weights (ggml id 20) in a file llama.cpp's quantizer wrote: tests/data/iq4_nl holds a tiny
// random llama with 96- and 160-wide rows (multiples of 32, not of 256) that llama.cpp quantized to
// Q3_K_M, which makes its matrices iq4_nl, q5_0, q5_1 and q8_0 (the "fallback" types of a Q2_K / Q3_K
// / IQ4_XS file whose rows are not whole super-blocks, as SmolLM2-135M's), and llama.cpp's logits at
// every position of a 20-token prompt (gen_iq4_nl.py, f32 KV cache).
//  - the file loads with llama.cpp's types per tensor;
//  - cpu (activations quantized to q8_0 as llama.cpp's, f32 KV cache as the oracle's) gives llama.cpp's
//    logits within rel L2 2e-4, whole prompt and prefill + one-token steps (measured 5.6e-5 and 6.7e-5
//    over all rows, 1.5e-7 on the last row alone: llama.cpp's 20-row matmuls sum in another order than
//    its one-row dots; float activations are 2e-2 away, an f16 KV cache 1.5e-2);
//  - reference and cuda-emu (weights dequantized, float32 activations) agree with each other within
//    1e-5 and with llama.cpp within the activation quantization's 5e-2 (measured 2.1e-2).
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

const std::string kDir = std::string(MK_SOURCE_DIR) + "/tests/data/iq4_nl/";
const std::string kGguf = kDir + "tiny-q3_k_m.gguf";

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

TEST(E2EIq4Nl, FileLoadsWithLlamaCppsTypes) {
  const ModelFile m = load_model(kGguf);
  int iq4 = 0;
  for (const auto& [name, type] : expected().at("types").items()) {
    const WeightTensor* t = m.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(dtype_name(t->dtype), type.get<std::string>()) << name;
    iq4 += t->dtype == DType::IQ4_NL;
  }
  EXPECT_EQ(iq4, 9);  // token_embd, and q, k, gate, up of both layers
}

TEST(E2EIq4Nl, CpuMatchesLlamaCpp) {
  const std::vector<float> got = prompt_logits("cpu"), want = want_logits();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), 2e-4);
}

TEST(E2EIq4Nl, CpuPrefillThenOneTokenStepsMatchLlamaCpp) {
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

TEST(E2EIq4Nl, FloatBackendsAgree) {
  const std::vector<float> ref = prompt_logits("reference"), emu = prompt_logits("cuda-emu");
  EXPECT_LT(test::rel_l2(emu, ref), 1e-5);
  EXPECT_LT(test::rel_l2(ref, want_logits()), 5e-2);
}

}  // namespace
}  // namespace mk
