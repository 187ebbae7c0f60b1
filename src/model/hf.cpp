#include "model/hf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "model/hparams.h"
#include "model/safetensors.h"
#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace fs = std::filesystem;

int64_t hf_config_int(const nlohmann::ordered_json& c, std::initializer_list<const char*> keys,
                      std::optional<int64_t> def) {
  // Aliases (hidden_size / n_embd, ...) that are both given must agree: never pick one silently.
  const char* first = nullptr;
  for (const char* k : keys) {
    if (!c.contains(k) || c[k].is_null()) continue;
    if (!first) first = k;
    else if (c[k] != c[first]) fail("config.json: {} = {} and {} = {} disagree", first, clip_json(c[first]), k, clip_json(c[k]));
  }
  for (const char* k : keys) {
    if (!c.contains(k) || c[k].is_null()) continue;
    if (!c[k].is_number_integer()) fail("config.json: {} is not an integer", k);
    if (c[k].is_number_unsigned() && c[k].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail("config.json: {} = {} is out of range", k, c[k].get<uint64_t>());
    return c[k].get<int64_t>();
  }
  if (!def) fail("config.json: missing {}", *keys.begin());
  return *def;
}

int64_t hf_hparam(const nlohmann::ordered_json& c, std::string_view term, std::initializer_list<const char*> keys,
                  std::optional<int64_t> def) {
  const char* key = *keys.begin();
  for (const char* k : keys)
    if (c.contains(k) && !c[k].is_null()) {
      key = k;
      break;
    }
  return checked_hparam(term, hf_config_int(c, keys, def), fmt::format("config.json: {}", key));
}


namespace {

// Loads the shards listed in model.safetensors.index.json, each mapped once, and checks that every
// tensor of the weight_map is in the shard that the index names.
void load_sharded(ModelFile& model, const fs::path& dir, const std::string& index_path) {
  nlohmann::ordered_json index = read_json_file(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail("{}: missing weight_map object", index_path);
  std::map<std::string, std::vector<std::string>> shard_tensors;  // sorted: deterministic load order
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) fail("{}: weight_map entry {} is not a file name", index_path, clip(name));
    shard_tensors[shard.get<std::string>()].push_back(name);
  }
  for (const auto& [shard, names] : shard_tensors) {
    // Shards are plain file names next to the index; refuse paths that leave the directory.
    fs::path rel(shard);
    if (shard.empty() || rel.is_absolute() || rel.filename() != rel)
      fail("{}: shard name {} (for tensor {}) is not a plain file name", index_path, clip(shard), clip(names.front()));
    fs::path shard_path = dir / rel;
    if (!fs::is_regular_file(shard_path))
      fail("{}: shard {} (for tensor {}) not found", index_path, clip(shard), clip(names.front()));
    size_t before = model.tensors().size();
    add_safetensors(model, MappedFile::open(shard_path.string()));
    std::set<std::string> in_shard;
    for (size_t i = before; i < model.tensors().size(); ++i) in_shard.insert(model.tensors()[i].name);
    for (const auto& n : names)
      if (!in_shard.count(n)) fail("{}: tensor {} is listed in shard {} but not stored there", index_path, clip(n), clip(shard));
  }
}

// The transpose of a 2-D tensor, [a, b] -> [b, a], held in model.owned.
WeightTensor transposed(ModelFile& m, const WeightTensor& t, std::string name) {
  const size_t es = dtype_bytes(t.dtype, 1);
  const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
  auto buf = std::make_shared<std::vector<uint8_t>>(t.nbytes);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) std::memcpy(buf->data() + (j * rows + i) * es, t.data + (i * cols + j) * es, es);
  m.owned.push_back(buf);
  WeightTensor v;
  v.name = std::move(name);
  v.dtype = t.dtype;
  v.shape = {t.shape[1], t.shape[0]};
  v.data = buf->data();
  v.nbytes = buf->size();
  v.derived = true;
  return v;
}

// A copy of tensor `name` (copies stay valid while tensors are added) checked against `shape`.
WeightTensor take(const ModelFile& m, const std::string& name, const std::vector<int64_t>& shape) {
  return m.get(name, shape);
}

