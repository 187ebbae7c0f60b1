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
  DType dtype = DType::F32;  // of the matrices (f32, f16, bf16 or a quantized type); norm weights are always float32
  uint64_t seed = 0x5eed;
  bool tied = false;            // no output.weight: the classifier is the token embedding
  double rope_theta = 10000.0;
  // Mixture of experts (a llama GGUF with experts, as Mixtral): each layer's FFN n_expert experts of
  // n_ff rows, n_expert_used per token (ffn_gate_inp, ffn_{gate,up,down}_exps); 0 = dense.
  int64_t n_expert = 0, n_expert_used = 0;
};

// Shapes by name: stories110m (n_embd 768, 12 layers, 12 heads, n_ff 2048, vocab 32000),
// stories15m, stories260k, tiny, micro, and two real shapes in bf16 for the GPU benchmarks:
// llama3.2-1b (n_embd 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64, n_ff 8192, vocab 128256,
// tied; 2.47 GB of bf16 weights) and llama3.1-8b (4096, 32 layers, 32/8 heads, head_dim 128, n_ff
// 14336, vocab 128256, untied; 16.06 GB); mixtures of experts: olmoe-1b-7b (OLMoE-1B-7B's shape read
// as a llama with experts: n_embd 2048, 16 layers, 16 heads, 64 experts of n_ff 1024, 8 used, vocab
// 50304; 13.8 GB of bf16, about 2.4 GB of them read per token) and moe-tiny (n_embd 256, 2 layers,
// 4 experts of 256, 2 used: rows whole blocks of every type). Throws
// mk::Error listing the names for an unknown one.
SynthSpec synthetic_spec(const std::string& name);
std::vector<std::string> synthetic_model_names();
// Weights: matrices uniform with variance 1/n_in, embeddings uniform in [-1, 1], norms 1 +- 0.1.
// Large tensors are filled in parallel from per-chunk streams, so the values do not depend on the
// thread count. with_data = false gives the same tensors (names, dtypes, shapes, sizes) with no data
// (data == nullptr): enough to build the graph and compile the program of a multi-GB model in tests.
ModelFile make_synthetic_model(const SynthSpec& spec, bool with_data = true);
// "synth:stories110m" or "synth:stories110m:bf16"; a ggml block type ("synth:llama3.2-1b:q4_1",
// q4_0 ... q6_K) quantizes the matrices (embedding and classifier included) from the f32 values
// (ggml's reference quantize_row_*, rows in parallel); rows that are not whole blocks of the type
// fall back to q8_0 (else f32), with a note on stderr naming those tensors. "synth:<name>:" (no type)
// and an unknown type throw mk::Error listing the types. with_data = false: shapes only (as above), for commands that only
// compile (`compile`, `info`): the 8B shape then takes milliseconds, not 16 GB.
ModelFile load_synthetic_model(const std::string& path, bool with_data = true);

}  // namespace mk
