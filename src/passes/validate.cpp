// Pass "validate" and the validator every backend runs before executing a program.
//
// Checked (ARCHITECTURE.md, "Validator"):
//   structure   ids in range; each op's tiles cover its columns exactly once; every instruction
//               signals a counter; each counter's declared signals per step is what it gets
//   waits       count == the counter's signals per step (all of this step's signals), no waits on
//               one's own counter, no duplicates
//   order       the queue is topological (a wait's signalers all come earlier); static lists hold
//               every instruction once, each list a subsequence of the queue (deadlock freedom)
//   races       any two instructions touching overlapping memory, one writing, are ordered by a
//               chain of waits in queue order (RAW, WAR and WAW; buffers sharing arena bytes
//               conflict as wholes)
//   coverage    every activation a step reads is written earlier in that step; buffers lie inside
//               their storage; inputs and KV caches overlap nothing
//   usefulness  every instruction writes something that is read, a graph output or a KV cache
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "passes/order.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mk {

namespace {

class Validator {
 public:
  explicit Validator(const Program& p) : p_(p) {}

  std::vector<std::string> run() {
    if (!structure()) return issues_;
    waits_and_order();
    static_lists();
    memory();
    if (issues_.size() < kMaxIssues) races_and_coverage();
    return issues_;
  }

 private:
  static constexpr size_t kMaxIssues = 50;

  template <class... A>
  void issue(fmt::format_string<A...> f, A&&... a) {
    if (issues_.size() < kMaxIssues) issues_.push_back(fmt::format(f, std::forward<A>(a)...));
  }
  int n() const { return static_cast<int>(p_.instrs.size()); }

  bool structure() {
    const int nops = static_cast<int>(p_.ops.size()), nbuf = static_cast<int>(p_.buffers.size()),
              nw = static_cast<int>(p_.weights.size());
    auto bufok = [&](int b) { return b >= -1 && b < nbuf; };
    auto wok = [&](int w) { return w >= -1 && w < nw; };
    for (int i = 0; i < nops; ++i) {
      const OpDesc& o = p_.ops[static_cast<size_t>(i)];
      for (int b : {o.out, o.x, o.y, o.z, o.pos, o.ids, o.res, o.ss, o.ss_out})
        if (!bufok(b)) issue("op{} {}: buffer b{} does not exist", i, o.name, b);
      for (int w : {o.w, o.w_up, o.norm_w, o.bias})
        if (!wok(w)) issue("op{} {}: weight w{} does not exist", i, o.name, w);
      if (o.out < 0) issue("op{} {}: no output buffer", i, o.name);
    }
    if (!issues_.empty()) return false;
    // per op, per row part: the column ranges of its tiles (every part must cover the columns once)
    std::vector<std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<int64_t, int64_t>>>> cover(static_cast<size_t>(nops));
    for (int i = 0; i < n(); ++i) {
      const Instr& in = p_.instrs[static_cast<size_t>(i)];
      if (in.op < 0 || in.op >= nops) {
        issue("instruction {}: op{} does not exist", i, in.op);
        continue;
      }
      const OpDesc& o = p_.ops[static_cast<size_t>(in.op)];
      if (in.opcode != o.opcode) issue("instruction {}: opcode {} but op{} is {}", i, opcode_name(in.opcode), in.op, opcode_name(o.opcode));
      if (in.c0 < 0 || in.c1 > o.cols || in.c0 >= in.c1) issue("instruction {}: columns [{}, {}) outside op{} ({} columns)", i, in.c0, in.c1, in.op, o.cols);
      if (in.opcode == Opcode::moe_matmul && !o.moe_reduce && in.c0 < in.c1 &&
          (o.w_rows <= 0 || in.c0 / o.w_rows != (in.c1 - 1) / o.w_rows))
        issue("instruction {}: columns [{}, {}) of op{} span two expert slots of {} columns", i, in.c0, in.c1, in.op, o.w_rows);
      if (in.row_parts < 1 || in.row_part < 0 || in.row_part >= in.row_parts)
        issue("instruction {}: row part {} of {}", i, in.row_part, in.row_parts);
      else if (in.row_parts > 1 && in.opcode != Opcode::attention)
        issue("instruction {}: {} takes whole rows, not part {} of {}", i, opcode_name(in.opcode), in.row_part, in.row_parts);
      cover[static_cast<size_t>(in.op)][{in.row_parts, in.row_part}].push_back({in.c0, in.c1});
      if (in.signal < 0 || in.signal >= static_cast<int>(p_.counters.size()))
        issue("instruction {} ({}): signals no valid counter (c{})", i, o.name, in.signal);
      for (const Wait& w : in.waits)
        if (w.counter < 0 || w.counter >= static_cast<int>(p_.counters.size()))
          issue("instruction {} ({}): waits on nonexistent counter c{}", i, o.name, w.counter);
    }
    for (int i = 0; i < nops; ++i) {
      const OpDesc& o = p_.ops[static_cast<size_t>(i)];
      auto& parts = cover[static_cast<size_t>(i)];
      if (parts.empty()) parts[{1, 0}];  // no instruction: reported as uncovered columns
      const int32_t np = parts.begin()->first.first;
      if (parts.rbegin()->first.first != np) {
        issue("op{} {}: tiles cut the rows into {} and into {} parts", i, o.name, np, parts.rbegin()->first.first);
        continue;
      }
      for (int32_t part = 0; part < np; ++part)
        if (!parts.count({np, part})) parts[{np, part}];
      for (auto& [key, c] : parts) {
        const std::string rows = np > 1 ? fmt::format(" of row part {}/{}", key.second, np) : "";
        std::sort(c.begin(), c.end());
        int64_t at = 0;
        for (auto [a, b] : c) {
          if (a != at) issue("op{} {}: columns [{}, {}){} {}", i, o.name, std::min(a, at), std::max(a, at), rows, a > at ? "computed by no instruction" : "computed twice");
          at = std::max(at, b);
        }
        if (at != o.cols) issue("op{} {}: columns [{}, {}){} computed by no instruction", i, o.name, at, o.cols, rows);
      }
    }
    signals_ = count_signals(p_);
    for (size_t c = 0; c < p_.counters.size(); ++c)
      if (signals_[c] != p_.counters[c].signals_per_step)
        issue("counter c{} {}: declared {} signals per step, gets {}", c, p_.counters[c].name, p_.counters[c].signals_per_step, signals_[c]);
    return issues_.empty();
  }

