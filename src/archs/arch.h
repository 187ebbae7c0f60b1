// Architecture descriptions: one file per model family builds the Graph from a ModelFile's
// hyperparameters and named weights (shape-checked). No per-family kernels: families differ only here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "model/model_file.h"

namespace mk {

struct BuildOptions {
  int64_t n_ctx = 0;        // positions per sequence; 0 = the model's context length
  bool all_logits = false;  // logits for every row, else only the rows a step asks for (the last one)
  // An embedding graph: output "embd", the output norm's rows [n_tokens, n_embd] (every row), no
  // classifier, no logits (runtime/embed.h pools them).
  bool embeddings = false;
  // Paged KV cache (backend/step_batch.h): rows in the pool shared by all sequences (0 = n_ctx,
  // enough for one full-length sequence) and rows per block (0 = 16).
  int64_t kv_pool_tokens = 0;
  int64_t kv_block_size = 0;
};

// Hyperparameters every decoder family shares (glossary terms).
struct Hparams {
  std::string arch;  // "llama", "gpt2", ...
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  int64_t n_ctx_train = 0;
  double norm_eps = 1e-5;
};

// Reads hyperparameters for the model's architecture; throws mk::Error for unknown ones, listing
// the supported architectures.
Hparams read_hparams(const ModelFile& model);
Graph build_graph(const ModelFile& model, const BuildOptions& options);
std::vector<std::string> supported_architectures();

}  // namespace mk
