// Shared pieces of the GGUF family descriptions (llama.cpp, qwen2.cpp, qwen3.cpp, gemma.cpp):
// hyperparameters from `<arch>.*` keys (llama.cpp's key names) and a DecoderSpec over GGUF tensor
// names, which are the canonical names build_decoder reads, so no name mapping is needed.
#pragma once
#include <initializer_list>

#include "archs/blocks.h"

namespace mk {

// RMSNorm, SiLU-gated FFN, RoPE over `<arch>.rope.dimension_count` dims with
// `<arch>.rope.freq_base`; `rope_mode` "adjacent" for the llama layout (the converter permutes
// q/k so that pairs are adjacent) or "halves" (llama.cpp's NEOX RoPE: qwen2, qwen3, gemma, phi3).
// The classifier is output.weight, or the token embedding when the file has none (tied).
// rope_freqs.weight (Llama 3 scaling as llama.cpp converts it) divides the frequencies per pair;
// `<arch>.rope.scaling.attn_factor` becomes DecoderSpec::rope_attn_factor.
DecoderSpec gguf_decoder_spec(const ModelFile& m, const BuildOptions& o, const char* rope_mode);

// Mixture of experts from `<arch>.expert_count` (0 or absent: none), `.expert_used_count` and
// `.expert_feed_forward_length` (default: feed_forward_length) into s (DecoderSpec::n_expert ..),
// with moe_norm = norm (llama.cpp's norm_w for the family). Errors name the key.
void gguf_read_moe(const ModelFile& m, DecoderSpec& s, bool norm);

// The factors of an f32[n_rot / 2] tensor (rope_freqs.weight, rope_factors_long/short.weight);
// throws mk::Error naming the tensor when it is absent, of another type or shape, or not positive.
std::vector<double> gguf_rope_factors(const ModelFile& m, const std::string& name, int64_t n_rot);

// Every layer must carry blk.N.<name> for each name (e.g. "attn_q.bias"): a file that lost them
// fails to load instead of computing something else. Throws mk::Error naming the first missing one.
void gguf_require_per_layer(const ModelFile& m, const DecoderSpec& s, std::initializer_list<const char*> names);
// Every layer's q/k/v biases: attn_qkv.bias where the file fuses them (add_gguf_qkv_views), else
// attn_q/attn_k/attn_v.bias; the error names the tensor the file lacks.
void gguf_require_qkv_bias(const ModelFile& m, const DecoderSpec& s);

}  // namespace mk
