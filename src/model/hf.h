// Hugging Face model directories: config.json + model.safetensors (or shards listed in
// model.safetensors.index.json) + optional generation_config.json and tokenizer.json.
//
// load_hf_dir (declared in model_file.h) keeps config.json whole under metadata key `hf.config`,
// generation_config.json under `hf.generation_config`, and sets `general.architecture` to the
// config's `model_type`. Tensors keep their HF names and PyTorch shapes ([n_out, n_in] for
// nn.Linear; GPT-2's Conv1D weights are stored [n_in, n_out]).
//
// Some checkpoints store projections in other layouts; load_hf_dir then adds per-projection
// tensors in the [n_out, n_in] layout, under Llama-like names, and lists them in metadata
// `hf.derived_tensors`:
//  - phi3: q_proj/k_proj/v_proj of self_attn.qkv_proj and gate_proj/up_proj of mlp.gate_up_proj
//    (row views sharing the mapped data);
//  - gemma3 (multimodal Gemma3ForConditionalGeneration): read as gemma3_text, `hf.config` set to its
//    text_config completed with Gemma3TextConfig's defaults (the original kept as
//    `hf.config_multimodal`), the language model's tensors aliased under model.* (vision ignored);
//  - gpt2: Conv1D weights [n_in, n_out] transposed (copies in ModelFile::owned): attn.{q,k,v}_proj
//    (split from attn.c_attn, with bias views), attn.o_proj, mlp.up_proj, mlp.down_proj.
//
// The helpers below normalise config fields whose spelling changed across transformers versions,
// so architecture descriptions read one form.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/model_file.h"
#include "support/json.h"  // read_json_file

namespace mk {

// Rotary position embedding settings of an HF config.
// Sources, in order: transformers >= 5 `rope_parameters` {rope_theta, rope_type, ...}; older configs
// carry a top-level `rope_theta` and an optional `rope_scaling` {type|rope_type, ...} (null means
// none). `partial_rotary_factor` may sit in either place.
// Supported types: "default" (plain RoPE), "linear" (positions divided by `factor`), "llama3"
// (frequency-dependent scaling, Llama 3.1 paper / transformers `_compute_llama3_parameters`; the
// frequencies themselves are computed by the IR's rope op, ir/ops.cpp rope_inv_freq).
// "longrope" (Phi-3: per-pair `short_factor` / `long_factor` lists dividing the frequencies, the
// long ones for contexts beyond `original_max_position_embeddings` (in the parameters or the
// config's top level), and `attention_factor`, default sqrt(1 + ln(s) / ln(original)) for
// s = max_position_embeddings / original > 1, else 1; transformers `_compute_longrope_parameters`).
// Others (yarn, dynamic, ...) throw mk::Error naming the type.
struct HfRope {
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;                       // linear, llama3
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, longrope
  std::vector<double> short_factor, long_factor;  // longrope, one per rotated pair
  double attention_factor = 1.0;                  // longrope: multiplies the rotated values
  double partial_rotary_factor = 1.0;        // fraction of head_dim that is rotated
};
HfRope read_hf_rope(const nlohmann::ordered_json& config);
inline HfRope read_hf_rope(const nlohmann::json& config) { return read_hf_rope(nlohmann::ordered_json(config)); }

// End-of-sequence ids: `eos_token_id` of generation_config.json, else of config.json (an integer
// or a list of integers; null or absent means none). Duplicates removed, order kept.
std::vector<int32_t> read_hf_eos_ids(const ModelFile& model);

// Runs f; an mk::Error about a config.json field ("config.json: missing num_attention_heads", as
// hf_config_int and the architectures word them) is rethrown naming the file in directory `dir`
// ("<dir>/config.json: missing ..."); other errors pass through.
template <class F>
auto naming_hf_config(const std::string& dir, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("config.json: ", 0) != 0) throw;
    throw Error(dir + (!dir.empty() && dir.back() == '/' ? "" : "/") + what);
  }
}

// Integer config field: the first of `keys` present and not null, else `def`; throws mk::Error
// "config.json: missing <first key>" when there is no default, or when the value is not an integer.
int64_t hf_config_int(const nlohmann::ordered_json& config, std::initializer_list<const char*> keys,
                      std::optional<int64_t> def = std::nullopt);
// A hyperparameter (glossary `term`, see model/hparams.h) read as hf_config_int does, then checked
// against the term's range: mk::Error "config.json: head_dim = ... is outside [1, 4096] (head_dim)".
int64_t hf_hparam(const nlohmann::ordered_json& config, std::string_view term, std::initializer_list<const char*> keys,
                  std::optional<int64_t> def = std::nullopt);

}  // namespace mk
