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

// The sliding-window layers of the Llama-like families as transformers builds them (0 / empty: none):
// MistralConfig and Phi3Config window every layer when sliding_window is set; Qwen2Config and
// Qwen3Config only with use_sliding_window (default false), and then the layers from
// max_window_layers (default 28) on; a layer_types list, where given, names the sliding layers.
// LlamaConfig has no window (a sliding_window key there is ignored, as transformers ignores it).
void hf_sliding_layers(const nlohmann::ordered_json& c, const std::string& arch, int64_t n_layer, DecoderSpec& s) {
  const bool qwen = arch == "qwen2" || arch == "qwen3" || arch == "qwen3_moe";
  if (arch != "mistral" && arch != "mixtral" && arch != "phi3" && arch != "starcoder2" && !qwen) return;
  if (qwen && !config_bool(c, "use_sliding_window", false)) return;
  const int64_t w = hf_hparam(c, "sliding_window", {"sliding_window"}, 0);
  if (w <= 0) return;
  std::vector<bool> layers(static_cast<size_t>(n_layer), true);
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {
    const auto& lt = c["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != n_layer)
      fail("config.json: layer_types must list one type per layer ({} layers)", n_layer);
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string v = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (v != "sliding_attention" && v != "full_attention")
        fail("config.json: layer_types entry {} is not sliding_attention or full_attention", clip(lt[i].dump()));
      layers[i] = v == "sliding_attention";
    }
  } else if (qwen) {
    const int64_t from = hf_config_int(c, {"max_window_layers"}, 28);
    for (int64_t i = 0; i < n_layer; ++i) layers[static_cast<size_t>(i)] = i >= from;
  }
  s.sliding_window = w;
  s.swa_layers = std::move(layers);
  s.rope_theta_swa = s.rope_theta;  // one RoPE for both kinds
  s.rope_scaling_swa = s.rope_scaling;
}

}  // namespace

bool config_bool(const nlohmann::ordered_json& c, const char* key, bool def) {
  if (!c.contains(key) || c[key].is_null()) return def;
  if (!c[key].is_boolean()) fail("config.json: {} must be true or false, got {}", key, clip(c[key].dump()));
  return c[key].get<bool>();
}

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
      // mixture of experts (Qwen3-MoE names; the per-expert tensors stacked by the loader, model/hf.h)
      {"ffn_gate_inp", "mlp.gate"},         {"ffn_gate_exps", "mlp.experts.gate_proj"},
      {"ffn_up_exps", "mlp.experts.up_proj"}, {"ffn_down_exps", "mlp.experts.down_proj"},
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
  fail("config.json: unsupported activation {} (supported: silu, swish, gelu, gelu_pytorch_tanh, gelu_new, gelu_fast)",
       clip(act));
}

bool hf_bf16_buffers(const nlohmann::ordered_json& c) {
  for (const char* key : {"dtype", "torch_dtype"})
    if (c.contains(key) && c[key].is_string()) return c[key].get<std::string>() == "bfloat16";
  return false;
}

