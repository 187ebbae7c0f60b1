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

// When and how much a sequence drafts: after a draft the model refused whole, the next 1, 2, 4, ...
// (at most 32) steps draft nothing, and an accepted token starts over; a draft is at most 2 + twice
// the tokens the previous one had accepted. Where the text's n-grams recur with other continuations
// (counting, lists of numbers) refused drafts' rows cost more than they save; where the reply copies,
// drafts stay long. Changes when and how long drafts are, never the tokens.
class DraftBackoff {
 public:
  // The longest draft this step (0: none), of at most `max_draft`.
  int limit(int max_draft) {
    if (skip_ > 0) {
      --skip_;
      return 0;
    }
    return max_draft < cap_ ? max_draft : cap_;
  }
  void record(int64_t drafted, int64_t accepted) {
    if (drafted == 0) return;
    cap_ = static_cast<int>(2 + 2 * accepted);
    if (accepted > 0) {
      next_ = 1;
    } else {
      skip_ = next_;
      next_ = next_ < 32 ? next_ * 2 : 32;
    }
  }

 private:
  int skip_ = 0, next_ = 1, cap_ = 1 << 30;
};

}  // namespace mk
