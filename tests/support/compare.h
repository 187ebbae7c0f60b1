// Relative L2 error ||a - b|| / ||b||, the tolerance measure of the logits checks.
#pragma once
#include <cmath>
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

}  // namespace mk::test
