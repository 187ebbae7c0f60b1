// The validator accepts every real program and rejects every unsafe mutation of one.
//
// Whether a mutant is unsafe is decided here by an independent oracle: it evaluates each
// instruction's accesses to concrete bytes for sample symbol values and replays the queue,
// checking every access against the last writer and the readers since (happens-before from a
// plain DFS over the waits); it also requires exact wait counts, a topological queue and static
// lists that follow it.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "archs/arch.h"
#include "model/synth.h"
#include "passes/order.h"
#include "passes/pass.h"
#include "support/error.h"
#include "support/tiny_model.h"

using namespace mk;

namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/";

// --- the oracle ---------------------------------------------------------------------------------

bool oracle_safe(const Program& p, std::string* why) {
  const int n = static_cast<int>(p.instrs.size());
  const int nc = static_cast<int>(p.counters.size());
  std::vector<std::vector<int>> signalers(static_cast<size_t>(nc));
  for (int i = 0; i < n; ++i) {
    int s = p.instrs[static_cast<size_t>(i)].signal;
    if (s < 0 || s >= nc) continue;  // signals nothing: only unsafe if someone waits for it (below)
    signalers[static_cast<size_t>(s)].push_back(i);
  }
  std::vector<std::vector<int>> preds(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j)
    for (const Wait& w : p.instrs[static_cast<size_t>(j)].waits) {
      if (w.counter < 0 || w.counter >= nc) return *why = "wait on a nonexistent counter", false;
      const auto& s = signalers[static_cast<size_t>(w.counter)];
      if (w.count != s.size()) return *why = "wait count differs from the signals per step", false;
      for (int i : s) {
        if (i >= j) return *why = "queue not topological", false;
        preds[static_cast<size_t>(j)].push_back(i);
      }
    }
  for (int c = 0; c < nc; ++c)
    if (p.counters[static_cast<size_t>(c)].signals_per_step != signalers[static_cast<size_t>(c)].size())
      return *why = "counter table disagrees with the signals", false;
  if (p.schedule != ScheduleKind::dynamic) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (const auto& l : p.lists)
      for (size_t k = 0; k < l.size(); ++k) {
        if (l[k] < 0 || l[k] >= n) return *why = "list entry out of range", false;
        if (k && l[k] <= l[k - 1]) return *why = "list not in queue order", false;
        seen[static_cast<size_t>(l[k])]++;
      }
    for (int c : seen)
      if (c != 1) return *why = "instruction not in exactly one list", false;
  }
  // Happens-before by DFS from each instruction over its predecessors.
  std::vector<std::vector<char>> hb(static_cast<size_t>(n), std::vector<char>(static_cast<size_t>(n), 0));
  for (int j = 0; j < n; ++j) {
    std::vector<int> stack(preds[static_cast<size_t>(j)].begin(), preds[static_cast<size_t>(j)].end());
    while (!stack.empty()) {
      int i = stack.back();
      stack.pop_back();
      if (hb[static_cast<size_t>(j)][static_cast<size_t>(i)]) continue;
      hb[static_cast<size_t>(j)][static_cast<size_t>(i)] = 1;
      for (int k : preds[static_cast<size_t>(i)]) stack.push_back(k);
    }
  }
  // Replay the queue over concrete 4-byte words.
  for (SymValues s : {SymValues{1, 1}, SymValues{3, 2}}) {
    if (s.n_tokens > p.max_tokens) continue;
    const size_t words[2] = {static_cast<size_t>(p.arena_bytes / 4), static_cast<size_t>(p.kv_bytes / 4)};
    std::vector<int> last_writer[2];
    std::vector<std::vector<int>> readers[2];
    for (int k = 0; k < 2; ++k) {
      last_writer[k].assign(words[k], -1);
      readers[k].assign(words[k], {});
    }
    for (int j = 0; j < n; ++j) {
      for (const Access& a : instr_accesses(p, p.instrs[static_cast<size_t>(j)])) {
        const Buffer& B = p.buffers[static_cast<size_t>(a.buffer)];
        const int st = B.kind == BufferKind::kv ? 1 : 0;
        // the rows of the access's part (instr_rows) of [row_lo, row_hi)
        const int64_t lo = a.row_lo.eval(s), n_rows = a.row_hi.eval(s) - lo;
        for (int64_t r = lo + n_rows * a.part / a.parts; r < lo + n_rows * (a.part + 1) / a.parts; ++r)
          for (int64_t c = a.c0; c < a.c1; ++c) {
            int64_t byte = B.offset + (r * B.cols + c) * 4;
            if (B.offset < 0 || byte < 0 || static_cast<size_t>(byte / 4) >= words[st]) return *why = "access outside storage", false;
            size_t w = static_cast<size_t>(byte / 4);
            int lw = last_writer[st][w];
            if (lw >= 0 && lw != j && !hb[static_cast<size_t>(j)][static_cast<size_t>(lw)]) return *why = "unordered access after a write", false;
            if (a.write) {
              for (int rd : readers[st][w])
                if (rd != j && !hb[static_cast<size_t>(j)][static_cast<size_t>(rd)]) return *why = "write after an unordered read", false;
              last_writer[st][w] = j;
              readers[st][w].clear();
            } else if (readers[st][w].empty() || readers[st][w].back() != j) {
              readers[st][w].push_back(j);
            }
          }
      }
    }
  }
  // An instruction that signals nothing is fine only when nobody waits for its work; the waits
  // above already caught the counted case. Buffers of different kinds never share bytes here.
  return true;
}

