// Llama and Mistral checkpoints in the transformers layout (LlamaForCausalLM, MistralForCausalLM).
// Source: transformers modeling_llama.py / modeling_mistral.py: RMSNorm, SiLU-gated MLP, RoPE with
// rotate_half (optionally llama3/linear scaled), optional attention biases (attention_bias).
// Mistral differs only by its sliding window, every layer windowed by hf_llama_spec.
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

// transformers' LlamaConfig and MistralConfig default tie_word_embeddings to false.
Graph build_hf_llama(const ModelFile& m, const BuildOptions& o) { return build_decoder(m, hf_llama_spec(m, o, false)); }

// Mixtral (MixtralForCausalLM): Mistral with every layer's MLP a mixture of experts
// (block_sparse_moe: softmax router, top num_experts_per_tok renormalised; transformers modeling_mixtral.py).
Graph build_hf_mixtral(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, false);
  hf_moe(m, s, HfMoe::mixtral);
  return build_decoder(m, s);
}

}  // namespace mk
