// The table of architecture descriptions; each family file defines its builder, registry.cpp lists them.
#pragma once
#include "archs/blocks.h"
#include "support/error.h"

namespace mk {

Hparams read_gguf_llama_hparams(const ModelFile& m);
// The same with the norm's epsilon from `<arch>.attention.layer_norm_epsilon` (LayerNorm families:
// gpt2, phi2, starcoder2).
Hparams read_gguf_layer_norm_hparams(const ModelFile& m);
Graph build_gguf_llama(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_qwen2(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_qwen3(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_qwen3moe(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_gemma(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_phi3(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_gemma2(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_gemma3(const ModelFile& m, const BuildOptions& o);
Hparams read_gguf_gpt2_hparams(const ModelFile& m);  // layer_norm_epsilon in place of the RMS one
Graph build_gguf_gpt2(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_smollm3(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_granite(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_granitemoe(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_olmo2(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_olmoe(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_starcoder2(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_stablelm(const ModelFile& m, const BuildOptions& o);
Graph build_gguf_phi2(const ModelFile& m, const BuildOptions& o);

// Hugging Face directories (hparams: read_hf_hparams in hf_common.h serves them all).
Graph build_hf_llama(const ModelFile& m, const BuildOptions& o);  // llama, mistral
Graph build_hf_qwen2(const ModelFile& m, const BuildOptions& o);
Graph build_hf_qwen3(const ModelFile& m, const BuildOptions& o);
Graph build_hf_qwen3moe(const ModelFile& m, const BuildOptions& o);
Graph build_hf_mixtral(const ModelFile& m, const BuildOptions& o);
Graph build_hf_gemma(const ModelFile& m, const BuildOptions& o);
Graph build_hf_phi3(const ModelFile& m, const BuildOptions& o);
Graph build_hf_gemma2(const ModelFile& m, const BuildOptions& o);
Graph build_hf_gemma3(const ModelFile& m, const BuildOptions& o);  // gemma3_text
Graph build_hf_gpt2(const ModelFile& m, const BuildOptions& o);
Graph build_hf_smollm3(const ModelFile& m, const BuildOptions& o);
Graph build_hf_granite(const ModelFile& m, const BuildOptions& o);
Graph build_hf_olmo2(const ModelFile& m, const BuildOptions& o);
Graph build_hf_olmoe(const ModelFile& m, const BuildOptions& o);
Graph build_hf_starcoder2(const ModelFile& m, const BuildOptions& o);
Graph build_hf_stablelm(const ModelFile& m, const BuildOptions& o);
Graph build_hf_phi2(const ModelFile& m, const BuildOptions& o);  // model_type phi

}  // namespace mk
