#include <cstdio>
#include <map>
#include <variant>

#include <fmt/format.h>

#include "archs/arch.h"
#include "cli/commands.h"
#include "runtime/session.h"
#include "support/error.h"
#include "support/printable.h"

namespace mk::cli {
namespace {

// What the graph's rope and attention nodes say about positions and attention, grouped over the
// layers (Gemma 3's sliding-window layers rotate with their own theta): read from the graph the
// backends compile, so it is what runs, not a second reading of the file's keys.
void print_positions_and_attention(const ModelFile& m, const Hparams& hp) {
  const Graph g = build_graph(m, BuildOptions{resolve_n_ctx(hp, 0)});
  auto value = [](const AttrValue& v) {
    if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
    if (const auto* d = std::get_if<double>(&v)) return fmt::format("{:g}", *d);
    return std::get<std::string>(v);
  };
  std::map<std::string, int> ropes;  // description -> layers (q's rope node per layer)
  int n_attn = 0, n_window = 0, n_parallel = 0;
  int64_t window = 0;
  double scale = 0, attn_cap = 0, logit_cap = 0, embed_scale = 0, residual_scale = 0, logit_scale = 0;
  bool logit_bias = false;
  int64_t n_moe = 0, moe_used = 0, n_expert = 0, n_ff_exp = 0;
  bool moe_norm = false;
  std::vector<bool> roped(static_cast<size_t>(hp.n_layer), false);
  for (const auto& n : g.nodes) {
    // Granite's multipliers, Phi-2's parallel residuals and classifier bias (archs/blocks.cpp names)
    if (n.op == Op::scale && n.name == "inp_scaled") embed_scale = n.attr_float("s");
    if (n.op == Op::scale && n.name.ends_with(".attn_out_scaled")) residual_scale = n.attr_float("s");
    if (n.op == Op::scale && n.name == "logits_all_scaled") logit_scale = 1.0 / n.attr_float("s");
    n_parallel += n.name.ends_with(".attn_ffn");
    logit_bias |= n.name == "logits_all_b";
    if (n.op == Op::rope && n.name.starts_with("blk.") && n.name.ends_with(".q_rope")) {
      const int64_t il = std::stoll(n.name.substr(4));
      if (il >= 0 && il < hp.n_layer) roped[static_cast<size_t>(il)] = true;
    }
    if (n.op == Op::attention) {
      ++n_attn;
      scale = n.attr_float("scale");
      attn_cap = n.attr_float("softcap", 0.0);
      if (n.attrs.count("window")) ++n_window, window = n.attr_int("window");
    }
    if (n.op == Op::softcap) logit_cap = n.attr_float("cap");
    if (n.op == Op::moe_route) {
      ++n_moe;
      moe_used = n.attr_int("k");
      moe_norm = n.attr_int("norm", 1) != 0;
    }
    if (n.op == Op::moe_matmul && n.attr_int("reduce", 0) != 0) {
      const Node& w = g[n.inputs[1]];
      n_expert = w.shape[0].c;
      n_ff_exp = w.shape[2].c;
    }
    const bool q_rope = n.name.size() > 7 && n.name.compare(n.name.size() - 7, 7, ".q_rope") == 0;
    if (!q_rope) continue;
    std::string d = fmt::format("{}, n_rot {}, theta {}", n.attr_str("mode"), n.attr_int("n_rot"), value(n.attrs.at("theta")));
    if (n.attrs.count("scaling")) d += ", scaling " + n.attr_str("scaling");  // then its parameters
    for (const auto& [k, v] : n.attrs) {
      if (k == "mode" || k == "n_rot" || k == "theta" || k == "head_dim" || k == "scaling") continue;
      if (k == "freq_factors")
        d += fmt::format(", freq_factors ({} per-pair factors)", std::count(value(v).begin(), value(v).end(), ',') + 1);
      else
        d += fmt::format(", {} {}", k, value(v));
    }
    ++ropes[d];
  }
  std::string rope;
  for (const auto& [d, layers] : ropes)
    rope += fmt::format("{}{}{}", rope.empty() ? "" : "; ", d,
                        ropes.size() > 1 ? fmt::format(" ({} of {} layers)", layers, hp.n_layer) : "");
  std::string nope;  // layers without RoPE among layers with it (SmolLM3)
  if (!rope.empty())
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (!roped[static_cast<size_t>(il)]) nope += fmt::format("{}{}", nope.empty() ? "" : ", ", il);
  if (!nope.empty()) rope += "; none in layers " + nope;
  std::printf("rope:         %s\n", rope.empty() ? "none" : rope.c_str());
  std::string attn = fmt::format("scale {:g}", scale);
  if (n_window > 0) attn += fmt::format(", sliding window {} on {} of {} layers", window, n_window, n_attn);
  if (attn_cap > 0) attn += fmt::format(", scores soft-capped at {:g}", attn_cap);
  std::printf("attention:    %s\n", attn.c_str());
  if (n_parallel > 0) std::printf("layers:       attention and feed-forward in parallel on one norm\n");
  if (n_moe > 0)
    std::printf("experts:      %s\n", fmt::format("{} per layer in {} of {} layers, {} used per token (weights {}), n_ff_exp {}", n_expert,
                                                  n_moe, hp.n_layer, moe_used, moe_norm ? "normalised" : "as routed", n_ff_exp).c_str());
  if (embed_scale > 0) std::printf("embeddings:   scaled by %s\n", fmt::format("{:g}", embed_scale).c_str());
  if (residual_scale > 0) std::printf("residuals:    attention and feed-forward outputs scaled by %s\n", fmt::format("{:g}", residual_scale).c_str());
  std::string logits;
  if (logit_bias) logits += "a classifier bias";
  if (logit_scale > 0) logits += fmt::format("{}divided by {:g}", logits.empty() ? "" : ", ", logit_scale);
  if (logit_cap > 0) logits += fmt::format("{}soft-capped at {:g}", logits.empty() ? "" : ", ", logit_cap);
  if (!logits.empty()) std::printf("logits:       %s\n", logits.c_str());
}

// A GGUF file that load_model refuses for a tensor type it does not read (iq4_xs, iq2_*, tq*): what
// it holds, types named as ggml names them, then the refusal (new-user trials 38, 39: info printed
// only the error, so one could not see which tensors were of which type). False: not such a file
// (the caller rethrows).
bool print_unreadable_gguf(const std::string& path, const Error& refusal) {
  if (std::string(refusal.what()).find("unsupported tensor type") == std::string::npos) return false;
  std::vector<GgufTensorListing> tensors;
  ModelFile m;
  try {
    m = load_gguf_metadata(path);
    tensors = list_gguf_tensors(path);
  } catch (const Error&) {
    return false;
  }
  std::printf("model:        %s (gguf)\n", printable(path).c_str());
  if (m.has("general.architecture") && m.metadata.at("general.architecture").is_string())
    std::printf("architecture: %s\n", printable(m.get_str("general.architecture")).c_str());
  std::printf("%zu %s:\n", tensors.size(), tensors.size() == 1 ? "tensor" : "tensors");
  std::map<std::string, std::pair<size_t, bool>> per_type;  // type -> (tensors, readable)
  for (const auto& t : tensors) {
    std::printf("  %-40s %-6s %-20s %s\n", printable(t.name).c_str(), t.type.c_str(), shape_str(t.shape).c_str(),
                t.supported ? fmt::format("{} bytes", t.nbytes).c_str() : "(type not supported)");
    auto& e = per_type[t.type];
    ++e.first;
    e.second = t.supported;
  }
  for (const auto& [type, e] : per_type)
    std::printf("  %-6s %zu %s%s\n", type.c_str(), e.first, e.first == 1 ? "tensor" : "tensors",
                e.second ? "" : " (not supported)");
  std::fflush(stdout);
  return true;
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("info", "print a model's architecture, hyperparameters and tensors");
  cmd->add_option("-m,--model", *path, "model file or directory")->required();
  cmd->callback([path] {
    ModelFile m;
    try {
      m = open_model(*path, /*with_data=*/false);
    } catch (const Error& e) {
      if (!print_unreadable_gguf(*path, e)) throw;
      fail("{} (the model cannot be run; its tensors are listed above)", e.what());
    }
    if (m.format == "gguf" && m.tensors().empty()) {
      // A vocab-only GGUF (llama.cpp's ggml-vocab-*.gguf): what it holds, not "missing tensor token_embd.weight".
      std::printf("model:        %s (gguf)\n", printable(m.path).c_str());
      if (m.has("general.architecture") && m.metadata.at("general.architecture").is_string())
        std::printf("architecture: %s\n", printable(m.get_str("general.architecture")).c_str());
      if (m.has("tokenizer.ggml.tokens") && m.metadata.at("tokenizer.ggml.tokens").is_array())
        std::printf("vocabulary:   %zu tokens (tokenizer.ggml.model %s)\n", m.metadata.at("tokenizer.ggml.tokens").size(),
                    m.has("tokenizer.ggml.model") && m.metadata.at("tokenizer.ggml.model").is_string()
                        ? printable(m.get_str("tokenizer.ggml.model")).c_str()
                        : "?");
      std::printf("0 tensors: a vocab-only file (`tokenize` reads its vocabulary; run, chat and serve need weights)\n");
      return;
    }
    Hparams hp = read_hparams(m);
    // Synthetic models carry GGUF names and keys (format "gguf") but are no file: say what they are.
    const bool synthetic = m.path.rfind("synth:", 0) == 0;
    std::printf("model:        %s (%s)\n", m.path.c_str(), synthetic ? "synthetic: random weights, no tokenizer" : m.format.c_str());
    std::printf("architecture: %s\n", hp.arch.c_str());
    std::printf("n_vocab %lld, n_embd %lld, n_layer %lld, n_head %lld, n_head_kv %lld, head_dim %lld, n_ff %lld, n_ctx_train %lld, norm_eps %g\n",
                (long long)hp.n_vocab, (long long)hp.n_embd, (long long)hp.n_layer, (long long)hp.n_head,
                (long long)hp.n_head_kv, (long long)hp.head_dim, (long long)hp.n_ff, (long long)hp.n_ctx_train, hp.norm_eps);
    // A file whose graph cannot be built (a tensor missing, a shape that does not fit) still lists
    // its tensors: `info` is where one looks to see why. It then exits 1 with the reason, as run
    // would (new-user trial 35: it exited 0 on files run refuses).
    std::string graph_error;
    try {
      print_positions_and_attention(m, hp);
    } catch (const Error& e) {
      graph_error = e.what();
      std::printf("graph:        cannot be built: %s\n", e.what());
    }
    // The file's tensors; those made at load (Phi-3's q/k/v row views, GPT-2's transposed copies,
    // Gemma 3's aliases) are not in the file and would count its bytes twice.
    size_t total = 0, n_file = 0, n_derived = 0;
    for (const auto& t : m.tensors()) (t.derived ? n_derived : n_file) += 1;
    std::printf("%zu %s:\n", n_file, n_file == 1 ? "tensor" : "tensors");
    for (const auto& t : m.tensors()) {
      if (t.derived) continue;
      std::printf("  %-40s %-5s %-20s %zu bytes\n", t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                  shape_str(t.shape).c_str(), t.nbytes);
      total += t.nbytes;
    }
    if (n_derived > 0)
      std::printf("  (and %zu %s made from these at load, not listed or counted: row views, aliases, transposed copies)\n",
                  n_derived, n_derived == 1 ? "tensor" : "tensors");
    std::printf("total: %zu bytes of weights\n", total);
    // Per element type (a Q4_K_M file mixes q4_K, q6_K, q5_0, q8_0 and f32), in DType order.
    for (DType dt : kAllDTypes) {
      size_t bytes = 0, count = 0, elements = 0;
      for (const auto& t : m.tensors())
        if (t.dtype == dt && !t.derived) {
          bytes += t.nbytes;
          elements += static_cast<size_t>(t.numel());
          ++count;
        }
      if (count > 0)
        std::printf("  %-5s %zu %s, %zu elements, %zu bytes (%.2f bits per weight)\n",
                    std::string(dtype_name(dt)).c_str(), count, count == 1 ? "tensor" : "tensors", elements, bytes,
                    8.0 * static_cast<double>(bytes) / static_cast<double>(elements));
    }
    // The tokenizer: --ids runs without it, text prompts, chat and tokenize refuse it (trial 48: info
    // said nothing of a damaged one).
    if (const std::string why = tokenizer_problem(m, hp.n_vocab); !why.empty())
      std::printf("tokenizer:    cannot be used: %s (text prompts, chat, tokenize and serve's text requests refuse the model; "
                  "run --ids works)\n",
                  printable(why, 1024).c_str());
    if (!graph_error.empty()) {
      std::fflush(stdout);
      fail("{} (the model cannot be run; its tensors are listed above)", graph_error);
    }
  });
}

}  // namespace mk::cli
