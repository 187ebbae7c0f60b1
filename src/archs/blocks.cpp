#include "archs/blocks.h"

#include <algorithm>
#include <cmath>

#include "model/hparams.h"
#include "ir/topk.h"
#include "support/error.h"
#include "support/printable.h"

namespace mk {

namespace {

// The layer index of a file's tensor name under the family's layer prefix (GGUF "blk.", HF
// "model.layers.", GPT-2 "transformer.h."): the number in "<prefix>N."; -1 for other names.
int64_t tensor_layer_index(const std::string& name, const std::string& prefix) {
  if (prefix.empty() || name.rfind(prefix, 0) != 0) return -1;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 9 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  return std::stoll(name.substr(i, j - i));
}

// Where n_layer came from, for errors: the GGUF key or the config.json key.
std::string layer_count_source(const ModelFile& m, const Hparams& hp) {
  if (m.format == "hf") {
    const auto& c = m.metadata.contains("hf.config") ? m.metadata["hf.config"] : nlohmann::ordered_json::object();
    return c.contains("n_layer") && !c.contains("num_hidden_layers") ? "config.json n_layer"
                                                                      : "config.json num_hidden_layers";
  }
  if (m.format == "llama2c") return "the llama2.c header's n_layers";
  return hp.arch + ".block_count";
}

class DecoderBuilder {
 public:
  DecoderBuilder(const ModelFile& m, const DecoderSpec& s) : m_(m), s_(s), hp_(s.hp) {}

  // Adds a weight node, shape-checked; returns -1 when optional and absent.
  int weight(const std::string& canonical, std::vector<int64_t> shape, bool required = true) {
    std::string file_name = s_.resolve ? s_.resolve(canonical) : canonical;
    const WeightTensor* t = file_name.empty() ? nullptr : m_.find(file_name);
    if (!t) {
      if (required) fail("{}: missing tensor {}", m_.path, file_name.empty() ? canonical : file_name);
      return -1;
    }
    if (t->shape != shape) fail_tensor_shape(m_.path, *t, shape);
    if (t->dtype == DType::I32) fail("{}: integer tensors cannot be weights", t->name);
    return g_.add_weight(t->name, t->dtype, shape);
  }

  int norm(int x, const std::string& prefix, int64_t width, const std::string& name) {
    int w = weight(prefix + ".weight", {width});
    if (s_.norm == DecoderSpec::Norm::rms)
      return g_.add(Op::rms_norm, {x, w}, {{"eps", hp_.norm_eps}, {"weight_offset", s_.norm_weight_offset}}, name);
    int b = weight(prefix + ".bias", {width}, false);
    std::vector<int> in = {x, w};
    if (b >= 0) in.push_back(b);
    return g_.add(Op::layer_norm, in, {{"eps", hp_.norm_eps}}, name);
  }

  int linear(int x, const std::string& prefix, int64_t n_out, int64_t n_in, const std::string& name) {
    int w = weight(prefix + ".weight", {n_out, n_in});
    int y = g_.add(Op::matmul, {x, w}, {}, name);
    int b = weight(prefix + ".bias", {n_out}, false);
    if (b >= 0) y = g_.add(Op::add, {y, b}, {}, name + "_b");
    return y;
  }

  bool swa(int il) const {
    const auto i = static_cast<size_t>(il);
    return s_.sliding_window > 0 && i < s_.swa_layers.size() && s_.swa_layers[i];
  }

  int rope(int x, int pos, int il, const std::string& name) {
    Attrs a = swa(il) ? s_.rope_scaling_swa : s_.rope_scaling;
    a["head_dim"] = hp_.head_dim;
    a["n_rot"] = s_.n_rot == 0 ? hp_.head_dim : s_.n_rot;
    a["theta"] = swa(il) ? s_.rope_theta_swa : s_.rope_theta;
    a["mode"] = s_.rope_mode;
    return g_.add(Op::rope, {x, pos}, a, name);
  }

