// GGUF files of the qwen2, qwen3, gemma and phi3 families, converted here from the Hugging Face fixtures
// the way llama.cpp's convert_hf_to_gguf.py writes them (GGUF tensor names, ne[] reversed, q/k not
// permuted for these NEOX-RoPE families, Gemma's norm weights stored as 1 + w), give the logits
// that transformers computed (reference.json). Phi-3 keeps its fused attn_qkv and ffn_up ([gate; up]).
#include <gtest/gtest.h>

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

// HF fixture directory -> GGUF bytes of architecture `arch`.
std::string convert(const std::string& dir, const std::string& arch) {
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
    w.tensor(name, t->shape, v);
    ++n;
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
