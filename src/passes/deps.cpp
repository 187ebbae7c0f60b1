// Pass "deps": counters and waits derived from the regions instructions read and write.
//
// 1. For every read region, the producer tiles whose write regions intersect it (instr_accesses).
// 2. Transitive reduction: a producer already ordered before another producer the consumer waits
//    for is dropped, so every remaining wait is needed (dropping any makes the program unsafe).
// 3. Counters: the tiles of one op are partitioned into the coarsest groups that every consumer
//    needs either completely or not at all; one counter per group, signalled once by each member.
//    A consumer waits for exactly the groups covering the producer tiles it reads, with count =
//    group size (= that counter's signals per step). Example: attention over head h waits for the
//    q tiles of head h only; a matmul reading full rows waits for every tile of its input.
#include <algorithm>
#include <map>

#include "passes/order.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mk {

void run_deps(PassContext& cx) {
  Program& p = cx.program;
  const int n = static_cast<int>(p.instrs.size());
  std::vector<std::vector<Access>> acc(static_cast<size_t>(n));
  std::vector<std::vector<std::pair<int, Access>>> writers(p.buffers.size());
  for (int i = 0; i < n; ++i) {
    acc[static_cast<size_t>(i)] = instr_accesses(p, p.instrs[static_cast<size_t>(i)]);
    for (const Access& a : acc[static_cast<size_t>(i)])
      if (a.write) writers[static_cast<size_t>(a.buffer)].push_back({i, a});
  }
  // Direct producers, reduced transitively (instructions are in topological order here).
  std::vector<Bitset> anc(static_cast<size_t>(n), Bitset(static_cast<size_t>(n)));
  std::vector<std::vector<int>> reduced(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    std::vector<int> deps;
    for (const Access& r : acc[static_cast<size_t>(j)]) {
      if (r.write) continue;
      for (const auto& [i, w] : writers[static_cast<size_t>(r.buffer)]) {
        if (i == j || !accesses_may_overlap(r, w)) continue;
        MK_CHECK(i < j, "deps: {} reads what the later {} writes", p.instr_str(j), p.instr_str(i));
        deps.push_back(i);
      }
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    Bitset covered(static_cast<size_t>(n));
    for (int q : deps) covered.merge(anc[static_cast<size_t>(q)]);
    for (int q : deps) {
      anc[static_cast<size_t>(j)].set(static_cast<size_t>(q));
      anc[static_cast<size_t>(j)].merge(anc[static_cast<size_t>(q)]);
      if (!covered.test(static_cast<size_t>(q))) reduced[static_cast<size_t>(j)].push_back(q);
    }
  }
  // Partition each op's tiles by the set of consumers that need them.
  std::vector<std::vector<int>> needed_by(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j)
    for (int q : reduced[static_cast<size_t>(j)]) needed_by[static_cast<size_t>(q)].push_back(j);
  std::vector<std::vector<int>> op_instrs(p.ops.size());
  for (int i = 0; i < n; ++i) op_instrs[static_cast<size_t>(p.instrs[static_cast<size_t>(i)].op)].push_back(i);
  p.counters.clear();
  for (size_t op = 0; op < p.ops.size(); ++op) {
    std::map<std::vector<int>, int> atom;  // consumer list -> counter
    for (int i : op_instrs[op]) {
      auto [it, fresh] = atom.emplace(needed_by[static_cast<size_t>(i)], static_cast<int>(p.counters.size()));
      if (fresh) p.counters.push_back({p.ops[op].name, 0});
      p.instrs[static_cast<size_t>(i)].signal = it->second;
      p.counters[static_cast<size_t>(it->second)].signals_per_step++;
    }
  }
  // Counter names: op name and the tiles that signal it.
  std::vector<std::vector<int>> tiles(p.counters.size());
  for (const Instr& in : p.instrs) tiles[static_cast<size_t>(in.signal)].push_back(in.tile);
  for (size_t c = 0; c < p.counters.size(); ++c) {
    const auto& t = tiles[c];
    bool contiguous = t.back() - t.front() + 1 == static_cast<int>(t.size());
    p.counters[c].name += contiguous ? fmt::format("[{}:{}]", t.front(), t.back() + 1)
                                     : fmt::format("[{} tiles from {}]", t.size(), t.front());
  }
  for (int j = 0; j < n; ++j) {
    std::vector<Wait> w;
    for (int q : reduced[static_cast<size_t>(j)]) {
      int c = p.instrs[static_cast<size_t>(q)].signal;
      if (std::none_of(w.begin(), w.end(), [&](const Wait& x) { return x.counter == c; }))
        w.push_back({c, p.counters[static_cast<size_t>(c)].signals_per_step});
    }
    std::sort(w.begin(), w.end(), [](const Wait& a, const Wait& b) { return a.counter < b.counter; });
    p.instrs[static_cast<size_t>(j)].waits = std::move(w);
  }
}

}  // namespace mk