  Op ffn_act() const {
    return s_.ffn_act == "silu" ? Op::silu : s_.ffn_act == "gelu" ? Op::gelu : s_.ffn_act == "gelu_tanh" ? Op::gelu_tanh
                                                                                                     : (fail("unknown activation {}", s_.ffn_act), Op::silu);
  }

  int ffn(int h, const std::string& b) {
    const int64_t n_embd = hp_.n_embd;
    int up = linear(h, b + ".ffn_up", hp_.n_ff, n_embd, b + ".ffn_up");
    int act_in = up;
    if (s_.ffn_gated) act_in = linear(h, b + ".ffn_gate", hp_.n_ff, n_embd, b + ".ffn_gate");
    int m = g_.add(ffn_act(), {act_in}, {}, b + ".ffn_act");
    if (s_.ffn_gated) m = g_.add(Op::mul, {m, up}, {}, b + ".ffn_gated");
    return linear(m, b + ".ffn_down", n_embd, hp_.n_ff, b + ".ffn_down");
  }

  // DecoderSpec::n_expert: router, the selected experts' gated FFNs side by side ([rows, k n_ff_exp]),
  // then their weighted sum (ir/ops.def moe_route, moe_matmul).
  int moe_ffn(int h, const std::string& b) {
    const int64_t n_embd = hp_.n_embd, E = s_.n_expert, F = s_.n_ff_exp;
    if (!s_.ffn_gated) fail("{}: mixture of experts without a gated FFN is not supported", m_.path);
    // Layouts this builder would otherwise misread or half-read: refused by name.
    auto in_file = [&](const std::string& canonical) {
      const std::string f = s_.resolve ? s_.resolve(canonical) : canonical;
      return f.empty() ? std::string() : m_.find(f) ? f : std::string();
    };
    if (m_.find(b + ".ffn_gate.0.weight") && in_file(b + ".ffn_gate_exps.weight").empty())
      fail("{}: {}.ffn_gate.0.weight: one tensor per expert (an old Mixtral GGUF layout) is not supported; convert the "
           "model again with a current llama.cpp (it stacks them as ffn_gate_exps)", m_.path, b);
    if (in_file(b + ".ffn_gate_inp.weight").empty())
      if (const std::string f = in_file(b + ".ffn_gate.weight"); !f.empty())
        fail("{}: {}: a dense feed-forward among the expert layers is not supported", m_.path, f);
    for (const char* part : {"ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"})
      if (m_.find(b + "." + part + ".weight")) fail("{}: {}.{}.weight: shared experts are not supported", m_.path, b, part);
    if (m_.find(b + ".exp_probs_b.bias"))
      fail("{}: {}.exp_probs_b.bias: a bias on the expert selection is not supported", m_.path, b);
    int logits = g_.add(Op::matmul, {h, weight(b + ".ffn_gate_inp.weight", {E, n_embd})}, {}, b + ".ffn_router");
    int route = g_.add(Op::moe_route, {logits}, {{"k", s_.n_expert_used}, {"norm", int64_t{s_.moe_norm ? 1 : 0}}}, b + ".ffn_route");
    int up = g_.add(Op::moe_matmul, {h, weight(b + ".ffn_up_exps.weight", {E, F, n_embd}), route}, {{"reduce", int64_t{0}}}, b + ".ffn_up_exps");
    int gate = g_.add(Op::moe_matmul, {h, weight(b + ".ffn_gate_exps.weight", {E, F, n_embd}), route}, {{"reduce", int64_t{0}}},
                      b + ".ffn_gate_exps");
    int m = g_.add(Op::mul, {g_.add(ffn_act(), {gate}, {}, b + ".ffn_act"), up}, {}, b + ".ffn_gated");
    return g_.add(Op::moe_matmul, {m, weight(b + ".ffn_down_exps.weight", {E, n_embd, F}), route}, {{"reduce", int64_t{1}}},
                  b + ".ffn_down_exps");
  }