// Phi-3 fuses q/k/v into self_attn.qkv_proj and gate/up into mlp.gate_up_proj. Their rows are
// contiguous, so each part is registered as a view under the Llama name (q_proj, k_proj, v_proj,
// gate_proj, up_proj) without copying.
void add_phi3_views(ModelFile& m, const nlohmann::ordered_json& c, std::vector<std::string>& derived) {
  // Checked ranges keep every product below (q_dim + 2 * kv_dim, 2 * n_ff, row offsets) far inside int64.
  const int64_t hidden = hf_hparam(c, "n_embd", {"hidden_size"}), n_head = hf_hparam(c, "n_head", {"num_attention_heads"});
  const int64_t n_head_kv = hf_hparam(c, "n_head_kv", {"num_key_value_heads"}, n_head);
  const int64_t head_dim = hf_hparam(c, "head_dim", {"head_dim"}, hidden / n_head);
  const int64_t n_ff = hf_hparam(c, "n_ff", {"intermediate_size"});
  const int64_t q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim;
  auto add = [&](WeightTensor t) {
    derived.push_back(t.name);
    m.add_tensor(std::move(t));
  };
  for (int il = 0;; ++il) {
    const std::string p = fmt::format("model.layers.{}.", il);
    if (!m.find(p + "self_attn.qkv_proj.weight")) break;
    WeightTensor qkv = take(m, p + "self_attn.qkv_proj.weight", {q_dim + 2 * kv_dim, hidden});
    add(row_view(qkv, 0, q_dim, p + "self_attn.q_proj.weight"));
    add(row_view(qkv, q_dim, kv_dim, p + "self_attn.k_proj.weight"));
    add(row_view(qkv, q_dim + kv_dim, kv_dim, p + "self_attn.v_proj.weight"));
    if (m.find(p + "self_attn.qkv_proj.bias")) {
      WeightTensor b = take(m, p + "self_attn.qkv_proj.bias", {q_dim + 2 * kv_dim});
      add(row_view(b, 0, q_dim, p + "self_attn.q_proj.bias"));
      add(row_view(b, q_dim, kv_dim, p + "self_attn.k_proj.bias"));
      add(row_view(b, q_dim + kv_dim, kv_dim, p + "self_attn.v_proj.bias"));
    }
    if (m.find(p + "mlp.gate_up_proj.weight")) {  // gate first, then up (Phi3MLP chunks in this order)
      WeightTensor gu = take(m, p + "mlp.gate_up_proj.weight", {2 * n_ff, hidden});
      add(row_view(gu, 0, n_ff, p + "mlp.gate_proj.weight"));
      add(row_view(gu, n_ff, n_ff, p + "mlp.up_proj.weight"));
    }
  }
}

