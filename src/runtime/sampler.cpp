#include "runtime/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/step_batch.h"
#include "support/error.h"

namespace mk {

int32_t argmax(std::span<const float> v) {
  MK_CHECK(!v.empty());
  int64_t best = -1;
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isnan(v[i]) && (best < 0 || v[i] > v[static_cast<size_t>(best)])) best = static_cast<int64_t>(i);
  return static_cast<int32_t>(best);
}

void check_finite_logits(std::span<const float> logits, const std::string& where) {
  size_t n_bad = 0, first = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]) && n_bad++ == 0) first = i;
  if (n_bad)
    fail("logits are not finite at {}: token {} is {} ({} of {} values are not finite); the model's weights or "
         "activations overflowed or hold NaN",
         where, first, logits[first], n_bad, logits.size());
}

void check_finite_count(int64_t n_bad, int64_t first, float value, int64_t n_vocab, const std::string& where) {
  if (n_bad)
    fail("logits are not finite at {}: token {} is {} ({} of {} values are not finite); the model's weights or "
         "activations overflowed or hold NaN",
         where, first, value, n_bad, n_vocab);
}

Sampler::Sampler(SamplerOptions o) : o_(o), rng_(o.seed) {
  if (!(o_.temperature >= 0)) fail("temperature must be >= 0, got {}", o_.temperature);
  if (o_.top_k < 0) fail("top-k must be >= 0, got {}", o_.top_k);
  if (!(o_.top_p > 0 && o_.top_p <= 1)) fail("top-p must be in (0, 1], got {}", o_.top_p);
  if (!(o_.min_p >= 0 && o_.min_p <= 1)) fail("min-p must be in [0, 1], got {}", o_.min_p);
  if (!(o_.repeat_penalty > 0) || !std::isfinite(o_.repeat_penalty))
    fail("repeat penalty must be a finite number > 0 (1 = off), got {}", o_.repeat_penalty);
  if (!(o_.presence_penalty >= -2 && o_.presence_penalty <= 2))
    fail("presence penalty must be in [-2, 2], got {}", o_.presence_penalty);
  if (!(o_.frequency_penalty >= -2 && o_.frequency_penalty <= 2))
    fail("frequency penalty must be in [-2, 2], got {}", o_.frequency_penalty);
  if (o_.penalty_last_n < -1) fail("the penalty window must be -1 (all), 0 (off) or more tokens, got {}", o_.penalty_last_n);
  for (const auto& [id, bias] : o_.logit_bias) {
    if (id < 0) fail("logit bias: token id {} is negative", id);
    if (!(bias >= -100 && bias <= 100)) fail("logit bias of token {} must be in [-100, 100], got {}", id, bias);
  }
}

void check_logit_bias(const SamplerOptions& o, int64_t n_vocab) {
  for (const auto& [id, bias] : o.logit_bias)
    if (id < 0 || id >= n_vocab) fail("token {} is outside the vocabulary [0, {})", id, n_vocab);
}

bool Sampler::penalizes() const {
  return o_.penalty_last_n != 0 && (o_.repeat_penalty != 1 || o_.presence_penalty != 0 || o_.frequency_penalty != 0);
}

void Sampler::accept(int32_t token) {
  if (!penalizes()) return;
  window_.push_back(token);
  ++counts_[token];
  if (o_.penalty_last_n > 0 && window_.size() > static_cast<size_t>(o_.penalty_last_n)) {
    const int32_t old = window_.front();
    window_.pop_front();
    if (--counts_[old] == 0) counts_.erase(old);
  }
}

int32_t Sampler::sample(std::span<const float> logits) { return sample(logits, {}); }

