#include "passes/order.h"

#include <algorithm>

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

HappensBefore happens_before(const Program& p) {
  const size_t n = p.instrs.size(), nc = p.counters.size();
  const std::vector<uint32_t> signals = count_signals(p);
  HappensBefore hb;
  hb.signal.assign(n, -1);
  hb.waits.assign(n, {});
  std::vector<std::vector<int>> signalers(nc);
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = p.instrs[i];
    if (in.signal >= 0 && static_cast<size_t>(in.signal) < nc) {
      hb.signal[i] = in.signal;
      signalers[static_cast<size_t>(in.signal)].push_back(static_cast<int>(i));
    }
    for (const Wait& w : in.waits)
      if (w.counter >= 0 && static_cast<size_t>(w.counter) < nc && w.count == signals[static_cast<size_t>(w.counter)])
        hb.waits[i].push_back(w.counter);
  }
  // Counter c depends on d when a signaller of c waits on d; Kahn's order over that graph.
  std::vector<std::vector<int>> deps(nc), succ(nc);
  std::vector<int> pending(nc, 0);
  for (size_t c = 0; c < nc; ++c) {
    auto& d = deps[c];
    for (int i : signalers[c]) d.insert(d.end(), hb.waits[static_cast<size_t>(i)].begin(), hb.waits[static_cast<size_t>(i)].end());
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
    pending[c] = static_cast<int>(d.size());
    for (int x : d) succ[static_cast<size_t>(x)].push_back(static_cast<int>(c));
  }
  hb.closure.assign(nc, Bitset(nc));
  std::vector<int> ready;
  for (size_t c = nc; c-- > 0;)
    if (pending[c] == 0) ready.push_back(static_cast<int>(c));
  size_t done = 0;
  while (!ready.empty()) {
    const auto c = static_cast<size_t>(ready.back());
    ready.pop_back();
    ++done;
    hb.closure[c].set(c);
    for (int d : deps[c]) hb.closure[c].merge(hb.closure[static_cast<size_t>(d)]);
    for (int s : succ[c])
      if (--pending[static_cast<size_t>(s)] == 0) ready.push_back(s);
  }
  // Counters on a cycle (or after one) never became ready: still give them what is known.
  if (done != nc) {
    for (size_t c = 0; c < nc; ++c)
      if (pending[c] != 0) {
        hb.closure[c].set(c);
        for (int d : deps[c]) {
          hb.closure[c].set(static_cast<size_t>(d));
          hb.closure[c].merge(hb.closure[static_cast<size_t>(d)]);
        }
      }
  }
  hb.acyclic = done == nc;
  return hb;
}

}  // namespace mk