// GPT-2 stores its projections as Conv1D weights [n_in, n_out] with q/k/v fused in attn.c_attn.
// Each is registered transposed to [n_out, n_in] under a Llama-like name: attn.{q,k,v}_proj
// (weight and bias), attn.o_proj, mlp.up_proj, mlp.down_proj. Biases need no transpose and keep
// their names except the q/k/v split (views of attn.c_attn.bias).
// Gemma 3 multimodal checkpoints (model_type gemma3, Gemma3ForConditionalGeneration) carry the text
// model's config in `text_config` (only the values that differ from Gemma3TextConfig's defaults)
// and its tensors under language_model.model.* (transformers < 5) or model.language_model.*
// (transformers >= 5). The text part is read as gemma3_text: the config completed with those
// defaults, its tensors aliased under model.* (lm_head under its own name); vision tensors are ignored.
void flatten_gemma3_multimodal(ModelFile& m, nlohmann::ordered_json& config, std::vector<std::string>& derived) {
  if (!config.contains("text_config") || !config["text_config"].is_object())
    fail("{}: gemma3 config.json has no text_config object", m.path);
  nlohmann::ordered_json text = config["text_config"];
  static const nlohmann::ordered_json kDefaults = {
      {"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216}, {"num_hidden_layers", 26},
      {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256},
      {"hidden_activation", "gelu_pytorch_tanh"}, {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-6},
      {"rope_theta", 1e6}, {"rope_local_base_freq", 1e4}, {"query_pre_attn_scalar", 256}, {"sliding_window", 4096},
      {"sliding_window_pattern", 6}};
  for (const auto& [k, v] : kDefaults.items())
    if (!text.contains(k)) text[k] = v;
  for (const char* k : {"tie_word_embeddings", "torch_dtype", "dtype"})
    if (!text.contains(k) && config.contains(k)) text[k] = config[k];
  text["model_type"] = "gemma3_text";
  m.metadata["hf.config_multimodal"] = config;
  config = text;
  m.metadata["general.architecture"] = "gemma3_text";
  std::vector<WeightTensor> aliases;
  for (const WeightTensor& t : m.tensors()) {
    for (const char* prefix : {"language_model.model.", "model.language_model."})
      if (t.name.starts_with(prefix)) {
        aliases.push_back(t);
        aliases.back().name = "model." + t.name.substr(std::string(prefix).size());
        aliases.back().derived = true;
      }
    if (t.name == "language_model.lm_head.weight") {
      aliases.push_back(t);
      aliases.back().name = "lm_head.weight";
      aliases.back().derived = true;
    }
  }
  if (aliases.empty()) fail("{}: gemma3 checkpoint without language_model tensors", m.path);
  for (WeightTensor& t : aliases) {
    derived.push_back(t.name);
    m.add_tensor(std::move(t));
  }
}

// Mixture-of-experts checkpoints store one tensor per expert (Qwen3-MoE and OLMoE mlp.experts.<e>.gate_proj /
// up_proj / down_proj, Mixtral block_sparse_moe.experts.<e>.w1 / w3 / w2); the decoder reads one
// [n_expert, rows, cols] tensor per matrix (GGUF's ffn_*_exps). Each layer's experts are copied in
// order into one such tensor held in model.owned (the experts' bytes once more in memory),
// registered as <prefix>experts.<part>.weight.
void add_expert_stacks(ModelFile& m, const nlohmann::ordered_json& c, bool mixtral, std::vector<std::string>& derived) {
  const int64_t n_expert = hf_hparam(c, "n_expert", {mixtral ? "num_local_experts" : "num_experts"});
  const int64_t n_layer = hf_hparam(c, "n_layer", {"num_hidden_layers"});
  const std::string prefix = mixtral ? "block_sparse_moe.experts." : "mlp.experts.";
  const std::vector<std::string> parts = mixtral ? std::vector<std::string>{"w1", "w3", "w2"}
                                                 : std::vector<std::string>{"gate_proj", "up_proj", "down_proj"};
  for (int64_t il = 0; il < n_layer; ++il) {
    const std::string p = fmt::format("model.layers.{}.{}", il, prefix);
    // Every expert's tensors, checked before anything is copied (a wrong expert count is named, not
    // allocated); one past the count is a checkpoint with more experts than the config says.
    if (m.find(fmt::format("{}{}.{}.weight", p, n_expert, parts[0])))
      fail("{}: {}{}.{}.weight: the checkpoint has more experts than {} = {}", m.path, p, n_expert, parts[0],
           mixtral ? "num_local_experts" : "num_experts", n_expert);
    for (const std::string& part : parts) {
      const WeightTensor& first = m.get(p + "0." + part + ".weight");
      if (first.shape.size() != 2) fail("{}: {} must be 2-D, got {}", m.path, first.name, shape_str(first.shape));
      for (int64_t e = 1; e < n_expert; ++e) {
        const WeightTensor& t = m.get(fmt::format("{}{}.{}.weight", p, e, part), first.shape);
        if (t.dtype != first.dtype)
          fail("{}: {} is {}, but {} is {}", m.path, t.name, dtype_name(t.dtype), first.name, dtype_name(first.dtype));
      }
    }
    for (const std::string& part : parts) {
      const WeightTensor first = m.get(p + "0." + part + ".weight");
      auto buf = std::make_shared<std::vector<uint8_t>>(first.nbytes * static_cast<size_t>(n_expert));
      for (int64_t e = 0; e < n_expert; ++e)
        std::memcpy(buf->data() + static_cast<size_t>(e) * first.nbytes, m.get(fmt::format("{}{}.{}.weight", p, e, part)).data,
                    first.nbytes);
      m.owned.push_back(buf);
      WeightTensor v;
      v.name = p + part + ".weight";
      v.dtype = first.dtype;
      v.shape = {n_expert, first.shape[0], first.shape[1]};
      v.data = buf->data();
      v.nbytes = buf->size();
      v.derived = true;
      derived.push_back(v.name);
      m.add_tensor(std::move(v));
    }
  }
}

void add_gpt2_transposes(ModelFile& m, const nlohmann::ordered_json& c, std::vector<std::string>& derived) {
  const int64_t n = hf_hparam(c, "n_embd", {"n_embd", "hidden_size"});
  const int64_t n_ff = hf_hparam(c, "n_ff", {"n_inner"}, 4 * n);
  auto add = [&](WeightTensor t) {
    derived.push_back(t.name);
    m.add_tensor(std::move(t));
  };
  for (int il = 0;; ++il) {
    const std::string p = fmt::format("transformer.h.{}.", il);
    if (!m.find(p + "attn.c_attn.weight")) break;
    WeightTensor qkv = transposed(m, take(m, p + "attn.c_attn.weight", {n, 3 * n}), "");
    add(row_view(qkv, 0, n, p + "attn.q_proj.weight"));
    add(row_view(qkv, n, n, p + "attn.k_proj.weight"));
    add(row_view(qkv, 2 * n, n, p + "attn.v_proj.weight"));
    if (m.find(p + "attn.c_attn.bias")) {
      WeightTensor b = take(m, p + "attn.c_attn.bias", {3 * n});
      add(row_view(b, 0, n, p + "attn.q_proj.bias"));
      add(row_view(b, n, n, p + "attn.k_proj.bias"));
      add(row_view(b, 2 * n, n, p + "attn.v_proj.bias"));
    }
    add(transposed(m, take(m, p + "attn.c_proj.weight", {n, n}), p + "attn.o_proj.weight"));
    add(transposed(m, take(m, p + "mlp.c_fc.weight", {n, n_ff}), p + "mlp.up_proj.weight"));
    add(transposed(m, take(m, p + "mlp.c_proj.weight", {n_ff, n}), p + "mlp.down_proj.weight"));
  }
}

}  // namespace