int32_t Sampler::sample(std::span<const float> logits, std::span<const uint8_t> allowed) {
  check_finite_logits(logits, "the row being sampled");
  if (allowed.empty() && o_.logit_bias.empty() && (!penalizes() || counts_.empty())) return sample_unpenalized(logits);
  // The changed row: only the biased tokens and the window's change (ids outside the row are ignored).
  std::vector<float> row(logits.begin(), logits.end());
  for (const auto& [id, bias] : o_.logit_bias)
    if (static_cast<size_t>(id) < row.size()) row[static_cast<size_t>(id)] += bias;
  for (const auto& [id, n] : counts_) {
    if (id < 0 || static_cast<size_t>(id) >= row.size()) continue;
    float& l = row[static_cast<size_t>(id)];
    l = l > 0 ? l / o_.repeat_penalty : l * o_.repeat_penalty;
    l -= static_cast<float>(n) * o_.frequency_penalty + o_.presence_penalty;
    // An extreme penalty (1e-30 divides a logit past the float range) saturates: the token is the
    // likeliest (or least likely) there is, not a broken row.
    l = std::clamp(l, -FLT_MAX, FLT_MAX);
  }
  if (!allowed.empty()) {
    MK_CHECK(allowed.size() == row.size());
    bool any = false;
    for (size_t i = 0; i < row.size(); ++i) {
      if (!allowed[i]) row[i] = -std::numeric_limits<float>::infinity();
      any |= allowed[i] != 0;
    }
    if (!any) fail("no token can continue the constrained output");
    const int32_t id = sample_unpenalized(row);
    // (a draw rounded past the last kept weight falls on the last candidate, which may be a masked one)
    return allowed[static_cast<size_t>(id)] ? id : argmax(row);
  }
  return sample_unpenalized(row);
}

int32_t Sampler::sample_unpenalized(std::span<const float> logits) {
  if (o_.temperature == 0) return argmax(logits);
  if (o_.top_k <= 0 || static_cast<size_t>(o_.top_k) >= logits.size()) return sample_row(logits);
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t k = static_cast<size_t>(o_.top_k);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), by_logit);
  idx.resize(k);
  std::vector<float> top(k);
  for (size_t i = 0; i < k; ++i) top[i] = logits[static_cast<size_t>(idx[i])];
  return pick(idx, top);
}

int32_t Sampler::sample_row(std::span<const float> logits) {
  // Without a top-k cut a full sort of the vocabulary cost 16-22 ms a row at 49152 tokens (38-70 ms
  // at 128256) on a 2-core Zen 1 VM (BM_Sampler), more than a SmolLM2 decode step. Here O(n): the
  // weights and their sum; the nucleus (top_p < 1) from a histogram of the logits,
  // sorting one bucket; the draw walks the kept tokens in id order.
  const size_t n = logits.size();
  const float mx = *std::max_element(logits.begin(), logits.end());
  const double inv_t = 1.0 / o_.temperature;
  std::vector<double> w(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (w[i] = std::exp((static_cast<double>(logits[i]) - mx) * inv_t));
  std::vector<uint8_t> kept;  // empty: every token
  double total = sum;
  if (o_.top_p < 1) {
    // The nucleus without sorting the row: the tokens in 4096 buckets of equal logit width from the
    // best down (a bucket holds a run of the by-logit order), the weight of each bucket; the bucket
    // where the running weight reaches top_p is the only one sorted.
    constexpr int kBuckets = 4096;
    const float mn = *std::min_element(logits.begin(), logits.end());
    const double scale = mx > mn ? kBuckets / (static_cast<double>(mx) - mn) : 0.0;
    std::vector<uint16_t> bucket(n);
    std::vector<double> bw(kBuckets, 0.0);
    for (size_t i = 0; i < n; ++i) {
      const double d = (static_cast<double>(mx) - logits[i]) * scale;  // NaN for -inf (a missing candidate)
      const int b = d < kBuckets - 1 ? static_cast<int>(d) : kBuckets - 1;
      bucket[i] = static_cast<uint16_t>(b);
      bw[static_cast<size_t>(b)] += w[i];
    }
    const double target = o_.top_p * sum;
    double above = 0;
    int cut = 0;
    while (cut < kBuckets - 1 && above + bw[static_cast<size_t>(cut)] < target) above += bw[static_cast<size_t>(cut++)];
    std::vector<int32_t> in_cut;
    for (size_t i = 0; i < n; ++i)
      if (bucket[i] == cut) in_cut.push_back(static_cast<int32_t>(i));
    std::sort(in_cut.begin(), in_cut.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    kept.assign(n, 0);
    for (size_t i = 0; i < n; ++i) kept[i] = bucket[i] < cut;
    for (int32_t id : in_cut) {  // the cut's bucket up to the token that reaches top_p
      kept[static_cast<size_t>(id)] = 1;
      if ((above += w[static_cast<size_t>(id)]) >= target) break;
    }
    total = 0;
    for (size_t i = 0; i < n; ++i)
      if (kept[i]) total += w[i];
  }
  if (o_.min_p > 0) {  // min-p: the weights are relative to the most likely token's (1)
    if (kept.empty()) kept.assign(n, 1);
    total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (w[i] < o_.min_p) kept[i] = 0;
      if (kept[i]) total += w[i];
    }
  }
  // Token i owns [c_i, c_i + w_i) of [0, total), the kept tokens in id order.
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double c = 0;
  size_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] == 0 || (!kept.empty() && !kept[i])) continue;
    c += w[i];
    last = i;
    if (r < c) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // r rounded up to the total
}

