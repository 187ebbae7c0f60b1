// One checked reader of hyperparameters for every loader (GGUF, llama2.c, Hugging Face config.json,
// the family descriptions and the decoder builder).
//
// Each glossary term has a range: positive (or >= 0 where 0 means "off") and bounded far above
// any real model, so that every product the loaders and builders form from them (n_head * head_dim,
// n_vocab * n_embd, n_ctx * n_head_kv * head_dim * n_layer * 4 bytes, ...) fits in int64_t. A value
// outside its range throws mk::Error naming where it came from ("config.json: head_dim",
// "stories.gguf: llama.context_length") and the range, before it is used in any arithmetic.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace mk {

struct HparamRange {
  int64_t min, max;
};

// The range of a glossary term: n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim,
// n_ctx (n_ctx_train), n_rot, sliding_window (0 = none), n_expert (0 = none), n_expert_used. Unknown terms are
// an internal error.
HparamRange hparam_range(std::string_view term);

// `value` when inside the range of `term`; else throws mk::Error "<where> = <value> must be
// positive (<term>)" or "<where> = <value> exceeds the limit <max> (<term>)".
int64_t checked_hparam(std::string_view term, int64_t value, std::string_view where);

// a * b (a, b >= 0) or mk::Error "<where>: <a> x <b> overflows".
int64_t checked_mul(int64_t a, int64_t b, std::string_view where);

}  // namespace mk