// --- real programs --------------------------------------------------------------------------------

struct Real {
  std::string what;
  Program program;
};

std::vector<Real> real_programs() {
  std::vector<Real> r;
  ModelFile stories = load_model(kStories + "stories260K.bin");
  Graph g = build_graph(stories, BuildOptions{32, false});
  for (int w : {1, 2, 3, 4, 8})
    for (auto sched : {ScheduleKind::dynamic, ScheduleKind::static_rr, ScheduleKind::static_cp}) {
      CompileOptions co;
      co.workers = w;
      co.schedule = sched;
      co.max_tokens = 8;
      r.push_back({fmt::format("stories260K w{} {}", w, schedule_name(sched)), compile_program(g, co)});
    }
  CompileOptions unfused;
  unfused.workers = 2;
  unfused.max_tokens = 8;
  unfused.skip = {"fuse"};
  r.push_back({"stories260K unfused", compile_program(g, unfused)});
  test::TinyLlama t;
  t.tied = true;
  ModelFile tiny = test::make_tiny_llama(t);
  Graph tg = build_graph(tiny, BuildOptions{16, true});
  CompileOptions co;
  co.workers = 3;
  co.max_tokens = 8;
  r.push_back({"tiny all-logits", compile_program(tg, co)});
  return r;
}

}  // namespace

TEST(Validator, AcceptsEveryRealProgram) {
  for (const auto& r : real_programs()) {
    auto issues = check_program(r.program);
    EXPECT_TRUE(issues.empty()) << r.what << ": " << (issues.empty() ? "" : issues[0]);
    std::string why;
    EXPECT_TRUE(oracle_safe(r.program, &why)) << r.what << ": oracle says " << why;
  }
}

// Attention tiles over row parts (stories260K's 4 KV groups on 3 workers: 3 parts): each part must
// cover the columns once, parts exist only for attention, and a part index lies inside its count.
TEST(Validator, RowPartsCoverEveryColumnOfEveryPart) {
  ModelFile stories = load_model(kStories + "stories260K.bin");
  CompileOptions co;
  co.workers = 3;
  co.max_tokens = 8;
  const Program p = compile_program(build_graph(stories, BuildOptions{32, false}), co);
  ASSERT_TRUE(check_program(p).empty());
  size_t cut = p.instrs.size(), mm = p.instrs.size();
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    if (p.instrs[i].row_parts > 1 && cut == p.instrs.size()) cut = i;
    if (p.instrs[i].opcode == Opcode::matmul && mm == p.instrs.size()) mm = i;
  }
  ASSERT_LT(cut, p.instrs.size()) << "no attention tile over a part of the rows";
  ASSERT_EQ(p.instrs[cut].row_parts, 3);
  auto first_issue = [](const Program& q, const std::string& has) {
    for (const std::string& s : check_program(q))
      if (s.find(has) != std::string::npos) return s;
    return std::string("<none with '") + has + "'>";
  };
  Program twice = p;  // part 0's first tile computes part 1's columns instead: part 1 twice, part 0 short
  twice.instrs[cut].row_part = 1;
  EXPECT_EQ(first_issue(twice, "row part 0/3"), "op4 blk.0.attn: columns [0, 16) of row part 0/3 computed by no instruction");
  EXPECT_EQ(first_issue(twice, "row part 1/3"), "op4 blk.0.attn: columns [0, 16) of row part 1/3 computed twice");
  Program mixed = p;
  mixed.instrs[cut].row_parts = 2;
  mixed.instrs[cut].row_part = 0;
  EXPECT_EQ(first_issue(mixed, "parts"), "op4 blk.0.attn: tiles cut the rows into 2 and into 3 parts");
  Program outside = p;
  outside.instrs[cut].row_part = 3;
  EXPECT_EQ(first_issue(outside, "row part"), fmt::format("instruction {}: row part 3 of 3", cut));
  Program matmul = p;
  matmul.instrs[mm].row_parts = 2;
  EXPECT_EQ(first_issue(matmul, "whole rows"), fmt::format("instruction {}: matmul takes whole rows, not part 0 of 2", mm));
}