bool Sampler::covered_by(int64_t n_candidates, int64_t n_vocab) const {
  if (n_candidates < 1 || changes_row()) return false;
  if (o_.temperature == 0) return true;
  const int64_t k = o_.top_k > 0 && o_.top_k < n_vocab ? o_.top_k : n_vocab;
  return k <= n_candidates;
}

int32_t Sampler::sample_top(std::span<const int32_t> ids, std::span<const float> logits, int64_t n_vocab) {
  if (!covered_by(static_cast<int64_t>(ids.size()), n_vocab) || logits.size() != ids.size())
    fail("sampling with top-k {} over {} tokens needs that many candidates, the backend gave {}", o_.top_k, n_vocab,
         ids.size());
  if (o_.temperature == 0) return ids[0];
  if (o_.top_k <= 0 || o_.top_k >= n_vocab) {  // every token is a candidate: the row, by id
    std::vector<float> row(static_cast<size_t>(n_vocab), -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n_vocab; ++i) {
      MK_CHECK(ids[static_cast<size_t>(i)] >= 0 && ids[static_cast<size_t>(i)] < n_vocab);
      row[static_cast<size_t>(ids[static_cast<size_t>(i)])] = logits[static_cast<size_t>(i)];
    }
    return sample_row(row);
  }
  const size_t k = static_cast<size_t>(o_.top_k);
  return pick(ids.first(k), logits.first(k));
}

int32_t Sampler::pick(std::span<const int32_t> idx, std::span<const float> top) {
  const size_t k = idx.size();
  std::vector<double> p(k);
  double mx = top[0], sum = 0;
  for (size_t i = 0; i < k; ++i) sum += (p[i] = std::exp((top[i] - mx) / o_.temperature));
  size_t min_p_keep = k;  // min-p: weights relative to the most likely token's (1), in by-logit order
  while (min_p_keep > 1 && p[min_p_keep - 1] < o_.min_p) --min_p_keep;
  for (auto& x : p) x /= sum;
  size_t keep = k;
  if (o_.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += p[i];
      if (cum >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  keep = std::min(keep, min_p_keep);
  double total = std::accumulate(p.begin(), p.begin() + static_cast<long>(keep), 0.0);
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0) return idx[i];
  }
  return idx[keep - 1];
}

RowLogprobs row_logprobs(std::span<const float> logits, int n_top) {
  RowLogprobs r;
  if (logits.empty()) return r;
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  r.log_sum = mx + std::log(sum);
  const TopKRow best = topk_row(logits, n_top);  // the backend's top-k, in this file's order
  for (size_t i = 0; i < best.ids.size(); ++i) r.top.emplace_back(best.ids[i], r.logprob(best.logits[i]));
  return r;
}

GeneratedLogprob generated_logprob(std::span<const float> logits, int32_t id, int n_top,
                                   const std::function<std::string(int32_t)>& bytes_of) {
  const RowLogprobs r = row_logprobs(logits, n_top);
  auto entry = [&](int32_t t, double lp) { return TokenLogprob{t, lp, bytes_of ? bytes_of(t) : std::string()}; };
  GeneratedLogprob g;
  g.token = entry(id, r.logprob(logits[static_cast<size_t>(id)]));
  for (const auto& [t, lp] : r.top) g.top.push_back(entry(t, lp));
  return g;
}

}  // namespace mk