  void waits_and_order() {
    std::vector<int> last_signal(p_.counters.size(), -1);
    for (int i = 0; i < n(); ++i) last_signal[static_cast<size_t>(p_.instrs[static_cast<size_t>(i)].signal)] = i;
    for (int i = 0; i < n(); ++i) {
      const Instr& in = p_.instrs[static_cast<size_t>(i)];
      std::vector<int> seen;
      for (const Wait& w : in.waits) {
        uint32_t s = signals_[static_cast<size_t>(w.counter)];
        if (w.count != s)
          issue("instruction {} ({}): waits for {} signals of c{} {}, which gets {} per step", i, name(i), w.count, w.counter, p_.counters[static_cast<size_t>(w.counter)].name, s);
        if (w.counter == in.signal) issue("instruction {} ({}): waits on the counter it signals (c{})", i, name(i), w.counter);
        if (std::find(seen.begin(), seen.end(), w.counter) != seen.end()) issue("instruction {} ({}): waits twice on c{}", i, name(i), w.counter);
        seen.push_back(w.counter);
        if (last_signal[static_cast<size_t>(w.counter)] > i)
          issue("queue order is not topological: instruction {} ({}) waits on c{}, signalled by the later instruction {} ({})", i, name(i), w.counter, last_signal[static_cast<size_t>(w.counter)], name(last_signal[static_cast<size_t>(w.counter)]));
      }
    }
  }

  void static_lists() {
    if (p_.schedule == ScheduleKind::dynamic) {
      if (!p_.lists.empty()) issue("dynamic schedule with static lists");
      return;
    }
    if (static_cast<int>(p_.lists.size()) != p_.workers) issue("static schedule has {} lists for {} workers", p_.lists.size(), p_.workers);
    std::vector<int> times(static_cast<size_t>(n()), 0);
    for (size_t w = 0; w < p_.lists.size(); ++w) {
      int prev = -1;
      for (int32_t i : p_.lists[w]) {
        if (i < 0 || i >= n()) {
          issue("list w{}: instruction {} does not exist", w, i);
          continue;
        }
        times[static_cast<size_t>(i)]++;
        if (i <= prev) issue("list w{}: instruction {} after {} does not follow the queue order", w, i, prev);
        prev = i;
      }
    }
    for (int i = 0; i < n(); ++i)
      if (times[static_cast<size_t>(i)] != 1) issue("instruction {} ({}) is in {} static lists (must be exactly 1)", i, name(i), times[static_cast<size_t>(i)]);
  }

