// Hugging Face model directories: config.json + model.safetensors (or shards listed in
// model.safetensors.index.json) + optional generation_config.json and tokenizer.json.
//
// load_hf_dir (declared in model_file.h) keeps config.json whole under metadata key `hf.config`,
// generation_config.json under `hf.generation_config`, and sets `general.architecture` to the
// config's `model_type`. Tensors keep their HF names and PyTorch shapes ([n_out, n_in] for
// nn.Linear; GPT-2's Conv1D weights are stored [n_in, n_out]).
//
// The helpers below normalise config fields whose spelling changed across transformers versions,
// so architecture descriptions read one form.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_file.h"

namespace mk {

// Rotary position embedding settings of an HF config.
// Sources, in order: transformers >= 5 `rope_parameters` {rope_theta, rope_type, ...}; older configs
// carry a top-level `rope_theta` and an optional `rope_scaling` {type|rope_type, ...} (null means
// none). `partial_rotary_factor` may sit in either place.
// Supported types: "default" (plain RoPE), "linear" (positions divided by `factor`), "llama3"
// (frequency-dependent scaling, Llama 3.1 paper / transformers `_compute_llama3_parameters`).
// Others (yarn, dynamic, longrope, ...) throw mk::Error naming the type.
struct HfRope {
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;                       // linear, llama3
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  int64_t original_max_position_embeddings = 0;  // llama3
  double partial_rotary_factor = 1.0;        // fraction of head_dim that is rotated
};
HfRope read_hf_rope(const nlohmann::ordered_json& config);
inline HfRope read_hf_rope(const nlohmann::json& config) { return read_hf_rope(nlohmann::ordered_json(config)); }

// The inverse frequencies 1 / theta^(2i/d) for i in [0, rotary_dim/2), with the scaling of `rope`
// applied (linear: divided by factor; llama3: per-band smoothing). rotary_dim must be even.
std::vector<double> hf_rope_inv_freq(const HfRope& rope, int64_t rotary_dim);

// End-of-sequence ids: `eos_token_id` of generation_config.json, else of config.json (an integer
// or a list of integers; null or absent means none). Duplicates removed, order kept.
std::vector<int32_t> read_hf_eos_ids(const ModelFile& model);

// Reads a JSON file; throws mk::Error naming the file when it is missing or not valid JSON.
nlohmann::ordered_json read_json_file(const std::string& path);

}  // namespace mk