DecoderSpec hf_llama_spec(const ModelFile& m, const BuildOptions& o, bool tied_default, bool windowed,
                          const nlohmann::ordered_json* rope_config) {
  const auto& c = hf_config(m);
  DecoderSpec s;
  s.hp = read_hf_hparams(m);
  s.n_ctx = o.n_ctx > 0 ? o.n_ctx : s.hp.n_ctx_train;
  s.all_logits = o.all_logits;
  s.embeddings = o.embeddings;
  s.kv_pool_tokens = o.kv_pool_tokens;
  s.kv_block_size = o.kv_block_size;
  s.ffn_act = hf_activation(c);

  const HfRope rope = read_hf_rope(rope_config ? *rope_config : c);
  s.rope_mode = "halves";
  s.rope_theta = rope.theta;
  const double rot = static_cast<double>(s.hp.head_dim) * rope.partial_rotary_factor;
  s.n_rot = static_cast<int64_t>(rot);
  if (static_cast<double>(s.n_rot) != rot || s.n_rot % 2 != 0 || s.n_rot <= 0 || s.n_rot > s.hp.head_dim) {
    if (rope.partial_rotary_factor == 1.0)  // every dimension rotates: head_dim itself is wrong
      fail("config.json: head_dim {} (hidden_size / num_attention_heads, or head_dim) must be even: RoPE rotates pairs of dimensions",
           s.hp.head_dim);
    fail("config.json: partial_rotary_factor {} gives {} rotated dimensions of head_dim {}", rope.partial_rotary_factor,
         rot, s.hp.head_dim);
  }
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

  const bool tied = config_bool(c, "tie_word_embeddings", tied_default);
  if (!windowed) hf_sliding_layers(c, s.hp.arch, s.hp.n_layer, s);
  if (!tied && !m.find("lm_head.weight"))
    fail("{}: missing tensor lm_head.weight (tie_word_embeddings is false)", m.path);
  // Biases as the config builds the layers (transformers leaves a tensor the model has no place for
  // unused): q/k/v always for Qwen2; attention_bias (q/k/v/o) and mlp_bias (gate/up/down) for the
  // configs that have them (Llama; Qwen3 and Gemma: attention_bias); none for Mistral and Phi-3.
  const std::string& arch = s.hp.arch;
  const bool has_attn_bias_key =
      arch == "llama" || arch == "smollm3" || arch == "granite" || arch == "olmo2" || arch == "olmoe" || arch == "qwen3" || arch == "qwen3_moe" ||
      arch.starts_with("gemma");
  const bool attn_bias = has_attn_bias_key && config_bool(c, "attention_bias", false);
  const bool mlp_bias = (arch == "llama" || arch == "smollm3" || arch == "granite") && config_bool(c, "mlp_bias", false);
  const bool qkv_bias = arch == "qwen2" || attn_bias || (arch == "stablelm" && config_bool(c, "use_qkv_bias", false));
  s.resolve = [tied, attn_bias, mlp_bias, qkv_bias](const std::string& canonical) -> std::string {
    if (canonical.ends_with(".bias")) {
      const bool qkv = canonical.ends_with(".attn_q.bias") || canonical.ends_with(".attn_k.bias") ||
                       canonical.ends_with(".attn_v.bias");
      const bool ffn = canonical.ends_with(".ffn_gate.bias") || canonical.ends_with(".ffn_up.bias") ||
                       canonical.ends_with(".ffn_down.bias");
      if (qkv ? !qkv_bias : canonical.ends_with(".attn_output.bias") ? !attn_bias : ffn ? !mlp_bias : false) return "";
    }
    return hf_llama_tensor_name(canonical, tied);
  };
  // A bias the config builds a layer with must be in the file (transformers would refuse the
  // checkpoint): left out, the model would run without it and answer wrongly.
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const auto& [on, key, parts] : {std::tuple{attn_bias, "attention_bias", std::vector<const char*>{"attn_q", "attn_k", "attn_v", "attn_output"}},
                                         std::tuple{mlp_bias, "mlp_bias", std::vector<const char*>{"ffn_gate", "ffn_up", "ffn_down"}}}) {
      if (!on) continue;
      for (const char* part : parts)
        if (const std::string name = s.resolve(fmt::format("blk.{}.{}.bias", il, part)); !name.empty() && !m.find(name))
          fail("{}: config.json sets {} true, but tensor {} is missing", m.path, key, name);
    }
  return s;
}

void hf_moe(const ModelFile& m, DecoderSpec& s, HfMoe kind) {
  const bool mixtral = kind == HfMoe::mixtral;
  const auto& c = hf_config(m);
  // Qwen2-MoE's shared expert (and its sigmoid gate) would be left out: refused, not ignored.
  for (const WeightTensor& t : m.tensors())
    if (t.name.find(".shared_expert") != std::string::npos)
      fail("{}: {}: shared experts are not supported", m.path, clip(t.name));
  s.n_expert = hf_hparam(c, "n_expert", {mixtral ? "num_local_experts" : "num_experts"});
  s.n_expert_used = hf_hparam(c, "n_expert_used", {"num_experts_per_tok"});
  if (s.n_expert_used > s.n_expert)
    fail("config.json: num_experts_per_tok {} exceeds {} {}", s.n_expert_used, mixtral ? "num_local_experts" : "num_experts", s.n_expert);
  s.n_ff_exp = kind == HfMoe::qwen3 ? hf_hparam(c, "n_ff", {"moe_intermediate_size"}) : s.hp.n_ff;
  s.moe_norm = mixtral || config_bool(c, "norm_topk_prob", false);
  if (kind == HfMoe::olmoe) return;
  if (!mixtral) {
    if (const int64_t step = hf_config_int(c, {"decoder_sparse_step"}, 1); step != 1)
      fail("config.json: decoder_sparse_step {}: dense layers between the expert layers are not supported (only 1)", step);
    if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null() &&
        !(c["mlp_only_layers"].is_array() && c["mlp_only_layers"].empty()))
      fail("config.json: mlp_only_layers {}: dense layers among the expert layers are not supported", clip(c["mlp_only_layers"].dump()));
    return;
  }
  s.resolve = [inner = s.resolve](const std::string& canonical) -> std::string {
    static const std::pair<const char*, const char*> kMoe[] = {{".ffn_gate_inp.", "block_sparse_moe.gate"},
                                                               {".ffn_gate_exps.", "block_sparse_moe.experts.w1"},
                                                               {".ffn_up_exps.", "block_sparse_moe.experts.w3"},
                                                               {".ffn_down_exps.", "block_sparse_moe.experts.w2"}};
    for (const auto& [part, name] : kMoe)
      if (const size_t at = canonical.find(part); at != std::string::npos && canonical.rfind("blk.", 0) == 0)
        return "model.layers." + canonical.substr(4, at - 4) + "." + name + canonical.substr(at + std::string(part).size() - 1);
    return inner(canonical);
  };
}

}  // namespace mk
