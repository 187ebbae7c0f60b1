#include "archs/hf_common.h"

#include "model/hf.h"
#include "model/hparams.h"
#include "support/json.h"
#include "support/error.h"

namespace mk {

namespace {

double config_float(const nlohmann::ordered_json& c, std::initializer_list<const char*> keys, double def) {
  for (const char* k : keys) {
    if (!c.contains(k) || c[k].is_null()) continue;
    if (!c[k].is_number()) fail("config.json: {} is not a number", k);
    return c[k].get<double>();
  }
  return def;
}

// The attention window, or 0 when attention is not windowed.
int64_t sliding_window(const nlohmann::ordered_json& c) {
  if (c.contains("use_sliding_window") && c["use_sliding_window"].is_boolean() && !c["use_sliding_window"].get<bool>())
    return 0;
  return hf_hparam(c, "sliding_window", {"sliding_window"}, 0);
}

}  // namespace

const nlohmann::ordered_json& hf_config(const ModelFile& m) {
  if (!m.metadata.contains("hf.config") || !m.metadata["hf.config"].is_object())
    fail("{}: not a Hugging Face model (no config.json)", m.path);
  return m.metadata["hf.config"];
}

Hparams read_hf_hparams(const ModelFile& m) {
  const auto& c = hf_config(m);
  Hparams hp;
  hp.arch = m.get_str("general.architecture");
  // Each value is range-checked as it is read (model/hparams.h), before any arithmetic uses it.
  hp.n_vocab = hf_hparam(c, "n_vocab", {"vocab_size"});
  hp.n_embd = hf_hparam(c, "n_embd", {"hidden_size", "n_embd"});
  hp.n_layer = hf_hparam(c, "n_layer", {"num_hidden_layers", "n_layer"});
  hp.n_head = hf_hparam(c, "n_head", {"num_attention_heads", "n_head"});
  hp.n_head_kv = hf_hparam(c, "n_head_kv", {"num_key_value_heads"}, hp.n_head);
  // Without head_dim, it is hidden_size / num_attention_heads (transformers), which must divide.
  if ((!c.contains("head_dim") || c["head_dim"].is_null()) && hp.n_embd % hp.n_head != 0)
    fail("config.json: {} = {} is not a multiple of {} = {} (head_dim = n_embd / n_head, as config.json has no "
         "head_dim)",
         c.contains("hidden_size") ? "hidden_size" : "n_embd", hp.n_embd,
         c.contains("num_attention_heads") ? "num_attention_heads" : "n_head", hp.n_head);
  hp.head_dim = hf_hparam(c, "head_dim", {"head_dim"}, hp.n_embd / hp.n_head);
  hp.n_ff = hf_hparam(c, "n_ff", {"intermediate_size", "n_inner"}, 4 * hp.n_embd);
  hp.n_ctx_train = hf_hparam(c, "n_ctx", {"max_position_embeddings", "n_positions"}, 2048);
  if (int64_t w = sliding_window(c); w > 0 && w < hp.n_ctx_train && !hf_windowed_family(hp.arch)) hp.n_ctx_train = w;
  hp.norm_eps = config_float(c, {"rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"}, 1e-5);
  return hp;
}

std::string hf_llama_tensor_name(const std::string& canonical, bool tied) {
  if (canonical == "token_embd.weight") return "model.embed_tokens.weight";
  if (canonical == "output_norm.weight") return "model.norm.weight";
  if (canonical == "output.weight") return tied ? "" : "lm_head.weight";
  // blk.<il>.<part>.<weight|bias>
  if (canonical.rfind("blk.", 0) != 0) return "";
  const size_t dot1 = canonical.find('.', 4), dot2 = canonical.rfind('.');
  if (dot1 == std::string::npos || dot2 <= dot1) return "";
  const std::string il = canonical.substr(4, dot1 - 4), part = canonical.substr(dot1 + 1, dot2 - dot1 - 1),
                    suffix = canonical.substr(dot2);
  static const std::pair<const char*, const char*> kParts[] = {
      {"attn_norm", "input_layernorm"},     {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},       {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},       {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (const auto& [from, to] : kParts)
    if (part == from) return "model.layers." + il + "." + to + suffix;
  return "";
}

std::string hf_activation(const nlohmann::ordered_json& c) {
  std::string act = "silu";
  for (const char* k : {"hidden_activation", "hidden_act", "activation_function"})
    if (c.contains(k) && c[k].is_string()) {
      act = c[k].get<std::string>();
      break;
    }
  if (act == "silu" || act == "swish") return "silu";
  if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast") return "gelu_tanh";
  if (act == "gelu") return "gelu";
  fail("config.json: unsupported activation {} (supported: silu, gelu, gelu_pytorch_tanh, gelu_new)", clip(act));
}

bool hf_bf16_buffers(const nlohmann::ordered_json& c) {
  for (const char* key : {"dtype", "torch_dtype"})
    if (c.contains(key) && c[key].is_string()) return c[key].get<std::string>() == "bfloat16";
  return false;
}

bool hf_windowed_family(const std::string& arch) { return arch == "gemma2" || arch == "gemma3_text"; }

DecoderSpec hf_llama_spec(const ModelFile& m, const BuildOptions& o, bool tied_default, bool windowed,
                          const nlohmann::ordered_json* rope_config) {
  const auto& c = hf_config(m);
  DecoderSpec s;
  s.hp = read_hf_hparams(m);
  s.n_ctx = o.n_ctx > 0 ? o.n_ctx : s.hp.n_ctx_train;
  if (int64_t w = sliding_window(c); !windowed && w > 0 && s.n_ctx > w)
    fail("{}: context of {} tokens exceeds the sliding attention window of {} (windowed attention is not supported)",
         m.path, s.n_ctx, w);
  s.all_logits = o.all_logits;
  s.kv_pool_tokens = o.kv_pool_tokens;
  s.kv_block_size = o.kv_block_size;
  s.ffn_act = hf_activation(c);

  const HfRope rope = read_hf_rope(rope_config ? *rope_config : c);
  s.rope_mode = "halves";
  s.rope_theta = rope.theta;
  const double rot = static_cast<double>(s.hp.head_dim) * rope.partial_rotary_factor;
  s.n_rot = static_cast<int64_t>(rot);
  if (static_cast<double>(s.n_rot) != rot || s.n_rot % 2 != 0 || s.n_rot <= 0 || s.n_rot > s.hp.head_dim)
    fail("config.json: partial_rotary_factor {} gives {} rotated dimensions of head_dim {}", rope.partial_rotary_factor,
         rot, s.hp.head_dim);
  if (rope.type == "linear") {
    s.rope_scaling = {{"scaling", std::string("linear")}, {"factor", rope.factor}};
  } else if (rope.type == "llama3") {
    s.rope_scaling = {{"scaling", std::string("llama3")},
                      {"factor", rope.factor},
                      {"low_freq_factor", rope.low_freq_factor},
                      {"high_freq_factor", rope.high_freq_factor},
                      {"original_max_pos", rope.original_max_position_embeddings}};
  } else if (rope.type == "longrope") {
    // As llama.cpp (llama_model::get_rope_factors): the long factors when the context exceeds the
    // original one, else the short ones, for every position (transformers picks per forward call by
    // the sequence length; the two agree whenever the context is within the original one).
    if (static_cast<int64_t>(rope.short_factor.size()) * 2 != s.n_rot)
      fail("config.json: longrope has {} factors for {} rotated dimensions (one per pair)", rope.short_factor.size(),
           s.n_rot);
    const bool long_ctx = s.n_ctx > rope.original_max_position_embeddings;
    s.rope_scaling = {{"freq_factors", rope_freq_factors(long_ctx ? rope.long_factor : rope.short_factor)}};
    s.rope_attn_factor = rope.attention_factor;
  }

  if (hf_bf16_buffers(c)) s.rope_scaling["freq_dtype"] = std::string("bf16");

  const bool tied = c.contains("tie_word_embeddings") && c["tie_word_embeddings"].is_boolean()
                        ? c["tie_word_embeddings"].get<bool>()
                        : tied_default;
  if (!tied && !m.find("lm_head.weight"))
    fail("{}: missing tensor lm_head.weight (tie_word_embeddings is false)", m.path);
  s.resolve = [tied](const std::string& canonical) { return hf_llama_tensor_name(canonical, tied); };
  return s;
}

}  // namespace mk