// happens_before() works over counters (passes/order.h); it must agree with plain reachability over
// the instructions' ordering waits, on real programs and on programs with dropped, miscounted or
// cyclic waits.
TEST(Validator, HappensBeforeIsReachabilityOverWaits) {
  auto check = [](const std::string& what, const Program& p, bool expect_acyclic) {
    const int n = static_cast<int>(p.instrs.size());
    auto preds = wait_predecessors(p);
    HappensBefore hb = happens_before(p);
    EXPECT_EQ(hb.acyclic, expect_acyclic) << what;
    size_t ordered = 0;
    for (int b = 0; b < n; ++b) {
      std::vector<char> seen(static_cast<size_t>(n), 0);
      std::vector<int> stack(preds[static_cast<size_t>(b)].begin(), preds[static_cast<size_t>(b)].end());
      while (!stack.empty()) {
        int i = stack.back();
        stack.pop_back();
        if (seen[static_cast<size_t>(i)]) continue;
        seen[static_cast<size_t>(i)] = 1;
        for (int k : preds[static_cast<size_t>(i)]) stack.push_back(k);
      }
      for (int a = 0; a < n; ++a) {
        ordered += seen[static_cast<size_t>(a)];
        if (expect_acyclic) {
          ASSERT_EQ(hb.before(a, b), seen[static_cast<size_t>(a)] != 0) << what << ": " << a << " before " << b;
        }
      }
    }
    EXPECT_GT(ordered, static_cast<size_t>(n)) << what;  // the waits do order things
  };
  std::mt19937 rng(7);
  for (const auto& r : real_programs()) {
    const Program& p = r.program;
    check(r.what, p, true);
    std::vector<size_t> with_waits;
    for (size_t i = 0; i < p.instrs.size(); ++i)
      if (!p.instrs[i].waits.empty()) with_waits.push_back(i);
    auto pick = [&](size_t n) { return static_cast<size_t>(std::uniform_int_distribution<size_t>(0, n - 1)(rng)); };
    Program dropped = p;
    auto& in = dropped.instrs[with_waits[pick(with_waits.size())]];
    in.waits.erase(in.waits.begin() + static_cast<std::ptrdiff_t>(pick(in.waits.size())));
    check(r.what + " dropped wait", dropped, true);
    Program miscounted = p;
    miscounted.instrs[with_waits[pick(with_waits.size())]].waits[0].count += 1;  // orders nothing now
    check(r.what + " miscounted wait", miscounted, true);
    Program cyclic = p;  // the first waiting instruction also waits on the last instruction's counter
    const Instr& last = p.instrs.back();
    cyclic.instrs[with_waits.front()].waits.push_back({last.signal, p.counters[static_cast<size_t>(last.signal)].signals_per_step});
    check(r.what + " cyclic", cyclic, false);
  }
}

