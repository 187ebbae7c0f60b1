// End-to-end: whole models quantized in memory (quant::quantize_model) give logits close to the
// float32 model's on the cpu and reference backends, and the two backends agree closely. stories260K
// (../shared) for the 32-element block types (its 172-wide ffn_down rows stay f32: a mix of types);
// a synthetic 256-wide Llama for the K-quants (rows must be multiples of 256) and a Q4_K_M-style mix
// written to a GGUF file and loaded back through the loader.
#include <gtest/gtest.h>

#include <filesystem>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "support/compare.h"
#include "support/gguf_write.h"
#include "support/quant_models.h"

using namespace mk;

namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

std::vector<float> logits(const ModelFile& m, const std::string& backend, const std::string& numerics = "auto") {
  return test::prompt_then_decode_logits(m, backend, 64, numerics);
}

ModelFile synth_256() { return test::synth_256("quant-e2e", 64); }

// Quantized vs f32 logits (rel. L2) within `bound` (float32 activations and KV, and with llama.cpp's
// numerics: 8-bit activations (q8_0/q8_1, q8_K for the K-quants), f16 KV), and cpu vs reference within 1e-5.
void check(const ModelFile& f32, const ModelFile& q, double bound, const std::string& what) {
  const auto want = logits(f32, "cpu", "off");
  const auto cpu = logits(q, "cpu", "off");
  const auto llama = logits(q, "cpu", "on");
  const auto ref = logits(q, "reference");
  const double err = test::rel_l2(cpu, want), err_llama = test::rel_l2(llama, want);
  EXPECT_LT(err, bound) << what << ": quantized vs f32 logits";
  EXPECT_LT(err_llama, bound) << what << ": quantized with 8-bit activations and f16 KV vs f32 logits";
  EXPECT_GT(err, 0.0) << what << ": the weights were not quantized";
  EXPECT_LT(test::rel_l2(cpu, ref), 1e-5) << what << ": cpu vs reference";
  std::printf("  %-22s rel L2 vs f32 %.4f (llama.cpp numerics %.4f), cpu vs reference %.2e\n", what.c_str(), err,
              err_llama, test::rel_l2(cpu, ref));
}

}  // namespace

TEST(E2EQuant, Stories260KLegacyTypes) {
  const ModelFile f32 = load_model(kStories);
  // Bounds a few times above measured values (stories260K is small and sensitive to its weights).
  for (auto [t, bound] : std::vector<std::pair<DType, double>>{
           {DType::Q8_0, 0.02}, {DType::Q5_1, 0.1}, {DType::Q5_0, 0.1}, {DType::Q4_1, 0.2}, {DType::Q4_0, 0.2}}) {
    const ModelFile q = quant::quantize_model(f32, t);
    EXPECT_EQ(q.get("blk.0.attn_q.weight").dtype, t);
    EXPECT_EQ(q.get("blk.0.ffn_down.weight").dtype, DType::F32);  // rows of 172: not whole blocks
    check(f32, q, bound, "stories260K " + std::string(dtype_name(t)));
  }
}

TEST(E2EQuant, Synthetic256KQuants) {
  const ModelFile f32 = synth_256();
  // Random weights amplify errors through the layers more than trained ones do, and the K-quant
  // quantizers here are plain min/max ones: bounds are ~1.4x the measured values (docs/quantization.md).
  for (auto [t, bound] : std::vector<std::pair<DType, double>>{
           {DType::Q6_K, 0.07}, {DType::Q5_K, 0.12}, {DType::Q4_K, 0.25}, {DType::Q3_K, 0.5}, {DType::Q2_K, 1.0}}) {
    const ModelFile q = quant::quantize_model(f32, t);
    EXPECT_EQ(q.get("blk.1.ffn_down.weight").dtype, t);
    check(f32, q, bound, "synthetic-256 " + std::string(dtype_name(t)));
  }
}

TEST(E2EQuant, Q4KMStyleMixThroughAGgufFile) {
  const ModelFile f32 = synth_256();
  const ModelFile mixed = quant::quantize_model(f32, [](const WeightTensor& w) -> std::optional<DType> {
    if (w.shape.size() != 2) return std::nullopt;
    if (w.name == "token_embd.weight") return DType::Q8_0;
    if (w.name == "blk.1.attn_k.weight") return DType::Q5_0;
    if (w.name == "output.weight" || w.name.ends_with("attn_v.weight") || w.name.ends_with("ffn_down.weight"))
      return DType::Q6_K;
    return DType::Q4_K;
  });
  const std::string path = (std::filesystem::temp_directory_path() / "mk_quant_mix.gguf").string();
  test::write_gguf(mixed, path);
  const ModelFile loaded = load_model(path);
  std::filesystem::remove(path);  // the mapping stays valid
  for (auto [name, t] : std::vector<std::pair<std::string, DType>>{{"token_embd.weight", DType::Q8_0},
                                                                   {"blk.1.attn_k.weight", DType::Q5_0},
                                                                   {"blk.0.attn_v.weight", DType::Q6_K},
                                                                   {"blk.0.attn_q.weight", DType::Q4_K},
                                                                   {"blk.0.attn_norm.weight", DType::F32}})
    EXPECT_EQ(loaded.get(name).dtype, t) << name;
  check(f32, loaded, 0.18, "synthetic-256 Q4_K_M mix");
  // The file round trip changes no bit; a GGUF file gets llama.cpp's numerics by default.
  EXPECT_EQ(logits(loaded, "cpu", "on"), logits(mixed, "cpu", "on"));
  EXPECT_EQ(logits(loaded, "cpu"), logits(mixed, "cpu", "on"));
}

namespace mk {
namespace {

// One of ffn_gate / ffn_up block-quantized and the other float32 (a file quantized tensor by
// tensor): the quantized one's activations are quantized, as llama.cpp's (new-user trial 54: the
// fused GLU read float rows for both, so --act-quant on and off gave the same logits). The fuse
// pass keeps such a pair two matmuls; a float-only model is the control (on == off).
TEST(E2EQuant, MixedGateAndUpQuantizeTheBlockWeightsActivations) {
  auto logits = [](const ModelFile& model, const char* act_quant) {  // an f32 KV cache either way
    Graph g = build_graph(model, BuildOptions{64, true});
    BackendOptions o;
    o.threads = 2;
    o.act_quant = act_quant;
    o.kv_type = "f32";
    const std::vector<int32_t> prompt = {1, 103, 107, 261, 78, 32, 45, 300};
    return make_backend("cpu", g, model, o)->forward(prompt, 0);
  };
  const ModelFile m = test::synth_256("mixed-glu", 64);
  EXPECT_EQ(logits(m, "on"), logits(m, "off"));
  for (const std::string q : {".ffn_gate.weight", ".ffn_up.weight"}) {
    const ModelFile mixed = quant::quantize_model(m, [&](const WeightTensor& t) -> std::optional<DType> {
      return t.name.ends_with(q) ? std::optional<DType>(DType::Q8_0) : std::nullopt;
    });
    ASSERT_EQ(mixed.get("blk.0" + q).dtype, DType::Q8_0);
    const std::vector<float> on = logits(mixed, "on"), off = logits(mixed, "off");
    EXPECT_GT(test::rel_l2(on, off), 1e-5) << q;
    EXPECT_LT(test::rel_l2(on, off), 1e-2) << q;
  }
}

}  // namespace
}  // namespace mk
