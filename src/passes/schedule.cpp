// Pass "schedule": the global instruction order and, for static schedules, per-worker lists.
//
// Critical-path list scheduling: each instruction costs an estimate of the bytes it moves (weight
// tile + activations) plus a fixed overhead; its priority is its bottom level (the costliest path
// from it to the end). Simulating `workers` workers, whenever one is free it takes the released
// instruction (all predecessors assigned) that can start earliest, highest priority first. The
// assignment order is topological and becomes the global order: the dynamic queue's order for
// "dynamic", and the order every static list follows. "static-cp" keeps the simulated assignment;
// "static-rr" deals the global order round-robin. Either way each worker's list is a subsequence
// of one topological order, which is what makes static schedules deadlock-free (ARCHITECTURE.md).
#include <algorithm>

#include "passes/order.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mk {

namespace {

double instr_cost(const Program& p, const Instr& in) {
  const OpDesc& o = p.ops[static_cast<size_t>(in.op)];
  const double cols = static_cast<double>(in.c1 - in.c0);
  auto bpe = [&](int w) {
    DType t = p.weights[static_cast<size_t>(w)].dtype;
    return static_cast<double>(dtype_block_bytes(t)) / static_cast<double>(dtype_block_size(t));
  };
  double bytes = 256;  // dispatch and wait overhead, in byte-equivalents
  switch (o.opcode) {
    case Opcode::moe_matmul:  // expand: one expert's rows of K; reduce: k experts' (o.k = k K)
      bytes += cols * static_cast<double>(o.k) * bpe(o.w) * (o.w_up >= 0 ? 2 : 1) + 4.0 * static_cast<double>(o.k);
      break;
    case Opcode::matmul:
      bytes += cols * static_cast<double>(o.k) * bpe(o.w) * (o.w_up >= 0 ? 2 : 1) + 4.0 * static_cast<double>(o.k);
      break;
    case Opcode::attention:
      bytes += 2.0 * 256 * static_cast<double>(o.head_dim) * 4;  // a typical context's K and V
      break;
    case Opcode::attention_partial:  // its share of a typical context
      bytes += 2.0 * 256 * static_cast<double>(o.head_dim) * 4 / static_cast<double>(o.attn_splits);
      break;
    case Opcode::attention_combine:
      bytes += cols * 4.0 * static_cast<double>(o.attn_splits);
      break;
    case Opcode::embed:
      bytes += cols * bpe(o.w);
      break;
    default:
      bytes += 8.0 * cols + 4.0 * static_cast<double>(o.k);
  }
  return bytes;
}

}  // namespace

void run_schedule(PassContext& cx) {
  Program& p = cx.program;
  const int n = static_cast<int>(p.instrs.size());
  const int W = std::max(1, p.workers);
  auto preds = wait_predecessors(p);
  std::vector<std::vector<int>> succ(static_cast<size_t>(n));
  std::vector<int> pending(static_cast<size_t>(n), 0);
  for (int j = 0; j < n; ++j) {
    auto& pr = preds[static_cast<size_t>(j)];
    std::sort(pr.begin(), pr.end());
    pr.erase(std::unique(pr.begin(), pr.end()), pr.end());
    for (int i : pr) succ[static_cast<size_t>(i)].push_back(j);
    pending[static_cast<size_t>(j)] = static_cast<int>(pr.size());
  }
  std::vector<double> cost(static_cast<size_t>(n)), level(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) cost[static_cast<size_t>(i)] = instr_cost(p, p.instrs[static_cast<size_t>(i)]);
  for (int i = n; i-- > 0;) {  // instructions are topologically ordered by tile/deps
    double best = 0;
    for (int s : succ[static_cast<size_t>(i)]) best = std::max(best, level[static_cast<size_t>(s)]);
    level[static_cast<size_t>(i)] = cost[static_cast<size_t>(i)] + best;
  }
  std::vector<double> ready_at(static_cast<size_t>(n), 0), worker_free(static_cast<size_t>(W), 0);
  std::vector<int> released, order;
  std::vector<int> assigned(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i)
    if (pending[static_cast<size_t>(i)] == 0) released.push_back(i);
  while (!released.empty()) {
    int w = static_cast<int>(std::min_element(worker_free.begin(), worker_free.end()) - worker_free.begin());
    double t = worker_free[static_cast<size_t>(w)];
    size_t best = 0;
    for (size_t k = 1; k < released.size(); ++k) {
      int a = released[k], b = released[best];
      double sa = std::max(t, ready_at[static_cast<size_t>(a)]), sb = std::max(t, ready_at[static_cast<size_t>(b)]);
      if (sa != sb ? sa < sb : level[static_cast<size_t>(a)] != level[static_cast<size_t>(b)] ? level[static_cast<size_t>(a)] > level[static_cast<size_t>(b)] : a < b)
        best = k;
    }
    int i = released[best];
    released.erase(released.begin() + static_cast<std::ptrdiff_t>(best));
    double finish = std::max(t, ready_at[static_cast<size_t>(i)]) + cost[static_cast<size_t>(i)];
    worker_free[static_cast<size_t>(w)] = finish;
    assigned[static_cast<size_t>(i)] = w;
    order.push_back(i);
    for (int s : succ[static_cast<size_t>(i)]) {
      ready_at[static_cast<size_t>(s)] = std::max(ready_at[static_cast<size_t>(s)], finish);
      if (--pending[static_cast<size_t>(s)] == 0) released.push_back(s);
    }
  }
  MK_CHECK(static_cast<int>(order.size()) == n, "schedule: the dependency graph has a cycle");
  std::vector<Instr> instrs;
  instrs.reserve(static_cast<size_t>(n));
  for (int i : order) instrs.push_back(std::move(p.instrs[static_cast<size_t>(i)]));
  p.instrs = std::move(instrs);
  p.schedule = cx.options.schedule;
  p.lists.clear();
  if (p.schedule == ScheduleKind::dynamic) return;
  p.lists.assign(static_cast<size_t>(W), {});
  for (int k = 0; k < n; ++k) {
    int w = p.schedule == ScheduleKind::static_rr ? k % W : assigned[static_cast<size_t>(order[static_cast<size_t>(k)])];
    p.lists[static_cast<size_t>(w)].push_back(k);
  }
}

}  // namespace mk
