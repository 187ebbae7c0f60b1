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
#include <cstdint>
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
  // Each buffer's writers sorted by first column, with the running maximum of their last columns:
  // the writers overlapping a read's columns are one binary search away.
  std::vector<std::vector<int64_t>> max_c1(p.buffers.size());
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    auto& ws = writers[b];
    std::stable_sort(ws.begin(), ws.end(), [](const auto& x, const auto& y) { return x.second.c0 < y.second.c0; });
    for (size_t k = 0; k < ws.size(); ++k) max_c1[b].push_back(std::max(k ? max_c1[b][k - 1] : INT64_MIN, ws[k].second.c1));
  }
  // Direct producers, reduced transitively (instructions are in topological order here). Ancestor
  // sets are kept per instruction as the ops they contain entirely plus a sorted list of the other
  // ancestor instructions: a consumer of full rows contains every earlier op entirely, so the lists
  // stay short and the pass is about linear in the instruction count (an n^2 bitset is 400 MB and
  // tens of seconds for the 8B program).
  const size_t nops = p.ops.size();
  std::vector<int> op_size(nops, 0);
  for (const Instr& in : p.instrs) op_size[static_cast<size_t>(in.op)]++;
  struct Ancestors {
    Bitset full;             // ops all of whose instructions are ancestors
    std::vector<int> part;   // further ancestors, sorted, none of them in a full op
  };
  auto op_of = [&](int i) { return static_cast<size_t>(p.instrs[static_cast<size_t>(i)].op); };
  auto contains = [&](const Ancestors& a, int q) {
    return a.full.test(op_of(q)) || std::binary_search(a.part.begin(), a.part.end(), q);
  };
  std::vector<Ancestors> anc(static_cast<size_t>(n));
  std::vector<std::vector<int>> reduced(static_cast<size_t>(n));
  std::vector<int> per_op(nops, 0);
  std::vector<int> prev_deps;  // of instruction j - 1
  for (int j = 0; j < n; ++j) {
    std::vector<int> deps;
    for (const Access& r : acc[static_cast<size_t>(j)]) {
      if (r.write) continue;
      const auto& ws = writers[static_cast<size_t>(r.buffer)];
      const auto& mc = max_c1[static_cast<size_t>(r.buffer)];
      const auto lo = std::upper_bound(mc.begin(), mc.end(), r.c0) - mc.begin();
      const auto hi = std::lower_bound(ws.begin(), ws.end(), r.c1, [](const auto& x, int64_t c) { return x.second.c0 < c; }) - ws.begin();
      for (auto k = lo; k < hi; ++k) {
        const auto& [i, w] = ws[static_cast<size_t>(k)];
        if (i == j || !accesses_may_overlap(r, w)) continue;
        MK_CHECK(i < j, "deps: {} reads what the later {} writes", p.instr_str(j), p.instr_str(i));
        deps.push_back(i);
      }
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    // Tiles of one op that read whole rows have the same producers: same reduction, same ancestors.
    if (j > 0 && !deps.empty() && deps == prev_deps) {
      reduced[static_cast<size_t>(j)] = reduced[static_cast<size_t>(j - 1)];
      anc[static_cast<size_t>(j)] = anc[static_cast<size_t>(j - 1)];
      continue;
    }
    prev_deps = deps;
    Ancestors covered{Bitset(nops), {}};
    for (int q : deps) {
      const Ancestors& aq = anc[static_cast<size_t>(q)];
      covered.full.merge(aq.full);
      covered.part.insert(covered.part.end(), aq.part.begin(), aq.part.end());
    }
    std::sort(covered.part.begin(), covered.part.end());
    covered.part.erase(std::unique(covered.part.begin(), covered.part.end()), covered.part.end());
    std::erase_if(covered.part, [&](int q) { return covered.full.test(op_of(q)); });
    Ancestors& aj = anc[static_cast<size_t>(j)];
    aj.full = covered.full;
    aj.part = covered.part;
    for (int q : deps) {
      if (contains(covered, q)) continue;
      reduced[static_cast<size_t>(j)].push_back(q);
      if (!aj.full.test(op_of(q))) aj.part.push_back(q);
    }
    // Promote ops whose every instruction is now an ancestor.
    std::sort(aj.part.begin(), aj.part.end());
    for (int q : aj.part) per_op[op_of(q)]++;
    bool promoted = false;
    for (int q : aj.part)
      if (per_op[op_of(q)] == op_size[op_of(q)]) {
        aj.full.set(op_of(q));
        promoted = true;
      }
    for (int q : aj.part) per_op[op_of(q)] = 0;
    if (promoted) std::erase_if(aj.part, [&](int q) { return aj.full.test(op_of(q)); });
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
