// Pass "memplan": byte offsets for every buffer.
//
// Inputs (tokens, positions) are pinned at the start of the arena. Activations share the rest by
// liveness: buffer B may take memory that buffer A used when every instruction touching A happens
// before (through counter waits, see order.h) every instruction writing B — then B's readers, which
// wait for B's writers, come after A's last use too, so no write-after-read or write-after-write
// hazard exists without adding a single wait. Graph outputs are never overwritten. Placement is
// first fit in the order buffers are first used. KV caches get their own storage, one after another.
#include <algorithm>
#include <map>

#include "passes/order.h"
#include "passes/pass.h"

namespace mk {

namespace {
constexpr int64_t kAlign = 64;
int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void run_memplan(PassContext& cx) {
  Program& p = cx.program;
  const size_t nb = p.buffers.size();
  HappensBefore hb = happens_before(p);
  std::vector<std::vector<int>> touch(nb), writes(nb);
  for (size_t i = 0; i < p.instrs.size(); ++i)
    for (const Access& a : instr_accesses(p, p.instrs[i])) {
      auto& t = touch[static_cast<size_t>(a.buffer)];
      if (t.empty() || t.back() != static_cast<int>(i)) t.push_back(static_cast<int>(i));
      if (a.write) writes[static_cast<size_t>(a.buffer)].push_back(static_cast<int>(i));
    }
  int64_t arena = 0, kv = 0;
  for (Buffer& b : p.buffers) {
    if (b.kind == BufferKind::input) {
      b.offset = arena;
      arena = align_up(arena + b.bytes());
    } else if (b.kind == BufferKind::kv) {
      b.offset = kv;
      kv = align_up(kv + b.bytes());
    }
  }
  const int64_t base = arena;
  std::vector<int> order;
  for (size_t b = 0; b < nb; ++b)
    if (p.buffers[b].kind == BufferKind::activation) order.push_back(static_cast<int>(b));
  auto first_use = [&](int b) { return touch[static_cast<size_t>(b)].empty() ? 1 << 30 : touch[static_cast<size_t>(b)].front(); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return first_use(a) < first_use(b); });
  // The counters signalled by the instructions touching each buffer: happens-before depends on an
  // instruction's counter only (order.h).
  std::vector<std::vector<int>> touch_counters(nb);
  for (size_t b = 0; b < nb; ++b) {
    auto& tc = touch_counters[b];
    for (int u : touch[b]) tc.push_back(p.instrs[static_cast<size_t>(u)].signal);
    std::sort(tc.begin(), tc.end());
    tc.erase(std::unique(tc.begin(), tc.end()), tc.end());
  }
  // A's memory is free for B: all of A's uses happen before all of B's writes.
  auto dead_before = [&](int a, int b) {
    if (p.buffers[static_cast<size_t>(a)].is_output) return false;
    for (int w : writes[static_cast<size_t>(b)])
      for (int s : touch_counters[static_cast<size_t>(a)])
        if (!hb.counter_before(s, w)) return false;
    return true;
  };
  std::map<std::pair<int, int>, bool> memo;
  std::vector<int> placed;
  for (int b : order) {
    Buffer& B = p.buffers[static_cast<size_t>(b)];
    std::vector<int64_t> cand = {base};
    for (int a : placed) cand.push_back(align_up(p.buffers[static_cast<size_t>(a)].offset + p.buffers[static_cast<size_t>(a)].bytes()));
    std::sort(cand.begin(), cand.end());
    for (int64_t off : cand) {
      bool ok = true;
      for (int a : placed) {
        const Buffer& A = p.buffers[static_cast<size_t>(a)];
        if (off >= A.offset + A.bytes() || A.offset >= off + B.bytes()) continue;
        auto key = std::make_pair(a, b);
        auto it = memo.find(key);
        if (it == memo.end()) it = memo.emplace(key, dead_before(a, b)).first;
        if (!it->second) {
          ok = false;
          break;
        }
      }
      if (ok) {
        B.offset = off;
        break;
      }
    }
    placed.push_back(b);
    arena = std::max(arena, align_up(B.offset + B.bytes()));
  }
  p.arena_bytes = arena;
  p.kv_bytes = kv;
}

}  // namespace mk
