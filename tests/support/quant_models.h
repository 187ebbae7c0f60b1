// Shared by the quantized-model end-to-end tests (tests/e2e/test_quant_models.cpp, test_cuda_emu.cpp).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/synth.h"

namespace mk::test {

// Logits of an 8-token prompt (8 rows per matmul tile), then three one-token decode steps (the
// one-row path), concatenated. `numerics`: the cpu backend's llama.cpp numerics (--act-quant /
// --kv-type): "auto", "on" (8-bit activations, f16 KV) or "off" (float32, what the device computes).
inline std::vector<float> prompt_then_decode_logits(const ModelFile& m, const std::string& backend, int64_t n_ctx,
                                                    const std::string& numerics = "auto") {
  Graph g = build_graph(m, BuildOptions{n_ctx, false});
  BackendOptions o;
  o.threads = 2;
  o.act_quant = numerics;
  o.kv_type = numerics == "on" ? "f16" : numerics == "off" ? "f32" : "auto";
  auto b = make_backend(backend, g, m, o);
  const int32_t n_vocab = static_cast<int32_t>(m.get("token_embd.weight").shape[0]);
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 45, 300};
  for (auto& t : prompt) t %= n_vocab;
  std::vector<float> all = b->forward(prompt, 0);
  int64_t n_past = static_cast<int64_t>(prompt.size());
  for (int32_t tok : {17, 230, 5}) {
    tok %= n_vocab;
    auto l = b->forward(std::span<const int32_t>(&tok, 1), n_past++);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

// A 256-wide synthetic Llama (GQA, untied): rows of 256 and 512 elements, whole K-quant blocks.
inline ModelFile synth_256(const std::string& name, int64_t n_ctx) {
  SynthSpec s;
  s.name = name;
  s.n_vocab = 320, s.n_embd = 256, s.n_layer = 2, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_ctx = n_ctx;
  return make_synthetic_model(s);
}

}  // namespace mk::test
