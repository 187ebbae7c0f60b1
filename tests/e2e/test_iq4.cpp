// iq4_nl (ggml id 20) and iq4_xs (id 23) weights in files llama.cpp's quantizer wrote, with llama.cpp's
// logits at every position of a 20-token prompt (f32 KV cache):
//  - tests/data/iq4_nl (gen_iq4_nl.py): a tiny random llama with 96- and 160-wide rows (multiples of
//    32, not of 256) quantized to Q3_K_M, which makes its matrices iq4_nl, q5_0, q5_1 and q8_0 (the
//    "fallback" types of a Q2_K / Q3_K / IQ4_XS file whose rows are not whole super-blocks, as
//    SmolLM2-135M's);
//  - tests/data/iq4_xs (gen_iq4_xs.py): a tiny random one-layer llama with 256-wide rows quantized to
//    IQ4_XS (matrices and token embeddings iq4_xs, the output q6_K).
// For each:
//  - the file loads with llama.cpp's types per tensor;
//  - cpu (activations quantized to q8_0 / q8_K as llama.cpp's, f32 KV cache as the oracle's) gives
//    llama.cpp's logits within rel L2 2e-4, whole prompt and prefill + one-token steps (iq4_nl: 5.6e-5
//    and 6.7e-5 over all rows, 1.5e-7 on the last row alone: llama.cpp's 20-row matmuls sum in
//    another order than its one-row dots; float activations are 2e-2 away, an f16 KV cache 1.5e-2;
//    iq4_xs: 1.1e-7 on the last row);
//  - reference and cuda-emu (weights dequantized, float32 activations) agree with each other within
//    1e-5 and with llama.cpp within the activation quantization's 5e-2 (measured 2.1e-2 and 1.4e-2).
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

struct Iq4File {
  std::string name, file;
  DType dtype;
  int n_tensors;  // tensors of that type
};

class E2EIq4 : public testing::TestWithParam<Iq4File> {
 protected:
  std::string dir() const { return std::string(MK_SOURCE_DIR) + "/tests/data/" + GetParam().name + "/"; }
  std::string gguf() const { return dir() + GetParam().file; }
  const nlohmann::json& expected() {
    if (expected_.is_null()) expected_ = nlohmann::json::parse(std::ifstream(dir() + "expected.json"));
    return expected_;
  }
  std::vector<int32_t> prompt() { return expected().at("prompt_ids").get<std::vector<int32_t>>(); }
  std::vector<float> want_logits(size_t from = 0) {
    std::vector<float> r;
    const auto& rows = expected().at("logits");
    for (size_t i = from; i < rows.size(); ++i)
      for (const auto& v : rows[i]) r.push_back(v.get<float>());
    return r;
  }
  // The model, its graph and a backend on them (a backend keeps references to both).
  struct Loaded {
    ModelFile m;
    Graph g;
    std::unique_ptr<Backend> b;
  };
  std::unique_ptr<Loaded> load(const std::string& backend, bool all_logits) {
    auto l = std::make_unique<Loaded>();
    l->m = load_model(gguf());
    l->g = build_graph(l->m, {64, all_logits});
    BackendOptions bo;
    bo.threads = 2;
    bo.kv_type = backend == "cpu" ? "f32" : "auto";
    l->b = make_backend(backend, l->g, l->m, bo);
    return l;
  }
  std::vector<float> prompt_logits(const std::string& backend) { return load(backend, true)->b->forward(prompt(), 0); }

 private:
  nlohmann::json expected_;
};

TEST_P(E2EIq4, FileLoadsWithLlamaCppsTypes) {
  const ModelFile m = load_model(gguf());
  int n = 0;
  for (const auto& [name, type] : expected().at("types").items()) {
    const WeightTensor* t = m.find(name);
    ASSERT_NE(t, nullptr) << name;
    std::string want = type.get<std::string>();  // gguf-py's lower-case names: q6_k
    std::transform(want.begin(), want.end(), want.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string got(dtype_name(t->dtype));
    std::transform(got.begin(), got.end(), got.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    EXPECT_EQ(got, want) << name;
    n += t->dtype == GetParam().dtype;
  }
  EXPECT_EQ(n, GetParam().n_tensors);
}

TEST_P(E2EIq4, CpuMatchesLlamaCpp) {
  const std::vector<float> got = prompt_logits("cpu"), want = want_logits();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), 2e-4);
}

TEST_P(E2EIq4, CpuPrefillThenOneTokenStepsMatchLlamaCpp) {
  const auto ids = prompt();
  const auto l = load("cpu", false);
  Backend* b = l->b.get();
  const size_t n_prefill = 7;
  std::vector<float> got = b->forward(std::span<const int32_t>(ids.data(), n_prefill), 0);
  for (size_t p = n_prefill; p < ids.size(); ++p) {
    const std::vector<float> l = b->forward(std::span<const int32_t>(ids.data() + p, 1), static_cast<int64_t>(p));
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LT(test::rel_l2(got, want_logits(n_prefill - 1)), 2e-4);
}

TEST_P(E2EIq4, FloatBackendsAgree) {
  const std::vector<float> ref = prompt_logits("reference"), emu = prompt_logits("cuda-emu");
  EXPECT_LT(test::rel_l2(emu, ref), 1e-5);
  EXPECT_LT(test::rel_l2(ref, want_logits()), 5e-2);
}

INSTANTIATE_TEST_SUITE_P(LlamaCppFiles, E2EIq4,
                         testing::Values(Iq4File{"iq4_nl", "tiny-q3_k_m.gguf", DType::IQ4_NL, 9},  // token_embd; q, k, gate, up of 2 layers
                                         Iq4File{"iq4_xs", "tiny-iq4_xs.gguf", DType::IQ4_XS, 8}),  // token_embd; q, k, v, o, gate, up, down
                         [](const testing::TestParamInfo<Iq4File>& i) { return i.param.name; });

}  // namespace
}  // namespace mk
