// Gemma 2 (Gemma2ForCausalLM, HF model_type gemma2; GGUF arch gemma2) and Gemma 3 (Gemma3ForCausalLM,
// HF model_type gemma3_text; GGUF arch gemma3): the Gemma layout plus
//  - sliding-window attention on local layers interleaved with global ones (Gemma 2: every other
//    layer, the even ones local; Gemma 3: every Nth layer global, N = sliding_window_pattern, default
//    6, or an explicit per-layer list); Gemma 3 gives each kind its own RoPE base (global: rope_theta
//    with the model's rope scaling; local: rope_local_base_freq, unscaled), Gemma 2 one for both;
//  - RMSNorm of the attention and FFN outputs before each residual add (post_attention_norm,
//    post_ffw_norm), besides the usual pre-norms;
//  - Gemma 2: logit soft-capping, x -> cap * tanh(x / cap), of the attention scores
//    (attn_logit_softcapping, default 50) and of the output logits (final_logit_softcapping,
//    default 30); Gemma 3: RMSNorm over each head of q and k (q_norm, k_norm) before RoPE;
//  - embeddings * sqrt(n_embd), GELU (tanh) gated FFN, tied classifier.
// Sources: transformers modeling_gemma2.py / configuration_gemma2.py (Gemma2Config defaults:
// sliding_window 4096, rope_theta 1e4, query_pre_attn_scalar 256, the soft-caps 50 / 30; layer i
// sliding when (i + 1) % 2), modeling_gemma3.py / configuration_gemma3.py (Gemma3TextConfig
// defaults: sliding_window 4096, sliding_window_pattern 6, rope_theta 1e6, rope_local_base_freq 1e4,
// query_pre_attn_scalar 256); llama.cpp llama-model.cpp LLM_ARCH_GEMMA2 (set_swa_pattern(2), n_swa
// 4096, keys gemma2.attn_logit_softcapping / final_logit_softcapping with llama_hparams' defaults 50
// / 30, f_attention_scale) and LLM_ARCH_GEMMA3 (set_swa_pattern(6), rope_freq_base_train_swa 10000,
// f_attention_scale, keys gemma3.attention.sliding_window[_pattern], gemma3.rope.freq_base_swa). A
// window means: row at position p attends to positions (p - window, p] (transformers'
// sliding_window_overlay, llama.cpp's LLAMA_SWA_TYPE_STANDARD).
#include <cmath>
#include <functional>

#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "model/hf.h"
#include "model/hparams.h"