ModelFile load_hf_dir(const std::string& dir_str, bool with_weights) {
  fs::path dir(dir_str);
  if (!fs::is_directory(dir)) fail("{}: not a directory", dir_str);
  ModelFile model;
  model.path = dir_str;
  model.format = "hf";

  const fs::path config_path = dir / "config.json";
  if (!fs::is_regular_file(config_path))
    fail("{}: missing config.json (a model directory is a Hugging Face checkpoint: config.json and "
         "*.safetensors; or pass a .gguf or llama2.c .bin file)",
         dir_str);
  nlohmann::ordered_json config = read_json_file(config_path.string());
  if (!config.is_object()) fail("{}: not a JSON object", config_path.string());
  if (!config.contains("model_type")) fail("{}: missing model_type", config_path.string());
  if (!config["model_type"].is_string()) fail("{}: model_type is not a string", config_path.string());
  model.metadata["general.architecture"] = config["model_type"].get<std::string>();
  model.metadata["hf.config"] = config;

  const fs::path gen_path = dir / "generation_config.json";
  if (fs::is_regular_file(gen_path)) {
    nlohmann::ordered_json gen = read_json_file(gen_path.string());
    if (!gen.is_object()) fail("{}: not a JSON object", gen_path.string());
    model.metadata["hf.generation_config"] = gen;
  }
  if (!with_weights) return model;  // the configs only: what the tokenizer reads (load_model_vocab)

  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(single)) {
    add_safetensors(model, MappedFile::open(single.string()));
  } else if (fs::is_regular_file(index)) {
    load_sharded(model, dir, index.string());
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json (only safetensors weights are supported)",
         dir_str);
  }

  // Per-projection tensors for checkpoints that fuse or transpose them (see hf.h).
  std::vector<std::string> derived;
  const std::string type = config["model_type"].get<std::string>();
  if (type == "gemma3") {
    flatten_gemma3_multimodal(model, config, derived);
    model.metadata["hf.config"] = config;
  }
  naming_hf_config(dir_str, [&] {
    if (type == "phi3") add_phi3_views(model, config, derived);
    if (type == "gpt2") add_gpt2_transposes(model, config, derived);
    if (type == "qwen3_moe" || type == "olmoe" || type == "mixtral") add_expert_stacks(model, config, type == "mixtral", derived);
  });
  if (!derived.empty()) model.metadata["hf.derived_tensors"] = derived;
  return model;
}