  Graph build() {
    // Every hyperparameter within its range (model/hparams.h) before any product is formed; the
    // ranges keep q_dim, kv_dim and the KV cache size far inside int64.
    const std::string where = m_.path + ": ";
    for (const auto& [term, v] : {std::pair<std::string_view, int64_t>{"n_vocab", hp_.n_vocab}, {"n_embd", hp_.n_embd},
                                  {"n_layer", hp_.n_layer}, {"n_head", hp_.n_head}, {"n_head_kv", hp_.n_head_kv},
                                  {"head_dim", hp_.head_dim}, {"n_ff", hp_.n_ff}, {"n_rot", std::max<int64_t>(0, s_.n_rot)}})
      checked_hparam(term, v, where + std::string(term));
    checked_hparam("n_ctx", s_.n_ctx, where + "context length");
    if (s_.n_expert > 0) {
      checked_hparam("n_expert", s_.n_expert, where + "expert count");
      checked_hparam("n_expert_used", s_.n_expert_used, where + "experts used per token");
      checked_hparam("n_ff", s_.n_ff_exp, where + "expert feed-forward length");
      if (s_.n_expert_used > s_.n_expert)
        fail("{}: {} experts used per token, but the model has {}", m_.path, s_.n_expert_used, s_.n_expert);
    }
    if (s_.learned_positions) checked_hparam("n_ctx", hp_.n_ctx_train, where + "n_ctx_train");
    const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim, q_dim = hp_.n_head * hd, kv_dim = hp_.n_head_kv * hd;
    if (hp_.n_head % hp_.n_head_kv) fail("{}: n_head {} is not a multiple of n_head_kv {}", m_.path, hp_.n_head, hp_.n_head_kv);
    // (the kernels add it in float32: it must stay positive and finite there)
    if (!(static_cast<float>(hp_.norm_eps) > 0) || !std::isfinite(static_cast<float>(hp_.norm_eps)))
      fail("{}: normalization epsilon must be a positive number within float32's range, got {}", m_.path, hp_.norm_eps);
    if (s_.n_rot > hd || (s_.n_rot > 0 && s_.n_rot % 2))
      fail("{}: RoPE dimension count {} must be even and at most head_dim {}", m_.path, s_.n_rot, hd);
    if (!(s_.rope_theta > 0) || !std::isfinite(s_.rope_theta))
      fail("{}: RoPE theta must be a positive number, got {}", m_.path, s_.rope_theta);
    for (const auto& [what, cap] : {std::pair<const char*, double>{"attention logit soft-capping", s_.attn_softcap},
                                    {"final logit soft-capping", s_.final_softcap}})
      if (!(cap >= 0) || !std::isfinite(cap)) fail("{}: {} must be a positive number (or 0: none), got {}", m_.path, what, cap);
    if (s_.sliding_window > 0) {
      checked_hparam("sliding_window", s_.sliding_window, where + "sliding window");
      if (!(s_.rope_theta_swa > 0) || !std::isfinite(s_.rope_theta_swa))
        fail("{}: RoPE theta of the sliding-window layers must be a positive number, got {}", m_.path,
             s_.rope_theta_swa);
    }

    int tokens = g_.add_input("tokens");
    int pos = g_.add_input("positions");
    int emb = weight("token_embd.weight", {hp_.n_vocab, n_embd});
    int x = g_.add(Op::embed, {emb, tokens}, {}, "inp_embd");
    if (s_.embed_scale) x = g_.add(Op::scale, {x}, {{"s", s_.embed_scale_value > 0 ? s_.embed_scale_value : std::sqrt(static_cast<double>(n_embd))}}, "inp_scaled");
    if (s_.learned_positions) {
      int pe = weight("position_embd.weight", {hp_.n_ctx_train, n_embd});
      x = g_.add(Op::add, {x, g_.add(Op::embed, {pe, pos}, {}, "inp_pos_embd")}, {}, "inp_embd_pos");
    }
    double scale = s_.attn_scale > 0 ? s_.attn_scale : 1.0 / std::sqrt(static_cast<double>(hd));
    // RoPE's attn_factor scales every rotated value of q and k, so (with the whole head rotated)
    // every score by its square: folded into the attention scale.
    if (s_.rope_attn_factor != 1.0) {
      if (!(s_.rope_attn_factor > 0) || !std::isfinite(s_.rope_attn_factor))
        fail("{}: RoPE attention factor must be a positive number, got {}", m_.path, s_.rope_attn_factor);
      if (s_.n_rot != 0 && s_.n_rot != hd)
        fail("{}: a RoPE attention factor ({}) with partial rotation ({} of {} dims) is not supported", m_.path,
             s_.rope_attn_factor, s_.n_rot, hd);
      if (std::find(s_.nope_layers.begin(), s_.nope_layers.end(), true) != s_.nope_layers.end())
        fail("{}: a RoPE attention factor ({}) with layers without RoPE is not supported", m_.path, s_.rope_attn_factor);
      scale *= s_.rope_attn_factor * s_.rope_attn_factor;
    }
    // A layer count below the file's would silently drop layers (llama.cpp refuses such a file:
    // "wrong number of tensors"): every tensor of a layer must be of a layer the model has.
    // The prefix is what layer 0's first weight resolves to, up to its index: tensors outside the
    // decoder (a multimodal checkpoint's vision tower) are not the decoder's layers.
    const std::string first_layer = s_.resolve ? s_.resolve("blk.0.attn_norm.weight") : "blk.0.attn_norm.weight";
    const size_t zero = first_layer.find(".0.");
    const std::string layer_prefix = zero == std::string::npos ? "" : first_layer.substr(0, zero + 1);
    for (const WeightTensor& t : m_.tensors())
      if (const int64_t il = tensor_layer_index(t.name, layer_prefix); il >= hp_.n_layer)
        fail("{}: tensor {} belongs to layer {}, but the layer count is {} ({} = {}): the file holds more layers than "
             "it declares", m_.path, printable(t.name, 200), il, hp_.n_layer, layer_count_source(m_, hp_), hp_.n_layer);
    for (int il = 0; il < hp_.n_layer; ++il) {
      std::string b = "blk." + std::to_string(il);
      int h = s_.pre_norms ? norm(x, b + ".attn_norm", n_embd, b + ".attn_norm") : x;
      int q = linear(h, b + ".attn_q", q_dim, n_embd, b + ".q");
      int k = linear(h, b + ".attn_k", kv_dim, n_embd, b + ".k");
      int v = linear(h, b + ".attn_v", kv_dim, n_embd, b + ".v");
      if (s_.qk_norm && s_.qk_norm_full) {  // one RMSNorm over each row of q and of k
        q = norm(q, b + ".attn_q_norm", q_dim, b + ".q_norm");
        k = norm(k, b + ".attn_k_norm", kv_dim, b + ".k_norm");
      } else if (s_.qk_norm) {
        int qn = weight(b + ".attn_q_norm.weight", {hd});
        int kn = weight(b + ".attn_k_norm.weight", {hd});
        q = g_.add(Op::rms_norm, {q, qn}, {{"eps", hp_.norm_eps}, {"group", hd}, {"weight_offset", s_.norm_weight_offset}}, b + ".q_norm");
        k = g_.add(Op::rms_norm, {k, kn}, {{"eps", hp_.norm_eps}, {"group", hd}, {"weight_offset", s_.norm_weight_offset}}, b + ".k_norm");
      }
      if (s_.n_rot >= 0 && !(il < static_cast<int>(s_.nope_layers.size()) && s_.nope_layers[static_cast<size_t>(il)])) {
        q = rope(q, pos, il, b + ".q_rope");
        k = rope(k, pos, il, b + ".k_rope");
      }
      int kc = g_.add(Op::kv_store, {k, g_.add_kv_cache(il, "k", s_.n_ctx, kv_dim, s_.kv_pool_tokens, s_.kv_block_size)}, {}, b + ".k_cache");
      int vc = g_.add(Op::kv_store, {v, g_.add_kv_cache(il, "v", s_.n_ctx, kv_dim, s_.kv_pool_tokens, s_.kv_block_size)}, {}, b + ".v_cache");
      Attrs attn = {{"n_head", hp_.n_head}, {"n_head_kv", hp_.n_head_kv}, {"head_dim", hd}, {"scale", scale}};
      if (swa(il)) attn["window"] = s_.sliding_window;
      if (s_.attn_softcap > 0) attn["softcap"] = s_.attn_softcap;
      int a = g_.add(Op::attention, {q, kc, vc}, attn, b + ".attn");
      int o = linear(a, b + ".attn_output", n_embd, q_dim, b + ".attn_out");
      if (s_.post_norms) o = norm(o, b + ".post_attention_norm", n_embd, b + ".attn_post_norm");
      if (s_.residual_scale != 1.0) o = g_.add(Op::scale, {o}, {{"s", s_.residual_scale}}, b + ".attn_out_scaled");
      if (!s_.parallel_residual) {  // else the FFN reads the attention's input norm too
        x = g_.add(Op::add, {x, o}, {}, b + ".attn_residual");
        h = s_.pre_norms ? norm(x, b + ".ffn_norm", n_embd, b + ".ffn_norm") : x;
      }
      int d = s_.n_expert > 0 ? moe_ffn(h, b) : ffn(h, b);
      if (s_.post_norms) d = norm(d, b + ".post_ffw_norm", n_embd, b + ".ffn_post_norm");
      if (s_.residual_scale != 1.0) d = g_.add(Op::scale, {d}, {{"s", s_.residual_scale}}, b + ".ffn_out_scaled");
      if (s_.parallel_residual)  // (attention + FFN) + x, llama.cpp's order
        x = g_.add(Op::add, {g_.add(Op::add, {o, d}, {}, b + ".attn_ffn"), x}, {}, b + ".residual");
      else
        x = g_.add(Op::add, {x, d}, {}, b + ".ffn_residual");
    }
    x = norm(x, "output_norm", n_embd, "output_norm");
    if (s_.embeddings) {  // the hidden state every row ends with, as llama.cpp's embeddings and HF's last hidden state
      g_.add_output(x, "embd");
      return std::move(g_);
    }
    int cls = weight("output.weight", {hp_.n_vocab, n_embd}, false);
    if (cls < 0) cls = emb;  // tied embeddings: the classifier is the token embedding
    int logits = g_.add(Op::matmul, {x, cls}, {}, "logits_all");
    if (s_.output_bias) logits = g_.add(Op::add, {logits, weight("output.bias", {hp_.n_vocab})}, {}, "logits_all_b");
    if (s_.logit_scale != 1.0) logits = g_.add(Op::scale, {logits}, {{"s", 1.0 / s_.logit_scale}}, "logits_all_scaled");
    if (s_.final_softcap > 0) logits = g_.add(Op::softcap, {logits}, {{"cap", s_.final_softcap}}, "logits_softcap");
    int out = s_.all_logits ? logits : g_.add(Op::last_row, {logits}, {}, "logits");
    g_.add_output(out, "logits");
    // Greedy decoding reads 16 bytes per row instead of the row (Backend::forward_greedy).
    g_.add_output(g_.add(Op::argmax, {out}, {}, "greedy"), "greedy");
    // Sampling with top_k <= kTopK reads the k best (id, logit) pairs per row (Backend::forward_topk).
    g_.add_output(g_.add(Op::topk, {out}, {{"k", kTopK}}, "topk"), "topk");
    return std::move(g_);
  }

 private:
  const ModelFile& m_;
  const DecoderSpec& s_;
  const Hparams& hp_;
  Graph g_;
};

}  // namespace

std::string rope_freq_factors(const std::vector<double>& factors) {
  std::string r;
  for (size_t i = 0; i < factors.size(); ++i) r += fmt::format("{}{:.17g}", i ? "," : "", factors[i]);
  return r;
}

Graph build_decoder(const ModelFile& model, const DecoderSpec& spec) {
  Graph g = DecoderBuilder(model, spec).build();
  verify_graph(g);
  return g;
}

}  // namespace mk
