#include "runtime/lookup.h"

#include <algorithm>

namespace mk {

std::vector<int32_t> lookup_draft(std::span<const int32_t> history, int min_ngram, int max_ngram, int max_draft) {
  const int64_t len = static_cast<int64_t>(history.size());
  if (max_draft < 1) return {};
  for (int64_t n = std::min<int64_t>(max_ngram, len - 1); n >= std::max(min_ngram, 1); --n) {
    const auto tail = history.subspan(static_cast<size_t>(len - n));
    // the latest start i < len - n whose n tokens equal the tail (and that has a token after it)
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(tail.begin(), tail.end(), history.begin() + i)) continue;
      const int64_t from = i + n, to = std::min<int64_t>(from + max_draft, len);
      return {history.begin() + from, history.begin() + to};
    }
  }
  return {};
}

}  // namespace mk