  void memory() {
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      const Buffer& B = p_.buffers[b];
      int64_t limit = B.kind == BufferKind::kv ? p_.kv_bytes : p_.arena_bytes;
      if (B.offset < 0 || B.offset + B.bytes() > limit) issue("buffer b{} {}: [{}, {}) outside its storage ({} bytes)", b, B.name, B.offset, B.offset + B.bytes(), limit);
      for (size_t a = 0; a < b; ++a) {
        const Buffer& A = p_.buffers[a];
        if (!share_bytes(A, B)) continue;
        if (A.kind != BufferKind::activation || B.kind != BufferKind::activation)
          issue("buffers b{} {} and b{} {} overlap ({} memory must not be shared)", a, A.name, b, B.name,
                A.kind != BufferKind::activation ? buffer_kind_name(A.kind) : buffer_kind_name(B.kind));
      }
    }
  }

  static bool share_bytes(const Buffer& a, const Buffer& b) {
    bool same_storage = (a.kind == BufferKind::kv) == (b.kind == BufferKind::kv);
    return same_storage && a.offset < b.offset + b.bytes() && b.offset < a.offset + a.bytes();
  }

  void races_and_coverage() {
    HappensBefore hb = happens_before(p_);
    if (!hb.acyclic) issue("the waits form a cycle: the program deadlocks");
    std::vector<std::vector<std::pair<int, Access>>> by_buf(p_.buffers.size());
    std::vector<char> useful(static_cast<size_t>(n()), 0);
    for (int i = 0; i < n(); ++i)
      for (const Access& a : instr_accesses(p_, p_.instrs[static_cast<size_t>(i)])) {
        by_buf[static_cast<size_t>(a.buffer)].push_back({i, a});
        const Buffer& B = p_.buffers[static_cast<size_t>(a.buffer)];
        if (a.write && (B.is_output || B.kind == BufferKind::kv)) useful[static_cast<size_t>(i)] = 1;
      }
    auto ordered = [&](int i, int j) { return i < j ? hb.before(i, j) : hb.before(j, i); };
    auto report = [&](int b1, int b2, bool same, int first, bool first_writes, int second, bool second_writes) {
      const char* kind = first_writes && second_writes ? "write-after-write" : first_writes ? "read-after-write" : "write-after-read";
      if (same)
        issue("race ({}) on b{} {}: instruction {} ({}) is not ordered before instruction {} ({}) by any chain of waits",
              kind, b1, p_.buffers[static_cast<size_t>(b1)].name, first, name(first), second, name(second));
      else
        issue("race ({}) on shared arena bytes of b{} {} and b{} {}: instruction {} ({}) is not ordered before instruction {} ({})",
              kind, b1, p_.buffers[static_cast<size_t>(b1)].name, b2, p_.buffers[static_cast<size_t>(b2)].name, first, name(first), second, name(second));
    };
    // Accesses of one buffer: every overlapping pair, one writing (regions matter here).
    auto check_same = [&](int b) {
      const auto& acc = by_buf[static_cast<size_t>(b)];
      for (const auto& [i, a] : acc)
        for (const auto& [j, c] : acc) {
          if (i >= j || (!a.write && !c.write) || !accesses_may_overlap(a, c) || ordered(i, j)) continue;
          report(b, b, true, i, a.write, j, c.write);
          return;  // one report per buffer
        }
    };
    // Two buffers sharing arena bytes conflict as wholes. Whether i happens before j depends on i's
    // counter only (order.h), so for each later access j it is enough to test each counter of the
    // other buffer's earlier conflicting accesses once, at its earliest such access: |B| x counters
    // of A tests instead of |A| x |B| (the arena's slots are shared by buffers of every layer).
    struct Earliest {
      int any = INT32_MAX, write = INT32_MAX;
    };
    std::vector<std::vector<std::pair<int, Earliest>>> by_counter(p_.buffers.size());  // per buffer, per counter
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      auto& v = by_counter[b];
      for (const auto& [i, a] : by_buf[b]) {
        int s = p_.instrs[static_cast<size_t>(i)].signal;
        auto it = std::find_if(v.begin(), v.end(), [&](const auto& e) { return e.first == s; });
        if (it == v.end()) it = v.emplace(v.end(), s, Earliest{});
        it->second.any = std::min(it->second.any, i);
        if (a.write) it->second.write = std::min(it->second.write, i);
      }
    }
    // Reports the first access of `later` not ordered after the earlier conflicting ones of `earlier`.
    auto check_shared_dir = [&](int earlier, int later, int b1, int b2) {
      for (const auto& [j, c] : by_buf[static_cast<size_t>(later)])
        for (const auto& [s, e] : by_counter[static_cast<size_t>(earlier)]) {
          const int i = c.write ? e.any : e.write;  // reads conflict with writes only
          if (i >= j || hb.counter_before(s, j)) continue;
          const bool i_writes = c.write ? i == e.write : true;
          report(b1, b2, false, i, i_writes, j, c.write);
          return true;
        }
      return false;
    };
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      check_same(static_cast<int>(b));
      for (size_t a = 0; a < b; ++a)
        if (share_bytes(p_.buffers[a], p_.buffers[b]) &&
            !check_shared_dir(static_cast<int>(a), static_cast<int>(b), static_cast<int>(a), static_cast<int>(b)))
          check_shared_dir(static_cast<int>(b), static_cast<int>(a), static_cast<int>(a), static_cast<int>(b));
    }
    // Coverage and usefulness. Each buffer's writes sorted by first column, with the running maximum
    // of their last columns: the writes overlapping a read's columns are one binary search away.
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      const auto& acc = by_buf[b];
      std::vector<std::pair<int, const Access*>> writes;
      for (const auto& [i, w] : acc)
        if (w.write) writes.push_back({i, &w});
      std::sort(writes.begin(), writes.end(), [](const auto& x, const auto& y) {
        return x.second->c0 != y.second->c0 ? x.second->c0 < y.second->c0 : x.second->c1 < y.second->c1;
      });
      std::vector<int64_t> max_c1(writes.size());
      for (size_t k = 0; k < writes.size(); ++k) max_c1[k] = std::max(k ? max_c1[k - 1] : INT64_MIN, writes[k].second->c1);
      for (const auto& [j, r] : acc) {
        if (r.write) continue;
        const auto lo = static_cast<size_t>(std::upper_bound(max_c1.begin(), max_c1.end(), r.c0) - max_c1.begin());
        const auto hi = static_cast<size_t>(std::lower_bound(writes.begin(), writes.end(), r.c1,
                                                             [](const auto& x, int64_t c) { return x.second->c0 < c; }) - writes.begin());
        int64_t at = r.c0;
        for (size_t k = lo; k < hi; ++k) {
          const auto& [i, w] = writes[k];
          if (!accesses_may_overlap(r, *w)) continue;
          if (i != j) useful[static_cast<size_t>(i)] = 1;
          if (w->c0 <= at) at = std::max(at, w->c1);
        }
        if (p_.buffers[b].kind != BufferKind::activation) continue;
        if (at < r.c1) issue("instruction {} ({}) reads columns [{}, {}) of b{} {} that no instruction writes", j, name(j), at, r.c1, b, p_.buffers[b].name);
      }
    }
    for (int i = 0; i < n(); ++i)
      if (!useful[static_cast<size_t>(i)]) issue("instruction {} ({}) computes nothing that is read or returned", i, name(i));
  }

  std::string name(int i) const {
    const Instr& in = p_.instrs[static_cast<size_t>(i)];
    return fmt::format("{} {} t{}", opcode_name(in.opcode), p_.ops[static_cast<size_t>(in.op)].name, in.tile);
  }

  const Program& p_;
  std::vector<std::string> issues_;
  std::vector<uint32_t> signals_;
};

}  // namespace

