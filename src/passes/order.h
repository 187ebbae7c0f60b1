// Happens-before over a program's instructions, as established by counter waits: instruction a
// happens before b when a chain of waits leads from a to b. Stored as one ancestor bitset per
// instruction (n^2/8 bytes: ~2 MB for 4000 instructions).
#pragma once
#include <cstdint>
#include <vector>

#include "isa/program.h"

namespace mk {

class Bitset {
 public:
  Bitset() = default;
  explicit Bitset(size_t n) : w_((n + 63) / 64, 0) {}
  void set(size_t i) { w_[i >> 6] |= uint64_t{1} << (i & 63); }
  bool test(size_t i) const { return (w_[i >> 6] >> (i & 63)) & 1; }
  void merge(const Bitset& o) {
    for (size_t i = 0; i < w_.size(); ++i) w_[i] |= o.w_[i];
  }

 private:
  std::vector<uint64_t> w_;
};

struct HappensBefore {
  std::vector<Bitset> ancestors;  // ancestors[b].test(a): a happens before b
  bool acyclic = true;
  bool before(int a, int b) const { return ancestors[static_cast<size_t>(b)].test(static_cast<size_t>(a)); }
};

// Direct predecessors: for each wait whose count equals the counter's actual signals per step,
// every instruction signalling that counter. Waits with any other count order nothing.
std::vector<std::vector<int>> wait_predecessors(const Program& p);
HappensBefore happens_before(const Program& p, const std::vector<std::vector<int>>& preds);
// Actual signals per step of each counter (instructions naming it as their signal).
std::vector<uint32_t> count_signals(const Program& p);

}  // namespace mk