TEST(Validator, RejectsEveryUnsafeMutation) {
  auto reals = real_programs();
  std::mt19937 rng(12345);
  auto pick = [&](size_t n) { return static_cast<size_t>(std::uniform_int_distribution<size_t>(0, n - 1)(rng)); };
  struct Tally {
    int unsafe = 0, rejected = 0, safe = 0, safe_accepted = 0;
  };
  std::map<std::string, Tally> tally;
  int total_unsafe = 0;
  auto judge = [&](const std::string& kind, const std::string& what, const Program& m) {
    std::string why;
    bool safe = oracle_safe(m, &why);
    bool accepted = check_program(m).empty();
    Tally& t = tally[kind];
    if (safe) {
      t.safe++;
      t.safe_accepted += accepted;
    } else {
      t.unsafe++;
      total_unsafe++;
      t.rejected += !accepted;
      EXPECT_FALSE(accepted) << kind << " on " << what << " is unsafe (" << why << ") but the validator accepted it";
    }
  };
  // Mutate a handful of programs of different shapes and schedules.
  for (size_t ri : {size_t{1}, size_t{5}, size_t{8}, size_t{12}, reals.size() - 2, reals.size() - 1}) {
    const Real& real = reals[ri];
    const Program& p = real.program;
    const size_t n = p.instrs.size();
    std::vector<size_t> with_waits;
    for (size_t i = 0; i < n; ++i)
      if (!p.instrs[i].waits.empty()) with_waits.push_back(i);
    for (int k = 0; k < 20; ++k) {  // drop a wait
      Program m = p;
      auto& in = m.instrs[with_waits[pick(with_waits.size())]];
      in.waits.erase(in.waits.begin() + static_cast<std::ptrdiff_t>(pick(in.waits.size())));
      judge("drop a wait", real.what, m);
    }
    for (int k = 0; k < 10; ++k) {  // lower / raise a wait count
      Program m = p;
      auto& in = m.instrs[with_waits[pick(with_waits.size())]];
      in.waits[pick(in.waits.size())].count -= 1;
      judge("lower a wait count", real.what, m);
      Program m2 = p;
      auto& in2 = m2.instrs[with_waits[pick(with_waits.size())]];
      in2.waits[pick(in2.waits.size())].count += 1;
      judge("raise a wait count", real.what, m2);
    }
    for (int k = 0; k < 20; ++k) {  // swap two instructions (adjacent or anywhere), workers keep theirs
      Program m = p;
      size_t a = pick(n - 1), b = k % 2 ? a + 1 : pick(n);
      std::swap(m.instrs[a], m.instrs[b]);
      for (auto& l : m.lists)
        for (auto& i : l) i = i == static_cast<int32_t>(a) ? static_cast<int32_t>(b) : i == static_cast<int32_t>(b) ? static_cast<int32_t>(a) : i;
      judge("swap two instructions", real.what, m);
    }
    std::vector<int> acts;
    for (size_t b = 0; b < p.buffers.size(); ++b)
      if (p.buffers[b].kind == BufferKind::activation) acts.push_back(static_cast<int>(b));
    for (int k = 0; k < 15; ++k) {  // alias two buffers: one op's input with its output, or any two
      Program m = p;
      int a, b;
      if (k % 2 == 0) {
        const OpDesc& o = m.ops[pick(m.ops.size())];
        if (o.x < 0 || m.buffers[static_cast<size_t>(o.x)].kind != BufferKind::activation ||
            m.buffers[static_cast<size_t>(o.out)].kind != BufferKind::activation) {
          --k;
          continue;
        }
        a = o.x, b = o.out;
      } else {
        a = acts[pick(acts.size())], b = acts[pick(acts.size())];
        if (a == b) { --k; continue; }
      }
      m.buffers[static_cast<size_t>(b)].offset = m.buffers[static_cast<size_t>(a)].offset;
      if (m.buffers[static_cast<size_t>(b)].offset + m.buffers[static_cast<size_t>(b)].bytes() > m.arena_bytes) {
        --k;
        continue;
      }
      judge("alias two buffers", real.what, m);
    }
    for (int k = 0; k < 10; ++k) {  // remove a signal
      Program m = p;
      m.instrs[pick(n)].signal = -1;
      judge("remove a signal", real.what, m);
    }
  }
  for (const auto& [kind, t] : tally)
    std::printf("  %-22s unsafe %3d (rejected %3d)   safe %3d (accepted %3d)\n", kind.c_str(), t.unsafe, t.rejected,
                t.safe, t.safe_accepted);
  EXPECT_GE(total_unsafe, 200) << "the suite must hold at least 200 unsafe mutants";
  // Reordering independent instructions is a legitimate schedule: the validator must not reject it.
  EXPECT_EQ(tally["swap two instructions"].safe, tally["swap two instructions"].safe_accepted);
}

TEST(Validator, ReportsWhatIsWrong) {
  ModelFile stories = load_model(kStories + "stories260K.bin");
  Graph g = build_graph(stories, BuildOptions{32, false});
  CompileOptions co;
  co.workers = 2;
  co.max_tokens = 4;
  Program p = compile_program(g, co);
  size_t j = 0;
  while (p.instrs[j].opcode != Opcode::attention) ++j;
  Program m = p;
  m.instrs[j].waits.erase(m.instrs[j].waits.begin());
  auto issues = check_program(m);
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues[0].find("race (read-after-write)"), std::string::npos) << issues[0];
  m = p;
  m.instrs[j].waits[0].count++;
  issues = check_program(m);
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues[0].find("waits for"), std::string::npos) << issues[0];
  EXPECT_THROW(validate_program(m), Error);
}
