#include "archs/registry.h"

#include <fmt/ranges.h>

#include "archs/hf_common.h"
#include "model/hf.h"
#include "support/printable.h"

namespace mk {

namespace {
struct ArchEntry {
  const char* format;  // model file format the entry reads ("gguf" covers llama2c's synthesised keys)
  const char* arch;    // general.architecture
  Hparams (*hparams)(const ModelFile&);
  Graph (*build)(const ModelFile&, const BuildOptions&);
};

const ArchEntry kArchs[] = {
    {"gguf", "llama", read_gguf_llama_hparams, build_gguf_llama},
    {"gguf", "qwen2", read_gguf_llama_hparams, build_gguf_qwen2},
    {"gguf", "qwen3", read_gguf_llama_hparams, build_gguf_qwen3},
    {"gguf", "qwen3moe", read_gguf_llama_hparams, build_gguf_qwen3moe},
    {"gguf", "gemma", read_gguf_llama_hparams, build_gguf_gemma},
    {"gguf", "phi3", read_gguf_llama_hparams, build_gguf_phi3},
    {"gguf", "gemma2", read_gguf_llama_hparams, build_gguf_gemma2},
    {"gguf", "gemma3", read_gguf_llama_hparams, build_gguf_gemma3},
    {"gguf", "gpt2", read_gguf_gpt2_hparams, build_gguf_gpt2},
    {"gguf", "smollm3", read_gguf_llama_hparams, build_gguf_smollm3},
    {"gguf", "granite", read_gguf_llama_hparams, build_gguf_granite},
    {"gguf", "granitemoe", read_gguf_llama_hparams, build_gguf_granitemoe},
    {"gguf", "olmo2", read_gguf_llama_hparams, build_gguf_olmo2},
    {"gguf", "olmoe", read_gguf_llama_hparams, build_gguf_olmoe},
    {"gguf", "starcoder2", read_gguf_layer_norm_hparams, build_gguf_starcoder2},
    {"gguf", "stablelm", read_gguf_layer_norm_hparams, build_gguf_stablelm},
    {"gguf", "phi2", read_gguf_layer_norm_hparams, build_gguf_phi2},
    {"hf", "llama", read_hf_hparams, build_hf_llama},
    {"hf", "mistral", read_hf_hparams, build_hf_llama},
    {"hf", "qwen2", read_hf_hparams, build_hf_qwen2},
    {"hf", "qwen3", read_hf_hparams, build_hf_qwen3},
    {"hf", "qwen3_moe", read_hf_hparams, build_hf_qwen3moe},
    {"hf", "mixtral", read_hf_hparams, build_hf_mixtral},
    {"hf", "gemma", read_hf_hparams, build_hf_gemma},
    {"hf", "phi3", read_hf_hparams, build_hf_phi3},
    {"hf", "gemma2", read_hf_hparams, build_hf_gemma2},
    {"hf", "gemma3_text", read_hf_hparams, build_hf_gemma3},
    {"hf", "gpt2", read_hf_hparams, build_hf_gpt2},
    {"hf", "smollm3", read_hf_hparams, build_hf_smollm3},
    {"hf", "granite", read_hf_hparams, build_hf_granite},
    {"hf", "olmo2", read_hf_hparams, build_hf_olmo2},
    {"hf", "olmoe", read_hf_hparams, build_hf_olmoe},
    {"hf", "starcoder2", read_hf_hparams, build_hf_starcoder2},
    {"hf", "stablelm", read_hf_hparams, build_hf_stablelm},
    {"hf", "phi", read_hf_hparams, build_hf_phi2},
};

const ArchEntry& find_arch(const ModelFile& m) {
  std::string fmt_name = m.format == "llama2c" ? "gguf" : m.format;
  std::string arch = m.get_str("general.architecture");
  for (const auto& e : kArchs)
    if (fmt_name == e.format && arch == e.arch) return e;
  fail("{}: unsupported architecture '{}' ({} file); supported: {}", m.path, printable(arch), m.format,
       fmt::join(supported_architectures(), ", "));
}
}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> r;
  for (const auto& e : kArchs) r.push_back(std::string(e.format) + ":" + e.arch);
  return r;
}

// An HF model's config.json errors name its directory (naming_hf_config).
Hparams read_hparams(const ModelFile& model) {
  if (model.format != "hf") return find_arch(model).hparams(model);
  return naming_hf_config(model.path, [&] { return find_arch(model).hparams(model); });
}
Graph build_graph(const ModelFile& model, const BuildOptions& options) {
  if (model.format != "hf") return find_arch(model).build(model, options);
  return naming_hf_config(model.path, [&] { return find_arch(model).build(model, options); });
}

}  // namespace mk
