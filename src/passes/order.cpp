#include "passes/order.h"

namespace mk {

std::vector<uint32_t> count_signals(const Program& p) {
  std::vector<uint32_t> n(p.counters.size(), 0);
  for (const Instr& in : p.instrs)
    if (in.signal >= 0 && static_cast<size_t>(in.signal) < n.size()) n[static_cast<size_t>(in.signal)]++;
  return n;
}

std::vector<std::vector<int>> wait_predecessors(const Program& p) {
  std::vector<std::vector<int>> signalers(p.counters.size());
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    int s = p.instrs[i].signal;
    if (s >= 0 && static_cast<size_t>(s) < signalers.size()) signalers[static_cast<size_t>(s)].push_back(static_cast<int>(i));
  }
  std::vector<std::vector<int>> preds(p.instrs.size());
  for (size_t j = 0; j < p.instrs.size(); ++j)
    for (const Wait& w : p.instrs[j].waits) {
      if (w.counter < 0 || static_cast<size_t>(w.counter) >= signalers.size()) continue;
      const auto& s = signalers[static_cast<size_t>(w.counter)];
      if (w.count != s.size()) continue;
      preds[j].insert(preds[j].end(), s.begin(), s.end());
    }
  return preds;
}

HappensBefore happens_before(const Program& p, const std::vector<std::vector<int>>& preds) {
  const size_t n = p.instrs.size();
  HappensBefore hb;
  hb.ancestors.assign(n, Bitset(n));
  // Kahn's order over the predecessor graph (instructions need not be listed topologically).
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> succ(n);
  for (size_t j = 0; j < n; ++j)
    for (int i : preds[j]) {
      pending[j]++;
      succ[static_cast<size_t>(i)].push_back(static_cast<int>(j));
    }
  std::vector<int> ready;
  for (size_t j = n; j-- > 0;)
    if (pending[j] == 0) ready.push_back(static_cast<int>(j));
  size_t done = 0;
  while (!ready.empty()) {
    int j = ready.back();
    ready.pop_back();
    ++done;
    for (int i : preds[static_cast<size_t>(j)]) {
      hb.ancestors[static_cast<size_t>(j)].set(static_cast<size_t>(i));
      hb.ancestors[static_cast<size_t>(j)].merge(hb.ancestors[static_cast<size_t>(i)]);
    }
    for (int s : succ[static_cast<size_t>(j)])
      if (--pending[static_cast<size_t>(s)] == 0) ready.push_back(s);
  }
  hb.acyclic = done == n;
  return hb;
}

}  // namespace mk
