// Happens-before over a program's instructions, as established by counter waits: instruction a
// happens before b when a chain of waits leads from a to b.
//
// A wait on counter c (with the count c gets per step) orders every signaller of c before the
// waiter, so a happens before b exactly when a's counter is in the counter closure of b's waits:
// closure(c) = {c} + the closures of the waits of every instruction signalling c. That is one bitset
// over counters per counter (counters^2/8 bytes: ~1 MB for 3000 counters), computed in one pass over
// the counters in dependency order, and a query costs one bit test per wait of b.
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
  std::vector<Bitset> closure;           // closure[c].test(d): d's signallers happen before c's waiters
  std::vector<std::vector<int>> waits;   // per instruction: the counters of its ordering waits
  std::vector<int> signal;               // per instruction: its counter (-1 if none)
  bool acyclic = true;
  // a happens before b (a chain of waits leads from a to b).
  bool before(int a, int b) const {
    return counter_before(signal[static_cast<size_t>(a)], b);
  }
  // Every instruction signalling counter s happens before b.
  bool counter_before(int s, int b) const {
    if (s < 0) return false;
    for (int c : waits[static_cast<size_t>(b)])
      if (closure[static_cast<size_t>(c)].test(static_cast<size_t>(s))) return true;
    return false;
  }
};

// Direct predecessors: for each wait whose count equals the counter's actual signals per step,
// every instruction signalling that counter. Waits with any other count order nothing.
std::vector<std::vector<int>> wait_predecessors(const Program& p);
// Happens-before from the same ordering waits (count == the counter's actual signals per step).
// acyclic is false when the waits form a cycle (the program deadlocks); the closures of counters on
// or after a cycle are then incomplete.
HappensBefore happens_before(const Program& p);
// Actual signals per step of each counter (instructions naming it as their signal).
std::vector<uint32_t> count_signals(const Program& p);

}  // namespace mk
