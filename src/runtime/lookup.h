// Prompt lookup decoding (A. Saxena, "Prompt Lookup Decoding", 2023; vLLM's ngram speculator,
// llama.cpp's lookup): draft tokens are what followed the latest earlier occurrence of the text's
// last n-gram; the model checks them all in one step (a step of k + 1 rows costs little more than
// one row while decoding is memory-bound) and keeps the longest prefix it would have chosen itself,
// so greedy output is unchanged. Pays where replies repeat their input (summaries, code edits,
// extraction, JSON of given fields).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace mk {

// The n-grams `run --draft` and `serve --draft` match: 2 to 4 tokens (a lone token recurs everywhere
// in prose, and its drafts were nearly all refused: SmolLM2 writing a story, 4 of 235).
inline constexpr int kLookupMinNgram = 2, kLookupMaxNgram = 4;

// The draft after `history` (prompt + generated, its last token the one about to be fed): for n from
// max_ngram down to min_ngram, the tokens (at most max_draft) that followed the latest earlier
// occurrence of history's last n tokens; empty when none recurs or max_draft < 1.
std::vector<int32_t> lookup_draft(std::span<const int32_t> history, int min_ngram, int max_ngram, int max_draft);

}  // namespace mk
