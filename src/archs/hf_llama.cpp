// Llama and Mistral checkpoints in the transformers layout (LlamaForCausalLM, MistralForCausalLM).
// Source: transformers modeling_llama.py / modeling_mistral.py: RMSNorm, SiLU-gated MLP, RoPE with
// rotate_half (optionally llama3/linear scaled), optional attention biases (attention_bias).
// Mistral differs only by its sliding window, every layer windowed by hf_llama_spec.
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

// transformers' LlamaConfig and MistralConfig default tie_word_embeddings to false.
Graph build_hf_llama(const ModelFile& m, const BuildOptions& o) { return build_decoder(m, hf_llama_spec(m, o, false)); }

}  // namespace mk