namespace mk {

namespace {

// llama.cpp's llama_hparams::set_swa_pattern(n): layer il is local unless il % n == n - 1 (n = 0: all local).
std::vector<bool> swa_pattern(int64_t n_layer, int64_t n) {
  std::vector<bool> swa(static_cast<size_t>(n_layer));
  for (int64_t il = 0; il < n_layer; ++il) swa[static_cast<size_t>(il)] = n == 0 || il % n < n - 1;
  return swa;
}

// Sliding layers of an HF config: its layer_types list when present, else every layer il with
// il % pattern < pattern - 1 (transformers: (il + 1) % pattern != 0).
std::vector<bool> hf_swa_layers(const nlohmann::ordered_json& c, int64_t n_layer, int64_t pattern) {
  if (!c.contains("layer_types") || c["layer_types"].is_null()) return swa_pattern(n_layer, pattern);
  const auto& lt = c["layer_types"];
  if (!lt.is_array() || static_cast<int64_t>(lt.size()) != n_layer)
    fail("config.json: layer_types must list one type per layer ({} layers)", n_layer);
  std::vector<bool> swa;
  for (const auto& t : lt) {
    const std::string v = t.is_string() ? t.get<std::string>() : "";
    if (v != "sliding_attention" && v != "full_attention")
      fail("config.json: layer_types entry {} is not sliding_attention or full_attention", clip(t.dump()));
    swa.push_back(v == "sliding_attention");
  }
  return swa;
}

// query_pre_attn_scalar ** -0.5 (default 256), the HF Gemma 2/3 attention scale.
double hf_query_pre_attn_scale(const nlohmann::ordered_json& c) {
  // Absent: the config class's default; null or not a number fails in transformers (None ** -0.5).
  const double qpas = !c.contains("query_pre_attn_scalar")       ? 256.0
                      : c["query_pre_attn_scalar"].is_number() ? c["query_pre_attn_scalar"].get<double>()
                                                               : -1.0;
  if (!(qpas > 0) || !std::isfinite(qpas))
    fail("config.json: query_pre_attn_scalar = {} must be a positive number", clip(c.value("query_pre_attn_scalar", nlohmann::ordered_json(nullptr)).dump()));
  return 1.0 / std::sqrt(qpas);
}

// Gemma 2/3 name their four block norms apart from the Llama layout.
std::function<std::string(const std::string&)> gemma_norm_names(std::function<std::string(const std::string&)> tied_name) {
  return [tied_name = std::move(tied_name)](const std::string& canonical) {
    static const std::pair<const char*, const char*> kNorms[] = {
        {".ffn_norm.", "pre_feedforward_layernorm"},
        {".post_attention_norm.", "post_attention_layernorm"},
        {".post_ffw_norm.", "post_feedforward_layernorm"},
    };
    for (const auto& [part, hf] : kNorms) {
      const size_t at = canonical.find(part);
      if (canonical.rfind("blk.", 0) == 0 && at != std::string::npos)
        return "model.layers." + canonical.substr(4, at - 4) + "." + hf +
               canonical.substr(at + std::string(part).size() - 1);
    }
    return tied_name(canonical);
  };
}

// The Gemma norms (* (1 + w) in HF files), sqrt(n_embd) embedding scale (bf16-rounded in a bf16
// checkpoint, as transformers' normalizer), post-norms.
void hf_gemma_common(DecoderSpec& s, const nlohmann::ordered_json& c) {
  s.norm_weight_offset = 1.0;
  s.embed_scale = true;
  if (hf_bf16_buffers(c)) {
    const float scale = std::sqrt(static_cast<float>(s.hp.n_embd));
    s.embed_scale_value = static_cast<double>(bf16_to_f32(f32_to_bf16(scale)));
  }
  s.post_norms = true;
  s.attn_scale = hf_query_pre_attn_scale(c);
  s.resolve = gemma_norm_names(s.resolve);
}

// A soft-cap of config.json: absent -> `def` (the config class default), null -> 0 (none), else a
// positive number.
double hf_softcap(const nlohmann::ordered_json& c, const char* key, double def) {
  if (!c.contains(key)) return def;
  if (c[key].is_null()) return 0.0;
  const double v = c[key].is_number() ? c[key].get<double>() : -1.0;
  if (!(v > 0) || !std::isfinite(v)) fail("config.json: {} = {} must be a positive number or null", key, clip(c[key].dump()));
  return v;
}

// A soft-cap of a GGUF file: absent -> `def` (llama_hparams' default), 0 -> none, else positive.
double gguf_softcap(const ModelFile& m, const std::string& key, double def) {
  const double v = m.get_float(key, def);
  if (!(v >= 0) || !std::isfinite(v)) fail("{}: {} = {} must be a positive number (or 0: none)", m.path, key, v);
  return v;
}

void refuse_softcapping(const nlohmann::ordered_json& c) {
  for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping"})
    if (c.contains(k) && !c[k].is_null())
      fail("config.json: {} is not supported for gemma3 (only null, the Gemma 3 default)", k);
}

}  // namespace

Graph build_hf_gemma3(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  refuse_softcapping(c);
  if (c.contains("use_bidirectional_attention") && c["use_bidirectional_attention"].is_boolean() &&
      c["use_bidirectional_attention"].get<bool>())
    fail("config.json: use_bidirectional_attention (non-causal Gemma 3) is not supported");

  // RoPE: transformers >= 5 nests {full_attention: {...}, sliding_attention: {...}} in rope_parameters;
  // older configs carry rope_theta (+ rope_scaling) for global layers and rope_local_base_freq for local ones.
  nlohmann::ordered_json global = c, local = nlohmann::ordered_json::object();
  const bool nested =
      c.contains("rope_parameters") && c["rope_parameters"].is_object() &&
      (c["rope_parameters"].contains("full_attention") || c["rope_parameters"].contains("sliding_attention"));
  if (nested) {
    const auto& rp = c["rope_parameters"];
    global = {
        {"rope_parameters", rp.contains("full_attention") ? rp["full_attention"] : nlohmann::ordered_json::object()}};
    if (!global["rope_parameters"].contains("rope_theta")) global["rope_parameters"]["rope_theta"] = 1e6;
    local = {{"rope_parameters",
              rp.contains("sliding_attention") ? rp["sliding_attention"] : nlohmann::ordered_json::object()}};
    if (!local["rope_parameters"].contains("rope_theta")) local["rope_parameters"]["rope_theta"] = 1e4;
    for (auto* part : {&global, &local})
      if (c.contains("partial_rotary_factor")) (*part)["partial_rotary_factor"] = c["partial_rotary_factor"];
  } else {
    if (!c.contains("rope_theta") || c["rope_theta"].is_null()) global["rope_theta"] = 1e6;
    local["rope_theta"] = c.contains("rope_local_base_freq") && !c["rope_local_base_freq"].is_null()
                              ? c["rope_local_base_freq"]
                              : nlohmann::ordered_json(1e4);
    if (c.contains("partial_rotary_factor")) local["partial_rotary_factor"] = c["partial_rotary_factor"];
  }

  DecoderSpec s = hf_llama_spec(m, o, true, /*windowed=*/true, &global);  // Gemma3TextConfig ties embeddings by default
  const HfRope lr = read_hf_rope(local);
  s.rope_theta_swa = lr.theta;
  if (lr.type == "linear")
    s.rope_scaling_swa = {{"scaling", std::string("linear")}, {"factor", lr.factor}};
  else if (lr.type != "default")
    fail("config.json: RoPE type {} for sliding-window layers is not supported", lr.type);
  if (s.rope_scaling.count("freq_dtype")) s.rope_scaling_swa["freq_dtype"] = s.rope_scaling["freq_dtype"];

  s.sliding_window = hf_hparam(c, "sliding_window", {"sliding_window"}, 4096);
  // transformers: layer i is sliding when (i + 1) % sliding_window_pattern != 0 (the same layers as llama.cpp's).
  const int64_t pattern = c.contains("layer_types") && !c["layer_types"].is_null() ? 6 : hf_config_int(c, {"sliding_window_pattern"}, 6);
  if (pattern < 1 || pattern > s.hp.n_layer + 1)
    fail("config.json: sliding_window_pattern = {} must be in [1, n_layer + 1]", pattern);
  s.swa_layers = hf_swa_layers(c, s.hp.n_layer, pattern);

  hf_gemma_common(s, c);  // Gemma3RMSNorm: * (1 + w), q_norm and k_norm included
  s.qk_norm = true;
  return build_decoder(m, s);
}

Graph build_hf_gemma2(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  DecoderSpec s = hf_llama_spec(m, o, true, /*windowed=*/true);  // Gemma2Config ties embeddings by default
  s.sliding_window = hf_hparam(c, "sliding_window", {"sliding_window"}, 4096);
  s.swa_layers = hf_swa_layers(c, s.hp.n_layer, 2);
  s.rope_theta_swa = s.rope_theta;  // one RoPE for both kinds of layer
  s.rope_scaling_swa = s.rope_scaling;
  hf_gemma_common(s, c);
  s.attn_softcap = hf_softcap(c, "attn_logit_softcapping", 50.0);
  s.final_softcap = hf_softcap(c, "final_logit_softcapping", 30.0);
  return build_decoder(m, s);
}

// GGUF "gemma2": as "gemma" (norm weights stored as 1 + w, NEOX RoPE) plus the post-norms, every
// even layer local with gemma2.attention.sliding_window (default 4096; 0: none), the soft-caps
// gemma2.attn_logit_softcapping (default 50) and gemma2.final_logit_softcapping (default 30; 0:
// none), the attention scale 1/sqrt(head_dim), except 1/sqrt(n_embd / n_head) for the 46-layer (27B)
// model, as llama.cpp.
Graph build_gguf_gemma2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  const std::string a = s.hp.arch + ".";
  s.embed_scale = true;
  s.ffn_act = "gelu_tanh";
  s.post_norms = true;
  s.attn_scale = 1.0 / std::sqrt(static_cast<double>(s.hp.n_layer == 46 ? s.hp.n_embd / s.hp.n_head : s.hp.head_dim));
  gguf_require_per_layer(m, s, {"post_attention_norm.weight", "post_ffw_norm.weight"});
  const int64_t window = m.get_int(a + "attention.sliding_window", 4096);
  if (window > 0) {
    s.sliding_window = checked_hparam("sliding_window", window, m.path + ": " + a + "attention.sliding_window");
    s.swa_layers = swa_pattern(s.hp.n_layer, 2);
    s.rope_theta_swa = s.rope_theta;
    s.rope_scaling_swa = s.rope_scaling;
  } else if (window < 0) {
    fail("{}: {}attention.sliding_window = {} must not be negative", m.path, a, window);
  }
  s.attn_softcap = gguf_softcap(m, a + "attn_logit_softcapping", 50.0);
  s.final_softcap = gguf_softcap(m, a + "final_logit_softcapping", 30.0);
  return build_decoder(m, s);
}

