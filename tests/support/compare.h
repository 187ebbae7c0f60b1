// Relative L2 error ||a - b|| / ||b||, the tolerance measure of the logits checks, and the row
// helpers of the per-position logits checks.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mk::test {

template <class A, class B>
double rel_l2(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return a.size() == b.size() ? std::sqrt(num / den) : INFINITY;
}

// Rows [from, to) of a [n_tokens][n_vocab] logits table, concatenated.
inline std::vector<float> flat_rows(const std::vector<std::vector<float>>& rows, size_t from = 0, size_t to = SIZE_MAX) {
  std::vector<float> r;
  for (size_t i = from; i < std::min(to, rows.size()); ++i) r.insert(r.end(), rows[i].begin(), rows[i].end());
  return r;
}

// The index of the largest value of each n_vocab-long row (the first of equals).
inline std::vector<int64_t> argmax_rows(const std::vector<float>& logits, int64_t n_vocab) {
  std::vector<int64_t> r;
  const size_t n = static_cast<size_t>(n_vocab);
  for (size_t i = 0; i + n <= logits.size(); i += n)
    r.push_back(std::max_element(logits.begin() + static_cast<std::ptrdiff_t>(i), logits.begin() + static_cast<std::ptrdiff_t>(i + n)) -
                (logits.begin() + static_cast<std::ptrdiff_t>(i)));
  return r;
}

}  // namespace mk::test