std::vector<std::string> check_program(const Program& p) { return Validator(p).run(); }

void validate_program(const Program& p) {
  auto issues = check_program(p);
  if (issues.empty()) return;
  std::string msg = fmt::format("invalid program ({} problem{}):", issues.size(), issues.size() == 1 ? "" : "s");
  for (const auto& s : issues) msg += "\n  " + s;
  fail("{}", msg);
}

void run_validate(PassContext& cx) { validate_program(cx.program); }

void verify_program_structure(const Program& p) {
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    MK_CHECK(in.op >= 0 && in.op < static_cast<int>(p.ops.size()), "instruction {}: bad op {}", i, in.op);
    const OpDesc& o = p.ops[static_cast<size_t>(in.op)];
    MK_CHECK(in.opcode == o.opcode && in.c0 < in.c1 && in.c1 <= o.cols, "instruction {}: bad tile", i);
    MK_CHECK(in.row_parts >= 1 && in.row_part >= 0 && in.row_part < in.row_parts, "instruction {}: bad row part", i);
    MK_CHECK(in.signal < static_cast<int>(p.counters.size()), "instruction {}: bad signal", i);
    for (const Wait& w : in.waits) MK_CHECK(w.counter >= 0 && w.counter < static_cast<int>(p.counters.size()), "instruction {}: bad wait", i);
  }
  for (const OpDesc& o : p.ops) {
    for (int b : {o.out, o.x, o.y, o.z, o.pos, o.ids, o.res, o.ss, o.ss_out}) MK_CHECK(b >= -1 && b < static_cast<int>(p.buffers.size()), "op {}: bad buffer", o.name);
    for (int w : {o.w, o.w_up, o.norm_w, o.bias}) MK_CHECK(w >= -1 && w < static_cast<int>(p.weights.size()), "op {}: bad weight", o.name);
  }
}

}  // namespace mk