// GGUF "gemma3": llama.cpp's converter stores every norm weight as 1 + w (plain RMSNorm here);
// NEOX RoPE; gemma3.attention.sliding_window (absent or 0: no local layers), the pattern from
// gemma3.attention.sliding_window_pattern (a period, or one bool per layer; default 6), local RoPE
// base gemma3.rope.freq_base_swa (default 10000) without the file's rope scaling; the attention
// scale 1/sqrt(head_dim), except 1/sqrt(n_embd / n_head) for the 62-layer (27B) model, as llama.cpp.
Graph build_gguf_gemma3(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  const std::string a = s.hp.arch + ".";
  s.embed_scale = true;
  s.ffn_act = "gelu_tanh";
  s.qk_norm = true;
  s.post_norms = true;
  s.attn_scale = 1.0 / std::sqrt(static_cast<double>(s.hp.n_layer == 62 ? s.hp.n_embd / s.hp.n_head : s.hp.head_dim));
  gguf_require_per_layer(
      m, s, {"attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight"});
  const int64_t window = m.get_int(a + "attention.sliding_window", 0);
  if (window > 0) {
    s.sliding_window = checked_hparam("sliding_window", window, m.path + ": " + a + "attention.sliding_window");
    const std::string pk = a + "attention.sliding_window_pattern";
    if (m.has(pk) && m.metadata.at(pk).is_array()) {
      const auto& arr = m.metadata.at(pk);
      if (static_cast<int64_t>(arr.size()) != s.hp.n_layer)
        fail("{}: {} lists {} layers, the model has {}", m.path, pk, arr.size(), s.hp.n_layer);
      for (const auto& v : arr) {
        if (!v.is_boolean() && !v.is_number_integer()) fail("{}: {} entries must be booleans", m.path, pk);
        s.swa_layers.push_back(v.is_boolean() ? v.get<bool>() : v.get<int64_t>() != 0);
      }
    } else {
      const int64_t n = m.get_int(pk, 6);
      if (n < 0 || n > s.hp.n_layer + 1) fail("{}: {} = {} must be in [0, n_layer + 1]", m.path, pk, n);
      s.swa_layers = swa_pattern(s.hp.n_layer, n);
    }
    s.rope_theta_swa = m.get_float(a + "rope.freq_base_swa", 10000.0);
    s.rope_scaling_swa = {};  // llama.cpp: rope_freq_scale_train_swa = 1
  }
  return build_decoder(m, s);
}

}  // namespace mk
