// Synthetic models: random float32 (or f16/bf16) weights in a real model's shape, from a fixed seed,
// built in memory with GGUF names and llama metadata. For benchmarks and tests at sizes no fixture
// covers. Selected by path: "synth:<name>[:<dtype>]", e.g. "synth:stories110m", "synth:tiny:bf16".
#pragma once
#include <string>
#include <vector>

#include "model/model_file.h"

namespace mk {

struct SynthSpec {
  std::string name;
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_ctx = 0;
  DType dtype = DType::F32;  // of the matrices; norm weights are always float32
  uint64_t seed = 0x5eed;
};

// Shapes by name: stories110m (n_embd 768, 12 layers, 12 heads, n_ff 2048, vocab 32000),
// stories15m, stories260k, tiny. Throws mk::Error listing the names for an unknown one.
SynthSpec synthetic_spec(const std::string& name);
std::vector<std::string> synthetic_model_names();
// Weights: matrices uniform with variance 1/n_in, embeddings uniform in [-1, 1], norms 1 +- 0.1.
ModelFile make_synthetic_model(const SynthSpec& spec);
// "synth:stories110m" or "synth:stories110m:bf16".
ModelFile load_synthetic_model(const std::string& path);

}  // namespace mk
