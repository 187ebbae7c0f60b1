// Token sampling from a logits row: greedy (temperature 0), or temperature + top-k + top-p
// (nucleus, Holtzman et al. 2019) + min-p (Nguyen et al. 2024) with a seeded generator, so a seed
// reproduces a run exactly. Repetition penalties first change the logits of the tokens seen in a
// window of the last penalty_last_n tokens (the prompt's and the generated ones, given by accept()).
// Order: logit biases and penalties (llama.cpp's sampler chain), then as Hugging Face's logits
// processors: temperature, top-k, top-p, min-p, draw.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mk {

struct SamplerOptions {
  float temperature = 0.8f;  // 0 = greedy argmax
  int top_k = 40;            // 0 = off
  float top_p = 0.95f;       // 1 = off
  uint64_t seed = 42;
  // Keeps the tokens whose probability (after temperature) is at least min_p x the most likely one's;
  // 0 = off, at most 1.
  float min_p = 0.0f;
  // llama.cpp's repeat penalty (CTRL, Keskar et al. 2019): the logit l of a token in the window
  // becomes l / repeat_penalty when l > 0, else l * repeat_penalty; 1 = off, > 0.
  float repeat_penalty = 1.0f;
  // OpenAI's penalties: l -= frequency_penalty x (occurrences in the window) + presence_penalty x
  // (1 if it occurs); 0 = off, each in [-2, 2].
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int penalty_last_n = 64;  // the window: the last n tokens; -1 = every token accepted; 0 = no penalties
  // OpenAI's logit_bias: (token id, bias) pairs, each bias in [-100, 100] added to the token's logit
  // before the penalties (-100 all but bans it). Ids must be in the vocabulary (the caller checks;
  // ids outside the row are ignored); a repeated id adds up.
  std::vector<std::pair<int32_t, float>> logit_bias{};
};

class Sampler {
 public:
  // Throws mk::Error naming an option outside its range.
  explicit Sampler(SamplerOptions o);
  // Adds a token to the penalty window (each prompt token, then each generated one).
  void accept(int32_t token);
  // Whether a penalty is on.
  bool penalizes() const;
  // Whether a penalty or a logit bias changes the row: then the choice needs the whole row
  // (covered_by is false, and greedy decoding takes the argmax of the changed row).
  bool changes_row() const { return penalizes() || !o_.logit_bias.empty(); }
  // Whether the token is the argmax of the model's own row (temperature 0, no penalty, no bias),
  // which the backend's greedy op (forward_greedy, decode_greedy) picks where the logits are.
  bool decides_by_argmax() const { return o_.temperature == 0 && !changes_row(); }
  // Throws mk::Error when a logit is NaN or infinite (see check_finite_logits): such a row has no
  // meaningful distribution, and which token "wins" would depend on where the bad value sits.
  int32_t sample(std::span<const float> logits);
  // The same over the tokens with allowed[id] != 0 only (constrained decoding: runtime/json_prefix.h),
  // after the biases and penalties; the others are as if their logit were -inf. Throws mk::Error
  // when none is allowed.
  int32_t sample(std::span<const float> logits, std::span<const uint8_t> allowed);
  // Whether sample_top can decide from a row's first n_candidates in by-logit order (the backend's
  // `topk` op, backend/step_batch.h TopKRow): greedy, or top_k in [1, n_candidates] (or a vocabulary
  // of at most n_candidates tokens). top_k = 0 needs the whole row, and so do penalties and biases.
  bool covered_by(int64_t n_candidates, int64_t n_vocab) const;
  // The token sample() gives for the full row, from its best candidates: ids/logits sorted by logit
  // descending, ties to the lower id (what sample() sorts by), finite (the caller refuses rows with
  // non-finite values first). Draws the same random numbers as sample(), so a seed gives the same
  // tokens either way. Throws mk::Error when covered_by(ids.size(), n_vocab) is false.
  int32_t sample_top(std::span<const int32_t> ids, std::span<const float> logits, int64_t n_vocab);

 private:
  // Temperature, top-p, min-p and the draw over the top-k candidates (sorted, k >= 1).
  int32_t pick(std::span<const int32_t> ids, std::span<const float> logits);
  // Temperature, top-k, top-p, min-p and the draw over a whole (finite) row.
  int32_t sample_unpenalized(std::span<const float> logits);
  // No top-k cut (top_k 0 or >= the row), O(n): weights exp((l - max) / T); top_p < 1 keeps the
  // shortest prefix of the by-logit order (ties to the lower id) whose weight reaches top_p of the
  // sum; the draw walks the kept tokens in id order. A function of the row (sample_top scatters the
  // candidates of a small vocabulary back into a row first).
  int32_t sample_row(std::span<const float> logits);
  SamplerOptions o_;
  std::mt19937_64 rng_;
  std::deque<int32_t> window_;                // the last penalty_last_n accepted tokens
  std::unordered_map<int32_t, int> counts_;  // occurrences in window_
};

// A row's log-probabilities: the log-softmax of the logits as the model gives them (no temperature,
// penalty or top-k/top-p cut; vLLM's "raw logprobs", llama-cpp-python's logprobs). The row must be
// finite (check_finite_logits first).
struct RowLogprobs {
  double log_sum = 0;                          // log(sum_i exp(logits[i])), summed in double
  std::vector<std::pair<int32_t, double>> top;  // the n_top most likely (id, logprob), by logit descending,
                                                // ties to the lower id
  double logprob(float logit) const { return logit - log_sum; }
};
RowLogprobs row_logprobs(std::span<const float> logits, int n_top);

// Most alternatives a caller may ask for per generated token; OpenAI's chat API allows 20.
constexpr int kMaxTopLogprobs = 20;

// One token with its log-probability (RowLogprobs) and its bytes in context (Tokenizer::token_bytes
// after the token before it; empty without a tokenizer; may be part of a UTF-8 character).
struct TokenLogprob {
  int32_t id = -1;
  double logprob = 0;
  std::string bytes;
};
struct GeneratedLogprob {
  TokenLogprob token;             // the generated token
  std::vector<TokenLogprob> top;  // the n_top most likely tokens at its position, as RowLogprobs::top
};
// The entry of token `id` chosen from the finite row `logits`; `bytes_of` (may be empty) gives a
// token's bytes in context.
GeneratedLogprob generated_logprob(std::span<const float> logits, int32_t id, int n_top,
                                   const std::function<std::string(int32_t)>& bytes_of = {});

// Throws mk::Error "token 70000 is outside the vocabulary [0, 49152)" for a biased id
// past the vocabulary (Sampler checks the rest: ids >= 0, biases in [-100, 100]).
void check_logit_bias(const SamplerOptions& o, int64_t n_vocab);

// Index of the largest value; ties go to the lowest index. NaN values never win, wherever they sit;
// -1 when every value is NaN. (Diagnostics only: generation refuses non-finite rows first.)
int32_t argmax(std::span<const float> v);

// Throws mk::Error "logits are not finite at <where>: token 7 is nan (3 of 512 values are not
// finite)" when any value is NaN or +-inf. `where` names the step and position for the user.
void check_finite_logits(std::span<const float> logits, const std::string& where);
// The same error from a count the backend made where the logits are (GreedyRow, TopKRow): n_bad
// non-finite values of n_vocab, the first at index `first` with value `value`. No-op when n_bad == 0.
void check_finite_count(int64_t n_bad, int64_t first, float value, int64_t n_vocab, const std::string& where);

}  // namespace mk
