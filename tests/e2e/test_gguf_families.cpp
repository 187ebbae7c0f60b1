// GGUF files of the qwen2, qwen3, gemma and phi3 families, converted here from the Hugging Face fixtures
// the way llama.cpp's convert_hf_to_gguf.py writes them (GGUF tensor names, ne[] reversed, q/k not
// permuted for these NEOX-RoPE families, Gemma's norm weights stored as 1 + w), give the logits
// that transformers computed (reference.json). Phi-3 keeps its fused attn_qkv and ffn_up ([gate; up]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archs/hf_common.h"
#include "archs/registry.h"
#include "model/hf.h"
#include "model/model_file.h"
#include "runtime/session.h"
#include "support/compare.h"

namespace mk {
namespace {

struct Writer {
  std::string kvs, infos, data;
  uint64_t n_kv = 0, n_tensors = 0;
  static void u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
  static void u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
  static void str(std::string& s, const std::string& v) { u64(s, v.size()), s += v; }
  void key(const std::string& k, uint32_t type) { str(kvs, k), u32(kvs, type), ++n_kv; }
  void put_str(const std::string& k, const std::string& v) { key(k, 8), str(kvs, v); }
  void put_u32(const std::string& k, uint32_t v) { key(k, 4), u32(kvs, v); }
  void put_f32(const std::string& k, float v) { key(k, 6), kvs.append(reinterpret_cast<const char*>(&v), 4); }
  void tensor(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values) {
    while (data.size() % 32) data.push_back('\0');
    str(infos, name);
    u32(infos, static_cast<uint32_t>(shape.size()));
    for (size_t d = shape.size(); d-- > 0;) u64(infos, static_cast<uint64_t>(shape[d]));  // ne[]: innermost first
    u32(infos, 0);  // f32
    u64(infos, data.size());
    data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    ++n_tensors;
  }
  std::string bytes() const {
    std::string s = "GGUF";
    u32(s, 3), u64(s, n_tensors), u64(s, n_kv);
    s += kvs + infos;
    while (s.size() % 32) s.push_back('\0');
    return s + data;
  }
};

std::vector<float> f32_values(const WeightTensor& t) {
  EXPECT_EQ(t.dtype, DType::F32) << t.name;
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

// llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: the q/k rows of each head reordered from
// transformers' rotate_half layout (pair i = rows i and i + head_dim/2) to adjacent pairs (2i, 2i + 1).
std::vector<float> permute_qk(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t head_dim) {
  std::vector<float> out(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / head_dim, i = (r % head_dim) / 2, j = r % 2;
    const int64_t src = h * head_dim + j * (head_dim / 2) + i;
    std::copy_n(w.begin() + src * cols, cols, out.begin() + r * cols);
  }
  return out;
}

// LlamaModel.generate_extra_tensors: Llama 3 RoPE scaling as rope_freqs.weight, one factor per
// rotated pair (computed in float32 there, as here).
std::vector<float> llama3_rope_factors(const HfRope& r, int64_t dim) {
  std::vector<float> f;
  const double lo_wavelen = static_cast<double>(r.original_max_position_embeddings) / r.low_freq_factor;
  const double hi_wavelen = static_cast<double>(r.original_max_position_embeddings) / r.high_freq_factor;
  for (int64_t i = 0; i < dim; i += 2) {
    const float freq = 1.0f / std::pow(static_cast<float>(r.theta), static_cast<float>(i) / static_cast<float>(dim));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < hi_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > lo_wavelen) {
      f.push_back(static_cast<float>(r.factor));
    } else {
      const double smooth = (static_cast<double>(r.original_max_position_embeddings) / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f.push_back(static_cast<float>(1 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return f;
}

// HF fixture directory -> GGUF bytes of architecture `arch`. For "llama", q/k are permuted as
// llama.cpp's converter does, and a llama3 rope scaling becomes rope_freqs.weight unless
// `drop_rope_freqs`.
std::string convert(const std::string& dir, const std::string& arch, bool drop_rope_freqs = false) {
  const ModelFile hf = load_hf_dir(dir);
  const Hparams hp = read_hf_hparams(hf);
  const auto& c = hf_config(hf);
  Writer w;
  w.put_str("general.architecture", arch);
  w.put_u32(arch + ".embedding_length", static_cast<uint32_t>(hp.n_embd));
  w.put_u32(arch + ".block_count", static_cast<uint32_t>(hp.n_layer));
  w.put_u32(arch + ".attention.head_count", static_cast<uint32_t>(hp.n_head));
  w.put_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(hp.n_head_kv));
  w.put_u32(arch + ".attention.key_length", static_cast<uint32_t>(hp.head_dim));
  w.put_u32(arch + ".feed_forward_length", static_cast<uint32_t>(hp.n_ff));
  w.put_u32(arch + ".context_length", static_cast<uint32_t>(hp.n_ctx_train));
  w.put_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(hp.norm_eps));
  const auto& rp = c.contains("rope_parameters") ? c["rope_parameters"] : c;
  w.put_f32(arch + ".rope.freq_base", rp.value("rope_theta", 10000.0f));
  w.put_u32(arch + ".rope.dimension_count",
            static_cast<uint32_t>(static_cast<double>(hp.head_dim) * read_hf_rope(c).partial_rotary_factor));
  std::vector<std::string> names = {"token_embd.weight", "output_norm.weight", "output.weight"};
  for (int64_t il = 0; il < hp.n_layer; ++il)
    for (const char* part : {"attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                             "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
                             "attn_k_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
      names.push_back("blk." + std::to_string(il) + "." + part);
  int n = 0;
  for (const auto& name : names) {
    std::string hf_name = hf_llama_tensor_name(name, false);
    if (arch == "phi3") {  // llama.cpp keeps Phi-3's fused projections
      if (name.find(".attn_k.") != std::string::npos || name.find(".attn_v.") != std::string::npos ||
          name.find(".ffn_gate.") != std::string::npos)
        continue;
      const std::string layer = "model.layers." + name.substr(4, name.find('.', 4) - 4);
      if (name.ends_with(".attn_q.weight")) {
        const WeightTensor& t = hf.get(layer + ".self_attn.qkv_proj.weight");
        w.tensor(name.substr(0, name.size() - 14) + ".attn_qkv.weight", t.shape, f32_values(t));
        ++n;
        continue;
      }
      if (name.ends_with(".ffn_up.weight")) hf_name = layer + ".mlp.gate_up_proj.weight";
    }
    const WeightTensor* t = hf.find(hf_name);
    if (!t) continue;
    std::vector<float> v = f32_values(*t);
    if (arch == "gemma" && name.ends_with("norm.weight"))
      for (float& x : v) x += 1.0f;
    if (arch == "llama" && (name.ends_with(".attn_q.weight") || name.ends_with(".attn_k.weight")))
      v = permute_qk(v, t->shape[0], t->shape[1], hp.head_dim);
    w.tensor(name, t->shape, v);
    ++n;
  }
  if (const HfRope r = read_hf_rope(c); arch == "llama" && r.type == "llama3" && !drop_rope_freqs) {
    const std::vector<float> f = llama3_rope_factors(r, hp.head_dim);
    w.tensor("rope_freqs.weight", {static_cast<int64_t>(f.size())}, f);
  }
  EXPECT_GE(n, (arch == "phi3" ? 6 : 9) * static_cast<int>(hp.n_layer));
  return w.bytes();
}

TEST(E2EGgufFamilies, ConvertedHfFixturesMatchTransformers) {
  const std::string root = std::string(MK_SHARED_DIR) + "/fixtures/hf/";
  const auto tmp = std::filesystem::temp_directory_path() / ("mk_gguf_families_" + std::to_string(getpid()));
  std::filesystem::create_directories(tmp);
  for (const auto& [fixture, arch] : std::vector<std::pair<std::string, std::string>>{
           {"qwen2_bias_float32", "qwen2"},
           {"qwen3_qknorm_float32", "qwen3"},
           {"gemma_float32", "gemma"},
           {"phi3_float32", "phi3"}}) {
    const std::string path = (tmp / (arch + ".gguf")).string();
    std::ofstream(path, std::ios::binary) << convert(root + fixture, arch);
    std::ifstream in(root + fixture + "/reference.json");
    const auto ref = nlohmann::json::parse(in);
    SessionOptions so;
    so.model_path = path;
    so.backend = "reference";
    so.need_tokenizer = false;
    Session s(so);
    EXPECT_EQ(s.model.get_str("general.architecture"), arch);
    const auto ids = ref["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<float> logits = s.eval(ids);
    const std::vector<float> last(logits.end() - s.hparams.n_vocab, logits.end());
    EXPECT_LT(test::rel_l2(last, ref["logits_last"].get<std::vector<double>>()), 1e-4) << fixture;
  }
  std::filesystem::remove_all(tmp);
}

// Llama 3.1-style RoPE scaling reaches GGUF files as rope_freqs.weight (llama.cpp's converter
// writes no scaling keys for it): the frequencies divided by those factors give transformers'
// logits; the same file without the tensor does not.
TEST(E2EGgufFamilies, Llama3RopeFreqsMatchTransformers) {
  const std::string dir = std::string(MK_SHARED_DIR) + "/fixtures/hf/llama3_scaled_tied_float32";
  const auto tmp = std::filesystem::temp_directory_path() / ("mk_gguf_rope_freqs_" + std::to_string(getpid()));
  std::filesystem::create_directories(tmp);
  std::ifstream in(dir + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  const auto ids = ref["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = ref["logits_last"].get<std::vector<double>>();
  double err[2] = {0, 0};
  for (int drop = 0; drop < 2; ++drop) {
    const std::string path = (tmp / (drop ? "plain.gguf" : "llama3.gguf")).string();
    std::ofstream(path, std::ios::binary) << convert(dir, "llama", drop == 1);
    for (const char* backend : {"reference", "cpu"}) {
      SessionOptions so;
      so.model_path = path;
      so.backend = backend;
      so.need_tokenizer = false;
      Session s(so);
      EXPECT_EQ(s.model.find("rope_freqs.weight") != nullptr, drop == 0);
      const std::vector<float> logits = s.eval(ids);
      const std::vector<float> last(logits.end() - s.hparams.n_vocab, logits.end());
      err[drop] = std::max(err[drop], test::rel_l2(last, want));
    }
  }
  EXPECT_LT(err[0], 1e-4);
  EXPECT_GT(err[1], 1e-2);  // measured 0.4: the factors matter at these positions
  // Over 200 positions too, the GGUF with rope_freqs equals the HF directory (llama3 rope_parameters)
  // and the GGUF without it does not.
  std::vector<int32_t> long_ids;
  for (int32_t i = 0; i < 200; ++i) long_ids.push_back((i * 37 + 11) % 512);
  auto last_logits = [&](const std::string& path) {
    SessionOptions so;
    so.model_path = path;
    so.backend = "cpu";
    so.need_tokenizer = false;
    so.n_ctx = 256;
    Session s(so);
    const std::vector<float> l = s.eval(long_ids);
    return std::vector<float>(l.end() - s.hparams.n_vocab, l.end());
  };
  const std::vector<float> hf = last_logits(dir);
  EXPECT_LT(test::rel_l2(last_logits((tmp / "llama3.gguf").string()), hf), 1e-5);
  EXPECT_GT(test::rel_l2(last_logits((tmp / "plain.gguf").string()), hf), 1e-2);
  RecordProperty("short_prompt_err_without_rope_freqs", std::to_string(err[1]));
  std::filesystem::remove_all(tmp);
}

TEST(E2EGgufFamilies, MissingFamilyTensorsAreNamed) {
  const std::string root = std::string(MK_SHARED_DIR) + "/fixtures/hf/";
  const auto tmp = std::filesystem::temp_directory_path() / ("mk_gguf_families2_" + std::to_string(getpid()));
  std::filesystem::create_directories(tmp);
  // A llama-layout file (no q/k norms) declared as qwen3.
  const std::string path = (tmp / "bad.gguf").string();
  std::ofstream(path, std::ios::binary) << convert(root + "llama_gqa_float32", "qwen3");
  SessionOptions so;
  so.model_path = path;
  so.backend = "reference";
  so.need_tokenizer = false;
  try {
    Session s(so);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor blk.0.attn_q_norm.weight"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace mk
