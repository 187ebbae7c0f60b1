// load_model: picks the loader from what is at `path` (a directory: Hugging Face; a GGUF file by its magic; or
// otherwise a llama2.c checkpoint, whose loader rejects anything that is not one).
#include <cstring>
#include <filesystem>
#include <system_error>

#include "model/model_file.h"
#include "support/error.h"

namespace mk {

ModelFile load_model(const std::string& path) {
  if (path.empty()) fail("the model path is empty (-m PATH)");
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) fail("{}: no such file or directory", path);
  if (ec) fail("{}: cannot access: {}", path, ec.message());
  if (std::filesystem::is_directory(status)) return load_hf_dir(path);
  auto file = MappedFile::open(path);
  if (file->size() >= 4 && std::memcmp(file->data(), "GGUF", 4) == 0) {
    ModelFile m = load_gguf(std::move(file));
    add_gguf_views(m);
    return m;
  }
  try {
    return load_llama2c(std::move(file));
  } catch (const Error& e) {
    // (the llama2.c reader names the path too: said once)
    std::string_view why = e.what();
    if (why.starts_with(path + ": ")) why.remove_prefix(path.size() + 2);
    fail("{}: not a GGUF file (no GGUF magic), a Hugging Face directory, or a valid llama2.c checkpoint: {}", path, why);
  }
}

void add_gguf_views(ModelFile& m) {
  const std::string arch = m.has("general.architecture") ? m.get_str("general.architecture") : "";
  if (arch == "phi3") add_gguf_phi3_views(m);
  if (arch == "gpt2" || arch == "phi2") add_gguf_qkv_views(m, arch);
}

// llama.cpp's phi3 GGUF keeps Phi-3's fused projections: blk.N.attn_qkv.weight ([q; k; v] rows)
// and blk.N.ffn_up.weight with 2 * n_ff rows ([gate; up], llama.cpp's swiglu split). Their parts
// become row views: blk.N.attn_q/attn_k/attn_v.weight, blk.N.ffn_gate.weight and
// blk.N.ffn_up_half.weight (the phi3 family reads ffn_up from there).
void add_gguf_phi3_views(ModelFile& m) {
  const int64_t n_embd = m.get_int("phi3.embedding_length"), n_head = m.get_int("phi3.attention.head_count");
  const int64_t n_head_kv = m.get_int("phi3.attention.head_count_kv", n_head), n_ff = m.get_int("phi3.feed_forward_length");
  if (n_head <= 0 || n_embd % n_head != 0 || n_ff <= 0)
    fail("{}: phi3 hyperparameters: embedding_length {} is not a multiple of head_count {} (or feed_forward_length {})",
         m.path, n_embd, n_head, n_ff);
  const int64_t head_dim = n_embd / n_head, q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim;
  for (int il = 0;; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    if (const WeightTensor* qkv_p = m.find(p + "attn_qkv.weight")) {
      const WeightTensor qkv = m.get(qkv_p->name, {q_dim + 2 * kv_dim, n_embd});  // a copy: add_tensor may move it
      m.add_tensor(row_view(qkv, 0, q_dim, p + "attn_q.weight"));
      m.add_tensor(row_view(qkv, q_dim, kv_dim, p + "attn_k.weight"));
      m.add_tensor(row_view(qkv, q_dim + kv_dim, kv_dim, p + "attn_v.weight"));
    } else if (!m.find(p + "attn_q.weight")) {
      break;
    }
    if (const WeightTensor* up = m.find(p + "ffn_up.weight"); up && !m.find(p + "ffn_gate.weight")) {
      const WeightTensor gu = m.get(up->name, {2 * n_ff, n_embd});
      m.add_tensor(row_view(gu, 0, n_ff, p + "ffn_gate.weight"));
      m.add_tensor(row_view(gu, n_ff, n_ff, p + "ffn_up_half.weight"));
    }
  }
}

// llama.cpp's gpt2 and phi2 GGUFs may keep a fused projection: blk.N.attn_qkv.weight ([q; k; v]
// rows: n_head and n_head_kv heads of head_dim) and blk.N.attn_qkv.bias; their parts become views
// blk.N.attn_q/attn_k/attn_v.{weight,bias}.
void add_gguf_qkv_views(ModelFile& m, const std::string& arch) {
  const int64_t n_embd = m.get_int(arch + ".embedding_length"), n_head = m.get_int(arch + ".attention.head_count");
  const int64_t n_head_kv = m.get_int(arch + ".attention.head_count_kv", n_head);
  if (n_embd <= 0 || n_head <= 0 || n_head_kv <= 0 || n_embd % n_head != 0)
    fail("{}: {} hyperparameters: embedding_length {} must be a positive multiple of head_count {} (head_count_kv {})",
         m.path, arch, n_embd, n_head, n_head_kv);
  const int64_t head_dim = m.get_int(arch + ".attention.key_length", n_embd / n_head);
  const int64_t q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim;
  for (int il = 0;; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    const WeightTensor* w = m.find(p + "attn_qkv.weight");
    if (!w) {
      if (m.find(p + "attn_q.weight")) continue;  // this layer's projections are separate
      break;
    }
    const WeightTensor qkv = m.get(w->name, {q_dim + 2 * kv_dim, n_embd});  // a copy: add_tensor may move it
    const int64_t from[] = {0, q_dim, q_dim + kv_dim}, rows[] = {q_dim, kv_dim, kv_dim};
    const char* parts[] = {"attn_q", "attn_k", "attn_v"};
    for (int k = 0; k < 3; ++k) m.add_tensor(row_view(qkv, from[k], rows[k], p + parts[k] + ".weight"));
    if (const WeightTensor* b = m.find(p + "attn_qkv.bias")) {
      const WeightTensor bias = m.get(b->name, {q_dim + 2 * kv_dim});
      for (int k = 0; k < 3; ++k) m.add_tensor(row_view(bias, from[k], rows[k], p + parts[k] + ".bias"));
    }
  }
}

ModelFile load_model_vocab(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_hf_dir(path, /*with_weights=*/false);
  {
    auto file = MappedFile::open(path);
    if (file->size() < 4 || std::memcmp(file->data(), "GGUF", 4) != 0)
      fail("{}: not a GGUF file or a Hugging Face directory; only those carry a vocabulary", path);
  }
  return load_gguf_metadata(path);
}

}  // namespace mk
