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
DecoderSpec gguf_decoder_spec(const ModelFile& m, const BuildOptions& o, const char* rope_mode);

// Every layer must carry blk.N.<name> for each name (e.g. "attn_q.bias"): a file that lost them
// fails to load instead of computing something else. Throws mk::Error naming the first missing one.
void gguf_require_per_layer(const ModelFile& m, const DecoderSpec& s, std::initializer_list<const char*> names);

}  // namespace mk