HfRope read_hf_rope(const nlohmann::ordered_json& config) {
  HfRope rope;
  auto number = [](const nlohmann::ordered_json& obj, const char* key, const char* where) -> double {
    if (!obj.contains(key) || !obj[key].is_number()) fail("config.json: {}.{} missing or not a number", where, key);
    return obj[key].get<double>();
  };
  if (config.contains("partial_rotary_factor") && config["partial_rotary_factor"].is_number())
    rope.partial_rotary_factor = config["partial_rotary_factor"].get<double>();
  if (config.contains("rope_theta") && !config["rope_theta"].is_null())
    rope.theta = number(config, "rope_theta", "config");

  // transformers 5 form: everything inside rope_parameters; older form: rope_scaling next to rope_theta.
  const nlohmann::ordered_json* params = nullptr;
  const char* where = "rope_scaling";
  const bool has_params = config.contains("rope_parameters") && !config["rope_parameters"].is_null();
  if (has_params && config.contains("rope_scaling") && !config["rope_scaling"].is_null() &&
      config["rope_scaling"] != config["rope_parameters"])
    fail("config.json: rope_parameters and rope_scaling are both given and differ");
  if (has_params) {
    params = &config["rope_parameters"];
    where = "rope_parameters";
  } else if (config.contains("rope_scaling") && !config["rope_scaling"].is_null()) {
    params = &config["rope_scaling"];
  }
  if (!params) {
    if (!(rope.theta > 0) || !std::isfinite(rope.theta)) fail("config.json: rope_theta must be a positive number");
    if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1))
      fail("config.json: partial_rotary_factor {} must be in (0, 1]", rope.partial_rotary_factor);
    return rope;
  }
  if (!params->is_object()) fail("config.json: {} is not an object", where);
  const auto& p = *params;
  // A value given both at the top level and inside the parameters must agree.
  if (p.contains("rope_theta")) {
    const double t = number(p, "rope_theta", where);
    if (config.contains("rope_theta") && !config["rope_theta"].is_null() && t != rope.theta)
      fail("config.json: rope_theta {} and {}.rope_theta {} disagree", rope.theta, where, t);
    rope.theta = t;
  }
  if (p.contains("partial_rotary_factor")) {
    const double f = number(p, "partial_rotary_factor", where);
    if (config.contains("partial_rotary_factor") && config["partial_rotary_factor"].is_number() &&
        f != rope.partial_rotary_factor)
      fail("config.json: partial_rotary_factor {} and {}.partial_rotary_factor {} disagree", rope.partial_rotary_factor,
           where, f);
    rope.partial_rotary_factor = f;
  }

  std::string type = "default";
  bool have_type = false;
  for (const char* key : {"rope_type", "type"}) {
    if (p.contains(key) && !p[key].is_null()) {
      if (!p[key].is_string()) fail("config.json: {}.{} is not a string", where, key);
      if (have_type && p[key].get<std::string>() != type)
        fail("config.json: {}.rope_type {} and {}.type {} disagree", where, clip(type), where, clip(p[key].get<std::string>()));
      type = p[key].get<std::string>();
      have_type = true;
    }
  }
  if (type == "default") {
    // Per-layer-type dictionaries (e.g. {"full_attention": {...}, "sliding_attention": {...}}) carry objects.
    for (const auto& [k, v] : p.items())
      if (v.is_object()) fail("config.json: {} per layer type ({}) is not supported", where, clip(k));
  } else if (type == "linear") {
    rope.factor = number(p, "factor", where);
  } else if (type == "llama3") {
    rope.factor = number(p, "factor", where);
    rope.low_freq_factor = number(p, "low_freq_factor", where);
    rope.high_freq_factor = number(p, "high_freq_factor", where);
    double omax = number(p, "original_max_position_embeddings", where);
    if (!(omax >= 1 && omax <= static_cast<double>(hparam_range("n_ctx").max)) || omax != std::floor(omax))
      fail("config.json: {}.original_max_position_embeddings = {} must be a positive whole number of positions", where,
           omax);
    rope.original_max_position_embeddings = static_cast<int64_t>(omax);
    if (!(rope.high_freq_factor > rope.low_freq_factor))
      fail("config.json: {}: high_freq_factor must exceed low_freq_factor", where);
  } else if (type == "longrope") {
    auto factors = [&](const char* key) {
      if (!p.contains(key) || !p[key].is_array() || p[key].empty())
        fail("config.json: {}.{} must be a list of numbers", where, key);
      std::vector<double> f;
      for (const auto& v : p[key]) {
        if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
          fail("config.json: {}.{} entries must be positive numbers", where, key);
        f.push_back(v.get<double>());
      }
      return f;
    };
    rope.short_factor = factors("short_factor");
    rope.long_factor = factors("long_factor");
    if (rope.short_factor.size() != rope.long_factor.size())
      fail("config.json: {}: short_factor has {} entries, long_factor {}", where, rope.short_factor.size(),
           rope.long_factor.size());
    const auto& holder = p.contains("original_max_position_embeddings") ? p : config;
    const double omax = number(holder, "original_max_position_embeddings", holder == p ? where : "config");
    if (!(omax >= 2 && omax <= static_cast<double>(hparam_range("n_ctx").max)) || omax != std::floor(omax))
      fail("config.json: original_max_position_embeddings = {} must be a whole number of positions > 1", omax);
    rope.original_max_position_embeddings = static_cast<int64_t>(omax);
    if (p.contains("attention_factor") && !p["attention_factor"].is_null()) {
      rope.attention_factor = number(p, "attention_factor", where);
    } else {
      const bool have_max = config.contains("max_position_embeddings") && config["max_position_embeddings"].is_number();
      const double scale = have_max ? config["max_position_embeddings"].get<double>() / omax
                           : p.contains("factor") && p["factor"].is_number() ? p["factor"].get<double>()
                                                                              : 1.0;
      rope.attention_factor = scale <= 1 ? 1.0 : std::sqrt(1 + std::log(scale) / std::log(omax));
    }
    if (!(rope.attention_factor > 0) || !std::isfinite(rope.attention_factor))
      fail("config.json: {}.attention_factor must be a positive number", where);
  } else {
    fail("config.json: unsupported RoPE type {} (supported: default, linear, llama3, longrope)", clip(type));
  }
  if (!(rope.theta > 0) || !std::isfinite(rope.theta)) fail("config.json: rope_theta must be a positive number");
  if (!(rope.factor > 0) || !std::isfinite(rope.factor)) fail("config.json: {}.factor must be a positive number", where);
  if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1))
    fail("config.json: partial_rotary_factor {} must be in (0, 1]", rope.partial_rotary_factor);
  rope.type = type;
  return rope;
}

std::vector<int32_t> read_hf_eos_ids(const ModelFile& model) {
  std::vector<int32_t> ids;
  auto take = [&](const nlohmann::ordered_json& obj, const char* file) -> bool {
    if (!obj.is_object() || !obj.contains("eos_token_id") || obj["eos_token_id"].is_null()) return false;
    const auto& v = obj["eos_token_id"];
    auto add = [&](const nlohmann::ordered_json& x) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        fail("{}: eos_token_id must be a non-negative integer or a list of them, got {}", file, clip_json(v));
      int32_t id = static_cast<int32_t>(x.get<int64_t>());
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    };
    if (v.is_array()) {
      for (const auto& x : v) add(x);
    } else {
      add(v);
    }
    return true;
  };
  if (model.metadata.contains("hf.generation_config") &&
      take(model.metadata["hf.generation_config"], "generation_config.json"))
    return ids;
  if (model.metadata.contains("hf.config")) take(model.metadata["hf.config"], "config.json");
  return ids;
}

}  // namespace mk
