// Continuous-batching engine (runtime/engine.h) and KV block allocator (runtime/kv_blocks.h) on a
// fake backend: a deterministic toy whose logits are a hash of the tokens of the row's sequence,
// read through the block table from the KV pool it writes. A wrong block table, a block written while
// another live sequence holds it, a cached prefix block holding other tokens or a stale block changes
// the logits (or throws), so "batched == alone" checks the tables.
#include <atomic>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/utf8.h"
#include "archs/arch.h"
#include "runtime/embed.h"
#include "runtime/engine.h"
#include "runtime/json_prefix.h"
#include "runtime/kv_blocks.h"
#include "runtime/session.h"
#include "runtime/tool_calls.h"
#include "model/tokenizer.h"
#include "support/error.h"

namespace mk {
namespace {

constexpr int32_t kPoison = 7;  // a prompt holding this token makes the fake backend throw

class FakeBackend : public Backend {
 public:
  FakeBackend(int64_t n_vocab, int64_t block_size, int64_t n_blocks, int64_t max_rows, bool paged = true)
      : n_vocab_(n_vocab),
        block_size_(block_size),
        n_blocks_(n_blocks),
        max_rows_(max_rows),
        paged_(paged),
        pool_(static_cast<size_t>(n_blocks * block_size), -1) {}
  std::string name() const override { return "fake"; }
  int64_t kv_block_size() const override { return paged_ ? block_size_ : 0; }
  int64_t kv_pool_blocks() const override { return paged_ ? n_blocks_ : 0; }
  int64_t max_batch_rows() const override { return paged_ ? max_rows_ : 0; }
  void reset() override { cache_.clear(); }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_past) override {
    if (paged_) throw Error("fake: paged backend called without a batch");
    if (n_past != static_cast<int64_t>(cache_.size())) throw Error("fake: n_past does not match the cache");
    cache_.insert(cache_.end(), tokens.begin(), tokens.end());
    for (int32_t t : tokens)
      if (t == kPoison) throw Error("fake: poisoned token");
    ++steps;
    return logits_of(cache_);
  }

  std::vector<float> forward(const StepBatch& b) override {
    if (!paged_) return Backend::forward(b);
    if (b.n_rows() == 0 || b.n_rows() > max_rows_) throw Error("fake: bad number of rows");
    // Rows of a sequence consecutive with consecutive positions; tables inside the pool; a block in
    // two tables (a shared prefix) is only read.
    std::set<int32_t> seen_seq;
    std::map<int32_t, int> tables_of;
    for (int64_t r = 0; r < b.n_rows(); ++r) {
      int32_t s = b.seq[r];
      bool continues = r > 0 && b.seq[r - 1] == s;
      if (!continues && !seen_seq.insert(s).second) throw Error("fake: rows of a sequence are not consecutive");
      if (continues && b.positions[r] != b.positions[r - 1] + 1) throw Error("fake: positions not consecutive");
    }
    for (const auto& t : b.block_tables)
      for (int32_t blk : t) {
        if (blk < 0 || blk >= n_blocks_) throw Error("fake: block outside the pool");
        ++tables_of[blk];
      }
    for (int64_t r = 0; r < b.n_rows(); ++r) {
      if (b.tokens[r] == kPoison) throw Error("fake: poisoned token");
      if (tables_of[static_cast<int32_t>(pool_row(b, r, b.positions[r]) / block_size_)] > 1)
        throw Error("fake: a row writes a block that another sequence holds");
      pool_[static_cast<size_t>(pool_row(b, r, b.positions[r]))] = b.tokens[r];
    }
    std::vector<float> out;
    for (int32_t r : b.logit_rows) {
      std::vector<int32_t> seq_tokens;
      for (int32_t p = 0; p <= b.positions[r]; ++p) {
        int32_t t = pool_[static_cast<size_t>(pool_row(b, r, p))];
        if (t < 0) throw Error("fake: attends to a KV row never written");
        seq_tokens.push_back(t);
      }
      auto l = logits_of(seq_tokens);
      out.insert(out.end(), l.begin(), l.end());
    }
    ++steps;
    max_rows_seen = std::max(max_rows_seen, b.n_rows());
    max_seqs_seen = std::max(max_seqs_seen, static_cast<int64_t>(b.block_tables.size()));
    bool has_decode = false, has_prefill = false;
    for (size_t s = 0; s < b.block_tables.size(); ++s) {
      int64_t n = std::count(b.seq.begin(), b.seq.end(), static_cast<int32_t>(s));
      (n == 1 ? has_decode : has_prefill) = true;
    }
    mixed_steps += has_decode && has_prefill;
    return out;
  }

  int64_t steps = 0, max_rows_seen = 0, max_seqs_seen = 0, mixed_steps = 0;
  // > 0: the logits depend on the last `window` tokens only (every row is still read back through
  // the block tables), so greedy replies fall into cycles that prompt lookup can draft.
  int64_t window = 0;
  float boost = 6;  // added to one token's logit (the others within +-4)

 private:
  int64_t pool_row(const StepBatch& b, int64_t r, int64_t p) const {
    const auto& table = b.block_tables[static_cast<size_t>(b.seq[r])];
    if (p / block_size_ >= static_cast<int64_t>(table.size())) throw Error("fake: position past the block table");
    return table[static_cast<size_t>(p / block_size_)] * block_size_ + p % block_size_;
  }
  // A smooth, seed-sensitive distribution whose argmax depends on every token of the sequence.
  std::vector<float> logits_of(const std::vector<int32_t>& toks) const {
    uint64_t h = 1469598103934665603ull;
    const size_t from = window > 0 && toks.size() > static_cast<size_t>(window) ? toks.size() - static_cast<size_t>(window) : 0;
    for (size_t i = from; i < toks.size(); ++i) h = (h ^ static_cast<uint64_t>(toks[i] + 1)) * 1099511628211ull;
    std::vector<float> l(static_cast<size_t>(n_vocab_));
    for (int64_t v = 0; v < n_vocab_; ++v)
      l[v] = static_cast<float>(std::sin(static_cast<double>((h >> 17) % 10007) * 0.001 + v * 0.37) * 4);
    l[(h >> 29) % static_cast<uint64_t>(n_vocab_)] += boost;
    l[kPoison] = -1e30f;  // never generated: only a prompt can hold it
    return l;
  }
  int64_t n_vocab_, block_size_, n_blocks_, max_rows_;
  bool paged_;
  std::vector<int32_t> pool_, cache_;
};

EngineOptions engine_options(int parallel, int64_t n_ctx = 128, int64_t n_vocab = 64) {
  EngineOptions o;
  o.parallel = parallel;
  o.max_queue = 64;
  o.n_ctx = n_ctx;
  o.n_vocab = n_vocab;
  return o;
}

RequestParams make_request(int i) {
  RequestParams p;
  for (int k = 0; k < 1 + (i * 7) % 23; ++k) p.prompt_ids.push_back(10 + (i * 13 + k * 5) % 50);
  p.max_tokens = 3 + (i * 5) % 17;
  p.sampler.temperature = i % 3 == 0 ? 0.0f : 0.9f;
  p.sampler.top_k = i % 2 ? 0 : 20;
  p.sampler.top_p = 0.95f;
  p.sampler.seed = 1000 + static_cast<uint64_t>(i);
  return p;
}

void run_until_idle(Engine& e) {
  for (int guard = 0; e.step(); ++guard) ASSERT_LT(guard, 100000);
}

RequestOutput collect(Request& r) {
  RequestOutput out;
  while (!out.done) r.wait(out, std::chrono::milliseconds(10));
  return out;
}

// Generated ids of each request run alone on a fresh engine and backend.
std::vector<std::vector<int32_t>> run_alone(int n, bool paged) {
  std::vector<std::vector<int32_t>> r;
  for (int i = 0; i < n; ++i) {
    FakeBackend b(64, 4, 64, 64, paged);
    Engine e(b, nullptr, engine_options(1));
    auto req = e.submit(make_request(i));
    run_until_idle(e);
    RequestOutput out = collect(*req);
    EXPECT_EQ(out.finish, FinishReason::length) << out.error;
    r.push_back(out.token_ids);
  }
  return r;
}

TEST(KvBlocks, AllocateReleaseAndExhaustion) {
  KvBlockAllocator a(5, 16);
  EXPECT_EQ(a.blocks_for(0), 0);
  EXPECT_EQ(a.blocks_for(16), 1);
  EXPECT_EQ(a.blocks_for(17), 2);
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE(a.allocate(3, t1));
  EXPECT_EQ(t1, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(a.allocate(3, t2));  // only 2 free: takes none
  EXPECT_TRUE(t2.empty());
  EXPECT_EQ(a.n_used(), 3);
  ASSERT_TRUE(a.allocate(2, t2));
  EXPECT_EQ(a.n_free(), 0);
  a.release(t1);
  EXPECT_TRUE(t1.empty());
  EXPECT_EQ(a.n_free(), 3);
  a.release(t2);
  EXPECT_EQ(a.n_used(), 0);
  EXPECT_THROW(KvBlockAllocator(0, 16), Error);
  EXPECT_THROW(KvBlockAllocator(4, 0), Error);
}

// Prefix caching: blocks keyed by their tokens chained to the prefix before them are cached when
// released, found again by a sequence beginning with the same tokens (whole blocks only, up to a
// limit), shared while held, and evicted last-block-first once the free list is empty.
TEST(KvBlocks, PrefixCacheKeysSharesAndEvicts) {
  KvBlockAllocator a(6, 2);
  const std::vector<int32_t> toks = {5, 6, 7, 8, 9, 10, 11};
  std::vector<int32_t> t1;
  ASSERT_TRUE(a.allocate(4, t1));
  uint64_t key = 0;
  for (size_t i = 0; i < 3; ++i) key = a.add_key(t1[i], key, std::span<const int32_t>(toks).subspan(2 * i, 2));
  EXPECT_EQ(key, KvBlockAllocator::chain_key(KvBlockAllocator::chain_key(KvBlockAllocator::chain_key(0, {{5, 6}}), {{7, 8}}),
                                             {{9, 10}}));
  // Held by t1 and found: shared (two references).
  std::vector<int32_t> t2;
  uint64_t k2 = 0;
  EXPECT_EQ(a.acquire_prefix(toks, 2, t2, k2), 2);  // at most 2 blocks asked
  EXPECT_EQ(t2, std::vector<int32_t>(t1.begin(), t1.begin() + 2));
  EXPECT_EQ(k2, KvBlockAllocator::chain_key(KvBlockAllocator::chain_key(0, {{5, 6}}), {{7, 8}}));
  EXPECT_EQ(a.n_used(), 4);
  a.release(t1);  // blocks 0, 1 still held by t2; 2 cached; 3 (never keyed) free
  EXPECT_EQ(a.n_used(), 2);
  EXPECT_EQ(a.n_cached(), 1);
  a.release(t2);
  EXPECT_EQ(a.n_used(), 0);
  EXPECT_EQ(a.n_cached(), 3);
  EXPECT_EQ(a.n_free(), 6);
  // Another second block: only the first matches. Another first block: nothing (a key names the prefix).
  std::vector<int32_t> t3;
  uint64_t k3 = 0;
  EXPECT_EQ(a.acquire_prefix(std::vector<int32_t>{5, 6, 7, 9, 9, 10}, 3, t3, k3), 1);
  EXPECT_EQ(t3, (std::vector<int32_t>{0}));
  EXPECT_EQ(a.acquire_prefix(std::vector<int32_t>{4, 6, 7, 8}, 2, t3, k3), 0);
  EXPECT_EQ(a.n_cached(), 2);
  a.release(t3);
  // Plain free blocks go first (3 of them: 3, 4, 5), then the cached prefix from its end (block 2).
  std::vector<int32_t> t4;
  ASSERT_TRUE(a.allocate(4, t4));
  EXPECT_EQ(std::set<int32_t>(t4.begin(), t4.end()), (std::set<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(a.n_cached(), 2);
  std::vector<int32_t> t5;
  uint64_t k5 = 0;
  EXPECT_EQ(a.acquire_prefix(toks, 3, t5, k5), 2);  // block 2 lost its key
  EXPECT_EQ(a.n_free(), 0);
  EXPECT_FALSE(a.allocate(1, t5));
  a.release(t4);
  a.release(t5);
  EXPECT_EQ(a.n_used(), 0);
}

TEST(StopStrings, FindsEarliestAndHoldsBackPrefixes) {
  EXPECT_EQ(scan_stop_strings("hello world", {"wor", "lo"}).found, 3u);
  StopScan s = scan_stop_strings("the end of", {"of the"});
  EXPECT_EQ(s.found, std::string::npos);
  EXPECT_EQ(s.safe, std::string("the end ").size());  // "of" may begin "of the"
  EXPECT_EQ(scan_stop_strings("abc", {}).safe, 3u);
  EXPECT_EQ(scan_stop_strings("abc", {"x"}).safe, 3u);
  EXPECT_EQ(scan_stop_strings("ab\xc3\xa9", {"\xc3\xa9t"}).safe, 2u);  // "é" may begin "ét"
}

TEST(Engine, BatchedEqualsAloneAndFreesEveryBlock) {
  const int n = 12;
  auto alone = run_alone(n, true);
  // 5 rows per step: prompts are read in chunks interleaved with the decode rows; a 24-block pool
  // (96 rows) cannot hold all 4 sequences' reservations at once, so admission waits for blocks.
  FakeBackend b(64, 4, 24, 5);
  Engine e(b, nullptr, engine_options(4));
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < n; ++i) reqs.push_back(e.submit(make_request(i)));
  run_until_idle(e);
  for (int i = 0; i < n; ++i) {
    RequestOutput out = collect(*reqs[i]);
    EXPECT_EQ(out.finish, FinishReason::length) << i << " " << out.error;
    EXPECT_EQ(out.token_ids, alone[i]) << "request " << i;
    EXPECT_EQ(out.n_generated, static_cast<int64_t>(alone[i].size()));
    EXPECT_EQ(out.n_prompt, static_cast<int64_t>(make_request(i).prompt_ids.size()));
  }
  EXPECT_GT(b.max_seqs_seen, 1);
  EXPECT_EQ(b.max_rows_seen, 5);
  EXPECT_GT(b.mixed_steps, 0);  // chunked prefill interleaved with decode
  EngineStats st = e.stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.kv_blocks_free, 24);
  EXPECT_EQ(st.prompt_tokens_cached, 0u);  // no prompt begins as another's for a whole block
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queue_depth, 0);
  EXPECT_EQ(st.finished["length"], static_cast<uint64_t>(n));
  uint64_t gen = 0;
  for (auto& a : alone) gen += a.size();
  EXPECT_EQ(st.generated_tokens, gen);
  EXPECT_EQ(st.ttft.count, static_cast<uint64_t>(n));
  EXPECT_EQ(st.itl.count, gen - n);
  std::string prom = prometheus_text(st);
  EXPECT_NE(prom.find("megakernel_kv_blocks_used 0\n"), std::string::npos);
  EXPECT_NE(prom.find(fmt::format("megakernel_generated_tokens_total {}\n", gen)), std::string::npos);
  EXPECT_NE(prom.find("megakernel_time_to_first_token_seconds_count 12\n"), std::string::npos);
}

// Prompt lookup (RequestParams::draft): requests draft from their prompt and reply, each step's
// drafts checked in the batch beside other requests' rows, and get the tokens they get alone without
// drafts, in fewer steps: greedy ones, sampled ones (a draft's row drawn only after the row before it
// chose the draft, with the same random numbers and penalty window), with logprobs (the same
// entries). The fake reads every row back through the block tables (a draft past the reserved
// blocks or a rejected draft's row read later would fail it); every block is free at the end.
TEST(Engine, DraftsGiveTheSameTokensInFewerSteps) {
  auto request = [](int i, int draft) {
    RequestParams p = make_request(i);
    p.max_tokens = 30 + i % 7;
    p.sampler.temperature = 0;
    if (i % 4 == 1) p.sampler.temperature = 0.7f, p.sampler.top_k = 20;  // the backend's candidates
    if (i % 4 == 2) {                                                      // whole rows
      p.sampler.temperature = 0.7f, p.sampler.top_k = 0, p.sampler.repeat_penalty = 1.05f;
      p.sampler.presence_penalty = 0.1f, p.sampler.penalty_last_n = 8;
    }
    if (i % 4 == 3) p.logprobs = 2;
    p.draft = draft;
    return p;
  };
  const int n = 12;
  std::vector<RequestOutput> alone;
  for (int i = 0; i < n; ++i) {
    FakeBackend b(64, 4, 64, 64);
    b.window = 3;
    b.boost = 9;  // replies fall into cycles, sampled ones with detours
    Engine e(b, nullptr, engine_options(1));
    auto req = e.submit(request(i, 0));
    run_until_idle(e);
    alone.push_back(collect(*req));
  }
  auto steps_without = [&](int64_t max_rows) {
    FakeBackend b(64, 4, 64, max_rows);
    b.window = 3;
    b.boost = 9;  // replies fall into cycles, sampled ones with detours
    Engine e(b, nullptr, engine_options(4));
    for (int i = 0; i < n; ++i) e.submit(request(i, 0));
    run_until_idle(e);
    return b.steps;
  };
  for (const int64_t max_rows : {64, 6}) {  // 6: drafts squeezed by the other rows
    FakeBackend b(64, 4, 64, max_rows);
    b.window = 3;
    b.boost = 9;  // replies fall into cycles, sampled ones with detours
    Engine e(b, nullptr, engine_options(4));
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < n; ++i) reqs.push_back(e.submit(request(i, 5)));
    run_until_idle(e);
    for (int i = 0; i < n; ++i) {
      RequestOutput out = collect(*reqs[i]);
      EXPECT_EQ(out.finish, FinishReason::length) << i << " " << out.error;
      EXPECT_EQ(out.token_ids, alone[i].token_ids) << "request " << i << ", " << max_rows << " rows a step";
      ASSERT_EQ(out.logprobs.size(), alone[i].logprobs.size()) << i;
      for (size_t k = 0; k < out.logprobs.size(); ++k) {
        EXPECT_EQ(out.logprobs[k].token.logprob, alone[i].logprobs[k].token.logprob) << i << " token " << k;
        ASSERT_EQ(out.logprobs[k].top.size(), 2u);
        EXPECT_EQ(out.logprobs[k].top[1].id, alone[i].logprobs[k].top[1].id) << i << " token " << k;
      }
    }
    const EngineStats st = e.stats();
    EXPECT_GT(st.draft_tokens_accepted, 40u) << st.draft_tokens;
    if (max_rows == 64) {
      EXPECT_LT(st.draft_tokens_accepted, st.draft_tokens);  // some refused too (a 2-gram's earlier follower)
    }
    EXPECT_EQ(st.kv_blocks_used, 0);
    EXPECT_NE(prometheus_text(st).find(fmt::format("megakernel_draft_tokens_accepted_total {}\n", st.draft_tokens_accepted)), std::string::npos);
    EXPECT_LT(b.steps, steps_without(max_rows)) << max_rows;
  }
}

// Prefix caching in the engine: a prompt that begins with whole blocks an earlier request computed
// (its prompt, or its prompt and generated tokens: a chat's next turn) starts after them, while
// that request still runs or after it ended, and gets the tokens it gets alone without the cache
// (the fake's logits are a function of the tokens it reads back through the block tables). The last
// prompt token is always computed (its row gives the first logits); every block is free at the end.
TEST(Engine, PrefixCacheSkipsSharedPromptBlocksAndChangesNoToken) {
  const std::vector<int32_t> shared = {30, 31, 32, 33, 34, 35, 36, 37, 38};  // 2 whole blocks of 4, and one more
  auto request = [&](std::vector<int32_t> tail, int64_t max_tokens, size_t keep = 9) {
    RequestParams p;
    p.prompt_ids.assign(shared.begin(), shared.begin() + static_cast<long>(keep));
    p.prompt_ids.insert(p.prompt_ids.end(), tail.begin(), tail.end());
    p.max_tokens = max_tokens;
    p.sampler.temperature = 0.7f;
    p.sampler.seed = 5;
    return p;
  };
  auto alone = [](const RequestParams& p) {
    FakeBackend b(64, 4, 64, 5);
    EngineOptions o = engine_options(1);
    o.prefix_cache = false;
    Engine e(b, nullptr, o);
    auto r = e.submit(p);
    run_until_idle(e);
    RequestOutput out = collect(*r);
    EXPECT_EQ(out.n_cached, 0);
    return out.token_ids;
  };
  // One after another: A, then prompts sharing 2 blocks with it, an 8-token prompt (1 block: its last
  // token is computed), and A's prompt + A's reply + one token (4 blocks, 2 of them generated rows).
  {
    FakeBackend b(64, 4, 64, 5);
    Engine e(b, nullptr, engine_options(4));
    const RequestParams a = request({20, 21}, 8);
    auto ra = e.submit(a);
    run_until_idle(e);
    const RequestOutput out_a = collect(*ra);
    EXPECT_EQ(out_a.token_ids, alone(a));
    EXPECT_EQ(out_a.n_cached, 0);
    RequestParams next_turn = a;
    next_turn.prompt_ids.insert(next_turn.prompt_ids.end(), out_a.token_ids.begin(), out_a.token_ids.end());
    next_turn.prompt_ids.push_back(40);  // 11 + 8 + 1 = 20 tokens; A computed rows 0..17
    const std::vector<std::pair<RequestParams, int64_t>> cases = {
        {request({22}, 6), 8}, {a, 8}, {request({}, 5, 8), 4}, {request({23, 24, 25, 26, 27}, 3), 8}, {next_turn, 16}};
    uint64_t cached = 0;
    for (const auto& [p, want_cached] : cases) {
      const int64_t rows_before = static_cast<int64_t>(e.stats().batch_rows);
      auto r = e.submit(p);
      run_until_idle(e);
      const RequestOutput out = collect(*r);
      EXPECT_EQ(out.token_ids, alone(p)) << p.prompt_ids.size();
      EXPECT_EQ(out.n_cached, want_cached) << p.prompt_ids.size();
      // Rows computed: the prompt past the cached part, and every generated token but the last.
      EXPECT_EQ(static_cast<int64_t>(e.stats().batch_rows) - rows_before,
                static_cast<int64_t>(p.prompt_ids.size()) - want_cached + out.n_generated - 1);
      cached += static_cast<uint64_t>(want_cached);
    }
    const EngineStats st = e.stats();
    EXPECT_EQ(st.prompt_tokens_cached, cached);
    EXPECT_EQ(st.kv_blocks_used, 0);
    EXPECT_EQ(st.kv_blocks_free, 64);
    EXPECT_GT(st.kv_blocks_cached, 4);
    EXPECT_NE(prometheus_text(st).find(fmt::format("megakernel_prompt_tokens_cached_total {}\n", cached)), std::string::npos);
  }
  // While A still runs: B and C take A's first two blocks (held by both), compute their own rows in
  // blocks of their own, and a 12-block pool makes admission evict cached blocks for D.
  {
    FakeBackend b(64, 4, 12, 5);
    Engine e(b, nullptr, engine_options(4));
    const RequestParams a = request({20, 21}, 12), bb = request({22}, 9), c = request({20, 21}, 6);
    auto ra = e.submit(a);
    for (int i = 0; i < 4; ++i) e.step();  // A's 11 prompt rows at 5 a step, then a decode step
    auto rb = e.submit(bb), rc = e.submit(c);
    RequestParams d;
    d.prompt_ids = {50, 51, 52, 53, 54, 55, 56, 57, 58};
    d.max_tokens = 14;  // 6 blocks: waits for A's and B's blocks
    auto rd = e.submit(d);
    run_until_idle(e);
    EXPECT_EQ(collect(*ra).token_ids, alone(a));
    for (const auto& [r, p] : {std::pair{rb, bb}, std::pair{rc, c}}) {
      const RequestOutput out = collect(*r);
      EXPECT_EQ(out.token_ids, alone(p));
      EXPECT_EQ(out.n_cached, 8);
    }
    const RequestOutput out_d = collect(*rd);
    EXPECT_EQ(out_d.token_ids, alone(d));
    EXPECT_EQ(out_d.n_cached, 0);
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
    EXPECT_EQ(e.stats().kv_blocks_free, 12);
  }
}

// serve's n > 1: choices after the first wait at the head of the queue until the first has read
// the prompt (RequestParams::after), then take its whole blocks from the prefix cache: the prompt is
// computed once, every choice gets the tokens it gets alone, and a shared RequestSignal counts news
// of every request that holds it.
TEST(Engine, FollowersWaitForTheirLeadersPromptAndShareItsBlocks) {
  auto choice = [](uint64_t seed) {
    RequestParams p;
    for (int k = 0; k < 14; ++k) p.prompt_ids.push_back(20 + k);  // 3 whole blocks of 4 and 2 more
    p.max_tokens = 6;
    p.sampler.temperature = 0.8f;
    p.sampler.seed = seed;
    return p;
  };
  auto alone = [](const RequestParams& p) {
    FakeBackend b(64, 4, 64, 8);
    Engine e(b, nullptr, engine_options(1));
    auto r = e.submit(p);
    run_until_idle(e);
    return collect(*r).token_ids;
  };
  FakeBackend b(64, 4, 64, 8);  // 8 rows a step: the leader's 14 prompt rows take two steps
  Engine e(b, nullptr, engine_options(4));
  auto signal = std::make_shared<RequestSignal>();
  std::vector<std::shared_ptr<Request>> reqs;
  for (uint64_t j = 0; j < 3; ++j) {
    RequestParams p = choice(40 + j);
    p.signal = signal;
    if (j > 0) p.after = reqs[0];
    reqs.push_back(e.submit(std::move(p)));
  }
  const uint64_t seen = signal->count();
  e.step();  // the leader's first 8 prompt rows; the followers wait
  EXPECT_EQ(e.stats().running, 1);
  EXPECT_EQ(e.stats().queue_depth, 2);
  EXPECT_FALSE(reqs[0]->prompt_read());
  EXPECT_FALSE(signal->wait_past(seen, std::chrono::milliseconds(0)));  // no news yet
  e.step();  // the rest of the prompt and the first token
  EXPECT_TRUE(reqs[0]->prompt_read());
  EXPECT_TRUE(signal->wait_past(seen, std::chrono::milliseconds(0)));
  run_until_idle(e);
  for (uint64_t j = 0; j < 3; ++j) {
    const RequestOutput out = collect(*reqs[j]);
    EXPECT_EQ(out.token_ids, alone(choice(40 + j))) << j;
    EXPECT_EQ(out.n_cached, j == 0 ? 0 : 12) << j;
  }
  // Rows computed: the prompt once and the two others' last 2 prompt rows; each choice's tokens but its last.
  EXPECT_EQ(e.stats().batch_rows, 14u + 2 * 2 + 3 * 5);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  // Without the prefix cache a follower still waits for its leader, then computes the prompt itself.
  EngineOptions o = engine_options(4);
  o.prefix_cache = false;
  FakeBackend b2(64, 4, 64, 8);
  Engine e2(b2, nullptr, o);
  auto lead = e2.submit(choice(40));
  RequestParams f = choice(41);
  f.after = lead;
  auto follow = e2.submit(f);
  run_until_idle(e2);
  EXPECT_EQ(collect(*follow).token_ids, alone(choice(41)));
  EXPECT_EQ(collect(*lead).token_ids, alone(choice(40)));
}

// Rows drawn from whole logits rows of a large vocabulary (top_k 0) are chosen on several threads
// (Engine::choose): each request still gets the tokens it gets alone, its seed's draws in order.
TEST(Engine, SampledRowsOfALargeVocabularyOnSeveralThreadsMatchAlone) {
  const int n = 8;
  const int64_t n_vocab = 8192;
  auto request = [](int i) {
    RequestParams p = make_request(i);
    p.sampler.temperature = 0.9f;
    p.sampler.top_k = 0;
    p.sampler.top_p = i % 2 ? 1.0f : 0.9f;
    p.max_tokens = 12;
    return p;
  };
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < n; ++i) {
    FakeBackend b(n_vocab, 4, 64, 64);
    Engine e(b, nullptr, engine_options(1, 128, n_vocab));
    auto req = e.submit(request(i));
    run_until_idle(e);
    alone.push_back(collect(*req).token_ids);
  }
  FakeBackend b(n_vocab, 4, 128, 64);
  Engine e(b, nullptr, engine_options(n, 128, n_vocab));
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < n; ++i) reqs.push_back(e.submit(request(i)));
  run_until_idle(e);
  for (int i = 0; i < n; ++i) {
    RequestOutput out = collect(*reqs[i]);
    EXPECT_EQ(out.finish, FinishReason::length) << out.error;
    EXPECT_EQ(out.token_ids, alone[i]) << "request " << i;
  }
  EXPECT_EQ(b.max_seqs_seen, n);  // every request in one step: rows chosen on several threads
}

TEST(Engine, SerialBackendWithoutPagedKvGivesTheSameTokens) {
  const int n = 6;
  auto paged = run_alone(n, true);
  FakeBackend b(64, 4, 0, 0, /*paged=*/false);
  Engine e(b, nullptr, engine_options(4));
  EXPECT_FALSE(e.paged());
  EXPECT_EQ(e.parallel(), 1);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < n; ++i) reqs.push_back(e.submit(make_request(i)));
  run_until_idle(e);
  for (int i = 0; i < n; ++i) EXPECT_EQ(collect(*reqs[i]).token_ids, paged[i]) << i;
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST(Engine, ThreadedSchedulerMatchesAlone) {
  const int n = 10;
  auto alone = run_alone(n, true);
  FakeBackend b(64, 4, 64, 8);
  Engine e(b, nullptr, engine_options(3));
  e.start();
  std::vector<RequestOutput> outs(n);
  std::vector<std::thread> clients;
  std::atomic<int> done{0};
  std::atomic<int> uncounted{0};
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      outs[i] = collect(*e.submit(make_request(i)));
      // A request is counted as finished before its client learns of the end (a /metrics scrape
      // after a reply's last byte counts it; the count used to come after the client was woken).
      const int d = ++done;
      if (e.stats().finished["length"] < static_cast<uint64_t>(d)) ++uncounted;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(uncounted.load(), 0);
  e.shutdown(false);
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(outs[i].token_ids, alone[i]) << i << " " << finish_reason_name(outs[i].finish) << " " << outs[i].error;
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  EXPECT_THROW(e.submit(make_request(0)), EngineBusy);  // shut down: refused
}

TEST(Engine, CancelTimeoutAndBackendErrorFreeBlocks) {
  FakeBackend b(64, 4, 64, 16);
  Engine e(b, nullptr, engine_options(4));
  RequestParams longp = make_request(1);
  longp.max_tokens = 100;
  auto cancelled = e.submit(longp);
  auto queued_cancel = e.submit(longp);
  RequestParams slow = make_request(2);
  slow.timeout = std::chrono::milliseconds(1);
  auto timed_out = e.submit(slow);
  RequestParams poison = make_request(3);
  poison.prompt_ids.push_back(kPoison);
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_GT(e.stats().kv_blocks_used, 0);
  cancelled->cancel();
  queued_cancel->cancel();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto failed = e.submit(poison);
  auto fine = e.submit(make_request(4));
  run_until_idle(e);
  EXPECT_EQ(collect(*cancelled).finish, FinishReason::cancelled);
  EXPECT_EQ(collect(*queued_cancel).finish, FinishReason::cancelled);
  EXPECT_EQ(collect(*timed_out).finish, FinishReason::timeout);
  RequestOutput f = collect(*failed);
  EXPECT_EQ(f.finish, FinishReason::error);
  EXPECT_NE(f.error.find("poisoned"), std::string::npos) << f.error;
  // The poisoned batch took down the rows it shared a step with; a later request still runs.
  (void)collect(*fine);
  auto after = e.submit(make_request(5));
  run_until_idle(e);
  EXPECT_EQ(collect(*after).finish, FinishReason::length);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST(Engine, FcfsAdmissionQueueBoundAndRequestChecks) {
  FakeBackend b(64, 4, 8, 16);  // 32 KV rows
  EngineOptions o = engine_options(4, 64);
  o.max_queue = 1;
  o.prefix_cache = false;  // bq would take a's first two blocks
  Engine e(b, nullptr, o);
  RequestParams big = make_request(0);
  big.prompt_ids.assign(10, 11);
  big.max_tokens = 11;  // 20 rows: 5 blocks
  RequestParams small = make_request(0);
  small.prompt_ids = {12};
  small.max_tokens = 2;  // 1 block
  auto a = e.submit(big);
  e.step();
  EXPECT_EQ(e.stats().running, 1);
  auto bq = e.submit(big);   // waits: 3 blocks free
  auto c = e.submit(small);  // would fit, but must not overtake bq
  e.step();
  EXPECT_EQ(e.stats().running, 1);
  EXPECT_EQ(e.stats().queue_depth, 2);
  // Full: 3 free slots + max_queue 1 = 4 waiting at most... only 2 wait, so two more fit, then 429.
  auto d = e.submit(small);
  auto f = e.submit(small);
  EXPECT_THROW(e.submit(small), EngineBusy);
  EXPECT_EQ(e.stats().requests_rejected, 1u);
  run_until_idle(e);
  for (auto* r : {&a, &bq, &c, &d, &f}) EXPECT_EQ(collect(**r).finish, FinishReason::length);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);

  RequestParams p = make_request(0);
  p.prompt_ids.assign(64, 1);
  EXPECT_THROW(e.submit(p), Error);  // prompt fills the context
  p.prompt_ids = {1, 64};
  EXPECT_THROW(e.submit(p), Error);  // outside the vocabulary
  p.prompt_ids = {1};
  p.max_tokens = 64;
  EXPECT_THROW(e.submit(p), Error);  // past the context
  p.max_tokens = -2;
  EXPECT_THROW(e.submit(p), Error);
  p.max_tokens = 1;
  p.prompt_logprobs = true;  // without logprobs >= 0
  EXPECT_THROW(e.submit(p), Error);
  p.prompt_logprobs = false;
  p.prompt_ids.clear();
  p.max_tokens = 1;
  EXPECT_THROW(e.submit(p), Error);
  p.prompt_ids = {1};
  p.max_tokens = 40;  // 40 rows > 32 in the pool
  EXPECT_THROW(e.submit(p), Error);
  p.max_tokens = 1;
  p.sampler.temperature = -1;
  EXPECT_THROW(e.submit(p), Error);
}

std::unique_ptr<Tokenizer> stories_tokenizer() {
  std::string path = std::string(MK_SHARED_DIR) + "/models/stories260K/tok512.bin";
  if (!std::filesystem::exists(path)) return nullptr;
  return load_llama2c_tokenizer(path, 512);
}

TEST(Engine, StopStringsEndTheTextAndAreNeverStreamed) {
  auto tok = stories_tokenizer();
  if (!tok) GTEST_SKIP() << "../shared/models/stories260K/tok512.bin not found";
  auto run = [&](std::vector<std::string> stop, std::vector<std::string>* pieces) {
    FakeBackend b(512, 4, 64, 16);
    Engine e(b, tok.get(), engine_options(2, 128, 512));
    RequestParams p;
    p.prompt_ids = tok->encode("Once upon a time", true);
    p.max_tokens = 40;
    p.ignore_eos = true;
    p.sampler.temperature = 0;
    p.stop = std::move(stop);
    auto r = e.submit(p);
    RequestOutput all;
    while (e.step()) {
      RequestOutput part;
      if (r->wait(part, std::chrono::milliseconds(0))) {
        if (pieces && !part.text.empty()) pieces->push_back(part.text);
        all.text += part.text;
        all.token_ids.insert(all.token_ids.end(), part.token_ids.begin(), part.token_ids.end());
        if (part.done) all.finish = part.finish;
      }
    }
    RequestOutput rest = collect(*r);
    all.text += rest.text;
    if (pieces && !rest.text.empty()) pieces->push_back(rest.text);
    all.finish = rest.done ? rest.finish : all.finish;
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
    return all;
  };
  RequestOutput full = run({}, nullptr);
  ASSERT_EQ(full.finish, FinishReason::length);
  ASSERT_GT(full.text.size(), 12u) << full.text;
  std::string stop = full.text.substr(full.text.size() / 2, 4);
  size_t at = full.text.find(stop);
  std::vector<std::string> pieces;
  RequestOutput cut = run({"\x01never", stop}, &pieces);
  EXPECT_EQ(cut.finish, FinishReason::stop);
  EXPECT_EQ(cut.text, full.text.substr(0, at));
  for (const auto& piece : pieces) EXPECT_EQ(piece.find(stop), std::string::npos) << piece;
}

// A token piece may be one byte of a UTF-8 character (byte-fallback tokens): the pieces a request
// publishes are always whole, valid UTF-8 (what the server writes as JSON), an invalid sequence
// becomes U+FFFD, and a request ending inside a character ends with U+FFFD. The fake backend's
// flat logits at temperature 1 sample stories260K's 256 byte tokens often.
TEST(Engine, PublishedPiecesAreValidUtf8) {
  auto tok = stories_tokenizer();
  if (!tok) GTEST_SKIP() << "../shared/models/stories260K/tok512.bin not found";
  auto valid = [](const std::string& s) {
    for (size_t i = 0; i < s.size();) {
      const utf8::SequenceScan scan = utf8::scan_sequence(s, i);
      if (!scan.complete) return false;
      i += scan.length;
    }
    return true;
  };
  int replacements = 0, pieces = 0;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    FakeBackend b(512, 4, 64, 16);
    Engine e(b, tok.get(), engine_options(2, 128, 512));
    RequestParams p;
    p.prompt_ids = tok->encode("Once upon a time", true);
    p.max_tokens = 60;
    p.ignore_eos = true;
    p.sampler.temperature = 1.0f;
    p.sampler.seed = seed;
    auto r = e.submit(p);
    std::string all;
    while (e.step()) {
      RequestOutput part;
      if (r->wait(part, std::chrono::milliseconds(0))) {
        EXPECT_TRUE(valid(part.text)) << "seed " << seed << ": " << nlohmann::json(part.text).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
        pieces += !part.text.empty();
        all += part.text;
      }
    }
    RequestOutput rest = collect(*r);
    EXPECT_TRUE(valid(rest.text));
    all += rest.text;
    EXPECT_NO_THROW((void)nlohmann::json(all).dump()) << "seed " << seed;  // strict dump: throws on invalid UTF-8
    for (size_t at = all.find("\xEF\xBF\xBD"); at != std::string::npos; at = all.find("\xEF\xBF\xBD", at + 1)) ++replacements;
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
  }
  EXPECT_GT(replacements, 0) << "no invalid or cut sequence was sampled: the test did not exercise the case";
  EXPECT_GT(pieces, 8 * 10);
}

// stories260K on the cpu backend, 2 threads, a context of 128.
SessionOptions stories_cpu_session() {
  SessionOptions so;
  so.model_path = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  so.backend = "cpu";
  so.backend_options.threads = 2;
  so.n_ctx = 128;
  return so;
}

// Each prompt run by `generate` alone (the one-sequence path of `run`), with the options `set`
// gives prompt i.
std::vector<GenerateResult> generate_alone(const SessionOptions& so, const std::vector<std::string>& prompts,
                                           const std::function<void(size_t, GenerateOptions&)>& set) {
  std::vector<GenerateResult> alone;
  Session one(so);
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions g;
    g.prompt = prompts[i];
    set(i, g);
    one.reset();
    alone.push_back(generate(one, g));
  }
  return alone;
}

// Request i = prompt_ids[i] with the n_new (as max_tokens) and the sampler `set` gives prompt i (the
// options generate_alone ran it with), all submitted to `e`, which then runs until idle.
std::vector<std::shared_ptr<Request>> submit_and_run(Engine& e, const std::vector<std::vector<int32_t>>& prompt_ids,
                                                     const std::function<void(size_t, GenerateOptions&)>& set) {
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    GenerateOptions g;
    set(i, g);
    RequestParams p;
    p.prompt_ids = prompt_ids[i];
    p.max_tokens = g.n_new;
    p.sampler = g.sampler;
    reqs.push_back(e.submit(p));
  }
  run_until_idle(e);
  return reqs;
}

// The real-backend tests' engine: 4 sequences, a context of 128, prompts read `prefill_chunk` rows
// at a time, stopping at BOS as the session's model does.
EngineOptions session_engine_options(const Session& s, int64_t prefill_chunk) {
  EngineOptions eo = engine_options(4, 128, s.hparams.n_vocab);
  eo.prefill_chunk = prefill_chunk;
  eo.stop_at_bos = s.stop_at_bos;
  return eo;
}

std::vector<std::vector<int32_t>> prompt_ids_of(const std::vector<GenerateResult>& alone) {
  std::vector<std::vector<int32_t>> ids;
  for (const GenerateResult& r : alone) ids.push_back(r.prompt_ids);
  return ids;
}

// The default KV pool (serve's --kv-tokens 0): kv_pool_seqs full contexts, each a whole number of
// blocks (3 x 100 rows took 19 blocks of 16 where 3 x 7 are needed), and no more sequences than a
// step's rows, all that can run at once (--parallel 300 at -c 64 sized the pool for 300).
TEST(E2EServeEngine, DefaultPoolHoldsEveryRequestAtFullContext) {
  SessionOptions so;
  so.model_path = "synth:stories260k";
  so.need_tokenizer = false;
  so.backend = "cpu";
  so.backend_options.threads = 1;
  so.n_ctx = 100;
  so.kv_pool_seqs = 3;
  {
    Session s(so);
    EXPECT_EQ(s.kv_pool_seqs, 3);
    EXPECT_EQ(s.backend->kv_pool_blocks(), 3 * 7);
  }
  so.n_ctx = 64;
  so.kv_pool_seqs = 300;
  Session s(so);
  EXPECT_EQ(s.kv_pool_seqs, 64);  // a step takes at most the context's rows
  EXPECT_EQ(s.backend->kv_pool_blocks(), 64 * 4);
  EXPECT_EQ(Engine(*s.backend, nullptr, engine_options(300, 64, s.hparams.n_vocab)).parallel(), 64);
}

// The real cpu backend over its paged KV pool: requests batched by the engine (chunked prefill of
// 7 rows, up to 4 sequences per step, greedy and seeded sampling) give the tokens of `generate`
// running each prompt alone on the one-sequence path (what `run` does).
TEST(E2EServeEngine, CpuBatchedEqualsGenerateAlone) {
  const SessionOptions so = stories_cpu_session();
  if (!std::filesystem::exists(so.model_path)) GTEST_SKIP() << so.model_path << " not found";
  const std::vector<std::string> prompts = {
      "Once upon a time", "The cat sat", "Lily and Tom went to the park to play with a big red ball",
      "One day",          "A dog",       "The sun was hot and the children"};
  auto set = [](size_t i, GenerateOptions& g) {
    g.n_new = 12 + static_cast<int>(i) * 3;
    g.sampler = {i % 2 ? 0.8f : 0.0f, 0, 1.0f, 77 + i};
  };
  const std::vector<GenerateResult> alone = generate_alone(so, prompts, set);
  // The default pool, 128 rows = 8 blocks: about three requests fit at once, the others wait for blocks.
  Session s(so);
  ASSERT_GT(s.backend->kv_pool_blocks(), 0);
  Engine e(*s.backend, s.tokenizer.get(), session_engine_options(s, 7));
  const auto reqs = submit_and_run(e, prompt_ids_of(alone), set);
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput out = collect(*reqs[i]);
    EXPECT_EQ(out.token_ids, alone[i].generated_ids) << prompts[i];
    EXPECT_EQ(out.text, alone[i].text) << prompts[i];
    EXPECT_EQ(out.finish, alone[i].stop_reason == "eos" ? FinishReason::stop : FinishReason::length) << prompts[i];
  }
  EngineStats st = e.stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.batch_rows, st.steps);  // steps carried several rows
  EXPECT_EQ(st.kv_blocks_free, 8);
}


// Delegates to a real backend and counts which entry the engine uses.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& b) : b_(b) {}
  std::string name() const override { return "counting-" + b_.name(); }
  std::vector<float> forward(std::span<const int32_t> t, int64_t n_past) override { return b_.forward(t, n_past); }
  std::vector<float> forward(const StepBatch& batch) override {
    ++logit_steps;
    return b_.forward(batch);
  }
  std::vector<int32_t> forward_rows(const StepBatch& batch, OutputKind kind) override {
    ++(kind == OutputKind::greedy ? greedy_steps : topk_steps);
    return b_.forward_rows(batch, kind);
  }
  int64_t kv_block_size() const override { return b_.kv_block_size(); }
  int64_t kv_pool_blocks() const override { return b_.kv_pool_blocks(); }
  int64_t max_batch_rows() const override { return b_.max_batch_rows(); }
  void reset() override { b_.reset(); }
  int logit_steps = 0, greedy_steps = 0, topk_steps = 0;

 private:
  Backend& b_;
};

// Requests that are all greedy: every step asks the backend for token ids (forward_greedy, the
// program's argmax op), never for logits, and the tokens equal `generate` alone.
TEST(E2EServeEngine, AllGreedyBatchesAskForIdsNotLogits) {
  const SessionOptions so = stories_cpu_session();
  if (!std::filesystem::exists(so.model_path)) GTEST_SKIP() << so.model_path << " not found";
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "One day", "A dog"};
  auto set = [](size_t i, GenerateOptions& g) {
    g.n_new = 10 + static_cast<int>(i) * 2;
    g.sampler.temperature = 0;
  };
  const std::vector<GenerateResult> alone = generate_alone(so, prompts, set);
  Session s(so);
  CountingBackend counting(*s.backend);
  Engine e(counting, s.tokenizer.get(), session_engine_options(s, 5));
  const auto reqs = submit_and_run(e, prompt_ids_of(alone), set);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(collect(*reqs[i]).token_ids, alone[i].generated_ids) << prompts[i];
  EXPECT_GT(counting.greedy_steps, 0);
  EXPECT_EQ(counting.logit_steps, 0);
}

// Requests that are greedy or top-k sampled with top_k <= kTopK: every step asks the backend for
// each row's candidates (forward_topk, the program's topk op), never for logits, and the tokens
// equal `generate` alone with the full logits row (Sampler::sample, what the engine did before).
// A request with top_k = 0 in the batch sends the steps back to the logits.
TEST(E2EServeEngine, TopKSampledBatchesAskForCandidatesNotLogits) {
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " not found";
  SessionOptions so;
  so.model_path = model;
  so.backend = "cpu";
  so.backend_options.threads = 2;
  so.n_ctx = 128;
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "One day", "A dog"};
  auto sampler_of = [](size_t i) {
    return i == 1 ? SamplerOptions{0.0f, 40, 0.95f, 5} : SamplerOptions{0.8f, i == 3 ? 64 : 40, 0.95f, 11 + i};
  };
  // Each prompt alone, sampled from the whole logits row by hand.
  Session one(so);
  std::vector<std::vector<int32_t>> prompt_ids, want;
  for (size_t i = 0; i < prompts.size(); ++i) {
    one.reset();
    prompt_ids.push_back(one.tokenizer->encode(prompts[i], true, true));
    Sampler sampler(sampler_of(i));
    std::vector<float> l = one.eval(prompt_ids.back());
    want.emplace_back();
    for (int k = 0; k < 10 + static_cast<int>(i) * 2; ++k) {
      const int32_t next = sampler.sample(l);
      if (one.tokenizer->is_eos(next) || (one.stop_at_bos && next == one.tokenizer->bos_id)) break;
      want.back().push_back(next);
      l = one.eval(std::span<const int32_t>(&next, 1));
    }
  }
  Session s(so);
  CountingBackend counting(*s.backend);
  const EngineOptions eo = session_engine_options(s, 5);
  {
    Engine e(counting, s.tokenizer.get(), eo);
    const auto reqs = submit_and_run(e, prompt_ids, [&](size_t i, GenerateOptions& g) {
      g.n_new = 10 + static_cast<int>(i) * 2;
      g.sampler = sampler_of(i);
    });
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(collect(*reqs[i]).token_ids, want[i]) << prompts[i];
    EXPECT_GT(counting.topk_steps, 0);
    EXPECT_EQ(counting.logit_steps, 0);
  }
  counting.topk_steps = 0;
  Engine e(counting, s.tokenizer.get(), eo);
  RequestParams p;
  p.prompt_ids = prompt_ids[0];
  p.max_tokens = 4;
  p.sampler = {0.8f, 0, 0.95f, 1};  // top_k off: the whole row
  auto req = e.submit(p);
  run_until_idle(e);
  EXPECT_EQ(collect(*req).finish, FinishReason::length);
  EXPECT_GT(counting.logit_steps, 0);
  EXPECT_EQ(counting.topk_steps, 0);
}


// Repetition penalties (llama.cpp's repeat penalty, OpenAI's frequency and presence penalties over
// a window of the last n tokens, the prompt's included) against llama.cpp's sampler chain
// (penalties, then greedy; bench/llamacpp_penalties.py wrote tests/data/penalties/llamacpp_greedy.json
// with llama-cpp-python 0.3.16 on stories260K.gguf): 18 settings x prompts, 48 greedy tokens each,
// 15 of the 16 penalized ones differ from plain greedy decoding. `generate` (run's path) on cpu and the engine
// (serve's path, all cases batched over the paged pool, penalized and plain rows in the same steps)
// give llama.cpp's ids; so do the reference and cuda-emu backends on two cases.
struct PenaltyCase {
  std::vector<int32_t> prompt_ids, want;
  SamplerOptions sampler;
};

std::vector<PenaltyCase> penalty_cases() {
  std::ifstream in(std::string(MK_SOURCE_DIR) + "/tests/data/penalties/llamacpp_greedy.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<PenaltyCase> cases;
  for (const auto& c : j.at("cases")) {
    PenaltyCase pc;
    pc.prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    pc.want = c.at("generated_ids").get<std::vector<int32_t>>();
    pc.sampler.temperature = 0;
    pc.sampler.repeat_penalty = c.at("repeat_penalty").get<float>();
    pc.sampler.frequency_penalty = c.at("frequency_penalty").get<float>();
    pc.sampler.presence_penalty = c.at("presence_penalty").get<float>();
    pc.sampler.penalty_last_n = c.at("last_n").get<int>();
    cases.push_back(pc);
  }
  return cases;
}

SessionOptions stories_gguf_session(const std::string& backend) {
  SessionOptions so;
  so.model_path = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  so.backend = backend;
  so.backend_options.threads = backend == "reference" ? 0 : 2;
  so.n_ctx = 256;
  return so;
}

// Prefix caching on the real cpu backend: a row's numbers do not depend on the step that computes
// it, so requests whose prompts begin with blocks an earlier request computed (a shared system
// prompt; the previous turn and its reply) give the same tokens and the same logprobs, to the bit,
// as without the cache: float32 weights (stories260K.gguf, f32 KV) and q4_1 weights with q8_0
// activations and an f16 KV cache (synth:stories260k:q4_1) on cpu, and the CUDA megakernel's source
// on cuda-emu (attention through shared block tables on the device code), 16-row blocks.
TEST(E2EServeEngine, PrefixCacheGivesTheSameBitsAsComputingThePrompt) {
  for (const auto& [model, backend] : std::vector<std::pair<std::string, std::string>>{
           {std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf", "cpu"},
           {"synth:stories260k:q4_1", "cpu"},
           {"synth:stories260k:q4_1", "cuda-emu"}}) {
    SessionOptions so = stories_gguf_session(backend);
    so.model_path = model;
    so.need_tokenizer = false;
    so.kv_pool_seqs = 4;
    if (model[0] == '/' && !std::filesystem::exists(model)) GTEST_SKIP() << model << " not found";
    Session cached(so), plain(so);
    ASSERT_EQ(cached.backend->kv_block_size(), 16);
    EngineOptions eo = engine_options(4, 256, cached.hparams.n_vocab);
    eo.prefill_chunk = 7;
    Engine e(*cached.backend, nullptr, eo);
    eo.prefix_cache = false;
    Engine ref(*plain.backend, nullptr, eo);
    auto request = [](std::vector<int32_t> ids, float temperature) {
      RequestParams p;
      p.prompt_ids = std::move(ids);
      p.max_tokens = 12;
      p.sampler.temperature = temperature;
      p.sampler.seed = 9;
      p.logprobs = 3;
      return p;
    };
    std::vector<int32_t> system;
    for (int i = 0; i < 37; ++i) system.push_back(1 + (i * 37 + 11) % 500);
    auto run = [&](Engine& eng, const std::vector<RequestParams>& ps) {
      std::vector<std::shared_ptr<Request>> rs;
      for (const auto& p : ps) rs.push_back(eng.submit(p));
      run_until_idle(eng);
      std::vector<RequestOutput> outs;
      for (auto& r : rs) outs.push_back(collect(*r));
      return outs;
    };
    auto with = [&](std::vector<int32_t> tail) {
      std::vector<int32_t> v = system;
      v.insert(v.end(), tail.begin(), tail.end());
      return v;
    };
    const RequestParams first = request(with({7, 8, 9}), 0.0f);
    const RequestOutput a = run(e, {first})[0];
    EXPECT_EQ(a.n_cached, 0);
    RequestParams turn2 = first;
    turn2.prompt_ids.insert(turn2.prompt_ids.end(), a.token_ids.begin(), a.token_ids.end());
    turn2.prompt_ids.insert(turn2.prompt_ids.end(), {12, 13});  // 40 + 12 + 2: rows 0..50 computed by `first`
    const std::vector<RequestParams> later = {request(with({20}), 0.8f), request(with({21, 22, 23, 24, 25}), 0.0f), turn2};
    const std::vector<RequestOutput> got = run(e, later), want = run(ref, later);
    const std::vector<int64_t> want_cached = {32, 32, 48};
    for (size_t i = 0; i < later.size(); ++i) {
      const std::string at = fmt::format("{} on {} request {}", model, backend, i);
      EXPECT_EQ(got[i].n_cached, want_cached[i]) << at;
      EXPECT_EQ(want[i].n_cached, 0) << at;
      EXPECT_EQ(got[i].token_ids, want[i].token_ids) << at;
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << at;
      for (size_t k = 0; k < got[i].logprobs.size(); ++k) {
        EXPECT_EQ(got[i].logprobs[k].token.logprob, want[i].logprobs[k].token.logprob) << at << " token " << k;
        ASSERT_EQ(got[i].logprobs[k].top.size(), 3u);
        for (size_t t = 0; t < 3; ++t) {
          EXPECT_EQ(got[i].logprobs[k].top[t].id, want[i].logprobs[k].top[t].id) << at;
          EXPECT_EQ(got[i].logprobs[k].top[t].logprob, want[i].logprobs[k].top[t].logprob) << at;
        }
      }
    }
    EXPECT_EQ(e.stats().prompt_tokens_cached, 32u + 32u + 48u);
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
    // The cached rows were not computed again: `e` ran `first` too.
    EXPECT_EQ(e.stats().batch_rows, ref.stats().batch_rows - 112 + static_cast<uint64_t>(a.n_prompt + a.n_generated - 1));
  }
}

// Prompt log-probabilities (OpenAI's echo with logprobs; lm-evaluation-harness scores with them):
// each prompt token after the first gets the model's log-softmax entry at its position, with the
// same bits whether the prompt is read in chunks of 7 rows beside other requests or alone one token
// at a time (on each backend); max_tokens 0 reads the prompt and ends ("length", no token); the request's tokens are
// those it gets without prompt log-probabilities, and no prefix cache is used for it.
class E2EPromptLogprobs : public testing::TestWithParam<std::string> {};

TEST_P(E2EPromptLogprobs, AreTheModelsRowsAtEachPosition) {
  const SessionOptions so = stories_gguf_session(GetParam());
  Session s(so);
  EngineOptions eo = engine_options(4, 256, s.hparams.n_vocab);
  eo.prefill_chunk = 7;
  Engine e(*s.backend, s.tokenizer.get(), eo);
  const std::vector<std::string> texts = {"Once upon a time, there was a little dog named Max who loved to run in the park.",
                                          "The cat sat on the mat", "Lily and Tom"};
  std::vector<RequestParams> ps;
  for (size_t i = 0; i < texts.size(); ++i) {
    RequestParams p;
    p.prompt_ids = s.tokenizer->encode(texts[i], true, true);
    p.max_tokens = i == 1 ? 0 : 6;
    p.sampler.temperature = 0;
    p.logprobs = i == 2 ? -1 : static_cast<int>(i) + 2;
    p.prompt_logprobs = i != 2;
    ps.push_back(p);
  }
  // A cached copy of the first prompt's blocks must not stand in for its rows.
  RequestParams warm = ps[0];
  warm.prompt_logprobs = false;
  warm.logprobs = -1;
  auto rw = e.submit(warm);
  run_until_idle(e);
  const RequestOutput w = collect(*rw);
  std::vector<std::shared_ptr<Request>> rs;
  for (const auto& p : ps) rs.push_back(e.submit(p));
  run_until_idle(e);
  Session one(so);
  for (size_t i = 0; i < ps.size(); ++i) {
    const RequestOutput out = collect(*rs[i]);
    const auto& ids = ps[i].prompt_ids;
    EXPECT_EQ(out.finish, FinishReason::length) << i;
    EXPECT_EQ(out.n_cached, 0) << i;
    if (!ps[i].prompt_logprobs) {
      EXPECT_TRUE(out.prompt_logprobs.empty());
      continue;
    }
    if (i == 0) {
      EXPECT_EQ(out.token_ids, w.token_ids);
    }
    EXPECT_EQ(out.n_generated, ps[i].max_tokens) << i;
    ASSERT_EQ(out.prompt_logprobs.size(), ids.size() - 1) << i;
    one.reset();
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      const std::vector<float> row = one.eval(std::span<const int32_t>(&ids[k], 1));
      const GeneratedLogprob want = generated_logprob(row, ids[k + 1], ps[i].logprobs,
                                                      [&](int32_t t) { return s.tokenizer->token_bytes(ids[k], t); });
      const GeneratedLogprob& got = out.prompt_logprobs[k];
      const std::string at = fmt::format("request {} position {}", i, k + 1);
      EXPECT_EQ(got.token.id, ids[k + 1]) << at;
      EXPECT_EQ(got.token.logprob, want.token.logprob) << at;
      EXPECT_EQ(got.token.bytes, want.token.bytes) << at;
      ASSERT_EQ(got.top.size(), want.top.size()) << at;
      for (size_t t = 0; t < got.top.size(); ++t) {
        EXPECT_EQ(got.top[t].id, want.top[t].id) << at;
        EXPECT_EQ(got.top[t].logprob, want.top[t].logprob) << at;
      }
    }
  }
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

// cpu, and the CUDA megakernel's source on cuda-emu (many logit rows per step on the device code).
INSTANTIATE_TEST_SUITE_P(Backends, E2EPromptLogprobs, testing::Values("cpu", "cuda-emu"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param == "cpu" ? "cpu" : "cuda_emu"; });

// response_format json_object (runtime/json_prefix.h) on stories260K, which never saw JSON: the
// replies are JSON-object prefixes (a whole object, parsed by nlohmann, when one ends with "stop");
// a greedy reply takes at each step the likeliest token whose bytes continue the prefix (replayed
// here on a one-sequence session); requests without a tokenizer are refused.
TEST(E2EServeEngine, JsonObjectRepliesArePrefixesOfOneObject) {
  const SessionOptions so = stories_gguf_session("cpu");
  Session s(so);
  Engine e(*s.backend, s.tokenizer.get(), engine_options(4, 256, s.hparams.n_vocab));
  std::vector<RequestParams> ps;
  for (int i = 0; i < 6; ++i) {
    RequestParams p;
    p.prompt_ids = s.tokenizer->encode(i % 2 ? "Once upon a time" : "{\"name\": \"Lily\", \"age\":", true, true);
    p.max_tokens = 48;
    p.sampler.temperature = i < 2 ? 0.0f : 1.5f;
    p.sampler.top_k = 0;
    p.sampler.seed = static_cast<uint64_t>(i);
    p.json = JsonSchema::any_object();
    if (i >= 4)  // pushed towards closing its strings and the object (a story model writes on and on)
      for (int32_t t = 0; t < s.hparams.n_vocab; ++t) {
        const std::string b = s.tokenizer->token_bytes(0, t);
        if (b == "}" || b == "\"") p.sampler.logit_bias.emplace_back(t, b == "}" ? 12.0f : 6.0f);
      }
    ps.push_back(p);
  }
  std::vector<std::shared_ptr<Request>> rs;
  for (const auto& p : ps) rs.push_back(e.submit(p));
  run_until_idle(e);
  int completed = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const RequestOutput out = collect(*rs[i]);
    ASSERT_TRUE(out.finish == FinishReason::stop || out.finish == FinishReason::length) << out.error;
    JsonObjectPrefix prefix;
    EXPECT_TRUE(prefix.feed(out.text)) << i << ": " << out.text;
    EXPECT_EQ(prefix.complete(), out.finish == FinishReason::stop) << out.text;
    if (out.finish == FinishReason::stop) {
      ++completed;
      EXPECT_TRUE(nlohmann::json::parse(out.text).is_object()) << out.text;
    }
    if (ps[i].sampler.temperature != 0) continue;
    // Greedy: the argmax over the allowed tokens of the model's row, step by step.
    Session one(so);
    std::vector<float> row = one.eval(ps[i].prompt_ids);
    JsonObjectPrefix replay;
    for (size_t k = 0; k < out.token_ids.size(); ++k) {
      int32_t best = -1;
      for (int32_t t = 0; t < s.hparams.n_vocab; ++t) {
        JsonObjectPrefix q = replay;
        const std::string b = s.tokenizer->token_bytes(1 - (s.tokenizer->bos_id == 1), t);
        if (b.empty() || !q.feed(b)) continue;
        if (best < 0 || row[static_cast<size_t>(t)] > row[static_cast<size_t>(best)]) best = t;
      }
      ASSERT_EQ(out.token_ids[k], best) << i << " step " << k;
      ASSERT_TRUE(replay.feed(s.tokenizer->token_bytes(1 - (s.tokenizer->bos_id == 1), best)));
      row = one.eval(std::span<const int32_t>(&out.token_ids[k], 1));
    }
  }
  EXPECT_GT(completed, 0);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  Engine no_tok(*s.backend, nullptr, engine_options(1, 256, s.hparams.n_vocab));
  RequestParams p = ps[0];
  try {
    no_tok.submit(p);
    ADD_FAILURE() << "a JSON request without a tokenizer was taken";
  } catch (const RequestInvalid& ex) {
    EXPECT_EQ(ex.param, "response_format");
  }
}

TEST(E2EPenalties, GreedyMatchesLlamaCpp) {
  const std::vector<PenaltyCase> cases = penalty_cases();
  ASSERT_EQ(cases.size(), 18u);
  int changed = 0;
  for (const PenaltyCase& c : cases)
    for (const PenaltyCase& base : cases)
      if (base.prompt_ids == c.prompt_ids && !Sampler(base.sampler).penalizes() && base.want != c.want) ++changed;
  EXPECT_EQ(changed, 15) << "the fixture's penalized cases should differ from plain greedy decoding";
  Session s(stories_gguf_session("cpu"));
  for (const PenaltyCase& c : cases) {
    GenerateOptions g;
    g.prompt_ids = c.prompt_ids;
    g.n_new = static_cast<int>(c.want.size());
    g.sampler = c.sampler;
    s.reset();
    EXPECT_EQ(generate(s, g).generated_ids, c.want)
        << "repeat " << c.sampler.repeat_penalty << " freq " << c.sampler.frequency_penalty << " presence "
        << c.sampler.presence_penalty << " last_n " << c.sampler.penalty_last_n;
  }
  // serve's path: every case submitted at once, batched over the paged pool.
  SessionOptions so = stories_gguf_session("cpu");
  so.kv_pool_seqs = 4;
  Session batched(so);
  ASSERT_GT(batched.backend->kv_pool_blocks(), 0);
  EngineOptions eo = engine_options(4, 256, batched.hparams.n_vocab);
  Engine e(*batched.backend, batched.tokenizer.get(), eo);
  std::vector<std::shared_ptr<Request>> reqs;
  for (const PenaltyCase& c : cases) {
    RequestParams p;
    p.prompt_ids = c.prompt_ids;
    p.max_tokens = static_cast<int64_t>(c.want.size());
    p.sampler = c.sampler;
    reqs.push_back(e.submit(p));
  }
  run_until_idle(e);
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(collect(*reqs[i]).token_ids, cases[i].want) << "case " << i;
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  for (const char* backend : {"reference", "cuda-emu"}) {
    Session other(stories_gguf_session(backend));
    for (size_t i : {size_t{7}, size_t{10}}) {  // repeat 0.8 (rewards repeats), 1.3
      GenerateOptions g;
      g.prompt_ids = cases[i].prompt_ids;
      g.n_new = backend == std::string("cuda-emu") ? 16 : static_cast<int>(cases[i].want.size());
      g.sampler = cases[i].sampler;
      other.reset();
      const std::vector<int32_t> got = generate(other, g).generated_ids;
      EXPECT_EQ(got, std::vector<int32_t>(cases[i].want.begin(), cases[i].want.begin() + g.n_new)) << backend << " case " << i;
    }
  }
}

// Log-probabilities (RequestParams::logprobs, GenerateOptions::logprobs): the log-softmax of the
// model's own row at each generated token's position, whatever the sampler did to choose it. Four
// requests batched by the engine over the paged pool (greedy with 5 alternatives; sampled with top-k
// and a repeat penalty, 2 alternatives; greedy with 0; greedy without logprobs) against rows
// evaluated here one token at a time and a log-softmax and full sort computed here; `generate`
// (run's path) gives the same entries; logprobs do not change the tokens; each entry's bytes are
// the token's in context, and they add up to the text.
TEST(E2ELogprobs, AreTheModelsOwnRowBatchedOrAlone) {
  const SessionOptions so = stories_gguf_session("cpu");
  struct Case {
    SamplerOptions sampler;
    int logprobs;
  };
  SamplerOptions sampled{0.9f, 40, 1.0f, 3};
  sampled.repeat_penalty = 1.3f;
  const std::vector<Case> cases = {{{0.0f, 0, 1.0f, 1}, 5}, {sampled, 2}, {{0.0f, 0, 1.0f, 1}, 0}, {{0.0f, 0, 1.0f, 1}, -1}};
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom", "One day"};
  const int n_new = 16;
  Session s(so);
  ASSERT_GT(s.backend->kv_pool_blocks(), 0);
  Engine e(*s.backend, s.tokenizer.get(), engine_options(4, 256, s.hparams.n_vocab));
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 0; i < cases.size(); ++i) {
    RequestParams p;
    p.prompt_ids = s.tokenizer->encode(prompts[i], true, true);
    prompt_ids.push_back(p.prompt_ids);
    p.max_tokens = n_new;
    p.sampler = cases[i].sampler;
    p.logprobs = cases[i].logprobs;
    reqs.push_back(e.submit(p));
  }
  run_until_idle(e);
  Session one(so);
  for (size_t i = 0; i < cases.size(); ++i) {
    const RequestOutput out = collect(*reqs[i]);
    ASSERT_EQ(out.finish, FinishReason::length) << i;
    if (cases[i].logprobs < 0) {
      EXPECT_TRUE(out.logprobs.empty());
      continue;
    }
    ASSERT_EQ(out.logprobs.size(), out.token_ids.size()) << i;
    one.reset();
    std::vector<float> row = one.eval(prompt_ids[i]);
    int32_t prev = prompt_ids[i].back();
    std::string text;
    for (size_t k = 0; k < out.token_ids.size(); ++k) {
      const GeneratedLogprob& g = out.logprobs[k];
      const int32_t id = out.token_ids[k];
      double mx = *std::max_element(row.begin(), row.end()), sum = 0;
      for (float v : row) sum += std::exp(v - mx);
      const double log_sum = mx + std::log(sum);
      std::vector<int32_t> order(row.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      const std::string at = fmt::format("request {} token {}", i, k);
      EXPECT_EQ(g.token.id, id) << at;
      EXPECT_NEAR(g.token.logprob, row[static_cast<size_t>(id)] - log_sum, 1e-4) << at;
      EXPECT_EQ(g.token.bytes, s.tokenizer->token_bytes(prev, id)) << at;
      ASSERT_EQ(g.top.size(), static_cast<size_t>(cases[i].logprobs)) << at;
      for (size_t r = 0; r < g.top.size(); ++r) {
        EXPECT_EQ(g.top[r].id, order[r]) << at << " rank " << r;
        EXPECT_NEAR(g.top[r].logprob, row[static_cast<size_t>(order[r])] - log_sum, 1e-4) << at << " rank " << r;
        EXPECT_EQ(g.top[r].bytes, s.tokenizer->token_bytes(prev, order[r])) << at;
      }
      if (cases[i].sampler.temperature == 0 && !g.top.empty()) {
        EXPECT_EQ(g.top[0].id, id) << at;
      }
      text += g.token.bytes;
      prev = id;
      row = one.eval(std::span<const int32_t>(&id, 1));
    }
    EXPECT_EQ(text, out.text) << i;
    // run's path: the same tokens and entries; without logprobs, the same tokens.
    GenerateOptions go;
    go.prompt_ids = prompt_ids[i];
    go.n_new = n_new;
    go.sampler = cases[i].sampler;
    go.logprobs = cases[i].logprobs;
    one.reset();
    const GenerateResult r = generate(one, go);
    EXPECT_EQ(r.generated_ids, out.token_ids) << i;
    ASSERT_EQ(r.logprobs.size(), out.logprobs.size()) << i;
    for (size_t k = 0; k < r.logprobs.size(); ++k) {
      EXPECT_NEAR(r.logprobs[k].token.logprob, out.logprobs[k].token.logprob, 1e-4) << i << " " << k;
      ASSERT_EQ(r.logprobs[k].top.size(), out.logprobs[k].top.size());
      for (size_t t = 0; t < r.logprobs[k].top.size(); ++t) EXPECT_EQ(r.logprobs[k].top[t].id, out.logprobs[k].top[t].id);
    }
    go.logprobs = -1;
    one.reset();
    const GenerateResult plain = generate(one, go);
    EXPECT_EQ(plain.generated_ids, out.token_ids) << i << ": logprobs changed the tokens";
    EXPECT_TRUE(plain.logprobs.empty());
  }
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  RequestParams bad;
  bad.prompt_ids = prompt_ids[0];
  bad.logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(e.submit(bad), RequestInvalid);
}

// Against llama.cpp (bench/llamacpp_logprobs.py wrote tests/data/logprobs/llamacpp_logprobs.json
// with llama-cpp-python 0.3.16 on stories260K.gguf: greedy decoding, per token the log-softmax of
// llama.cpp's row): the engine, all prompts batched, gives the same tokens, and logprobs of the chosen
// token and the 5 most likely within 5e-3 x (1 + |logprob|) (measured up to 2.6e-3). The engines' logits differ by ~1e-3
// relative (llama.cpp's f16 attention), measured 2e-4 on chosen tokens and up to 1.2e-2 on
// alternatives near -5. An alternative's id is compared where its neighbours are further apart
// than that.
TEST(E2ELogprobs, MatchLlamaCpp) {
  std::ifstream in(std::string(MK_SOURCE_DIR) + "/tests/data/logprobs/llamacpp_logprobs.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const int n_top = j.at("n_top").get<int>();
  Session s(stories_gguf_session("cpu"));
  Engine e(*s.backend, s.tokenizer.get(), engine_options(4, 256, s.hparams.n_vocab));
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& c : j.at("cases")) {
    RequestParams p;
    p.prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    p.max_tokens = static_cast<int64_t>(c.at("steps").size());
    p.sampler.temperature = 0;
    p.logprobs = n_top;
    reqs.push_back(e.submit(p));
  }
  ASSERT_EQ(reqs.size(), 3u);
  run_until_idle(e);
  auto tol = [](double want) { return 5e-3 * (1 + std::abs(want)); };
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestOutput out = collect(*reqs[i]);
    const auto& steps = j.at("cases")[i].at("steps");
    ASSERT_EQ(out.logprobs.size(), steps.size()) << i;
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto& w = steps[k];
      const GeneratedLogprob& g = out.logprobs[k];
      const std::string at = fmt::format("prompt {} token {}", i, k);
      ASSERT_EQ(g.token.id, w.at("id").get<int32_t>()) << at;
      const double want = w.at("logprob").get<double>();
      EXPECT_NEAR(g.token.logprob, want, tol(want)) << at;
      const auto& top = w.at("top");
      ASSERT_EQ(g.top.size(), top.size()) << at;
      for (size_t r = 0; r < top.size(); ++r) {
        const double v = top[r][1].get<double>();
        EXPECT_NEAR(g.top[r].logprob, v, tol(v)) << at << " rank " << r;
        const bool apart = (r == 0 || top[r - 1][1].get<double>() - v > 2 * tol(v)) &&
                           (r + 1 == top.size() || v - top[r + 1][1].get<double>() > 2 * tol(v));
        if (apart) {
          EXPECT_EQ(g.top[r].id, top[r][0].get<int32_t>()) << at << " rank " << r;
        }
      }
    }
  }
}

// A tool call's marker that is a control token (Mistral's [TOOL_CALLS], Granite's <|tool_call|>):
// decoding gives it no text, so a reply with tools renders it literally (RequestParams::
// preserved_tokens from tool_marker_tokens) for the call parser; other requests do not. The GPT-2
// fixture's byte-level vocabulary with the markers added after it: special ones, and Hermes'
// <tool_call> as an ordinary added token (Qwen's), which decodes as its text anyway.
TEST(Engine, ToolMarkerControlTokensAreRenderedAsText) {
  std::ifstream in(std::string(MK_SHARED_DIR) + "/fixtures/hf/gpt2_float32/tokenizer.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  const int32_t base = static_cast<int32_t>(doc["model"]["vocab"].size());
  const std::vector<std::pair<std::string, bool>> added = {
      {"[TOOL_CALLS]", true}, {"<|tool_call|>", true}, {"<|/tool_call|>", true}, {"<tool_call>", false}, {"</tool_call>", false}};
  for (size_t k = 0; k < added.size(); ++k)
    doc["added_tokens"].push_back({{"id", base + static_cast<int32_t>(k)}, {"content", added[k].first}, {"single_word", false},
                                   {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", added[k].second}});
  const auto tok = make_hf_tokenizer(doc, "gpt2+markers");
  EXPECT_EQ(tool_marker_tokens(*tok, ToolFormat::mistral), (std::vector<int32_t>{base}));
  EXPECT_EQ(tool_marker_tokens(*tok, ToolFormat::granite), (std::vector<int32_t>{base + 1, base + 2}));
  EXPECT_EQ(tool_marker_tokens(*tok, ToolFormat::hermes), (std::vector<int32_t>{}));  // they decode as text
  EXPECT_EQ(tool_marker_tokens(*tok, ToolFormat::json), (std::vector<int32_t>{}));    // no <|python_tag|> here
  EXPECT_EQ(tool_marker_tokens(*tok, ToolFormat::none), (std::vector<int32_t>{}));
  const int64_t n_vocab = tok->n_vocab();
  auto reply = [&](bool preserve) {
    FakeBackend b(n_vocab, 4, 64, 64);
    Engine e(b, tok.get(), engine_options(1, 128, n_vocab));
    RequestParams p;
    p.prompt_ids = {10, 11, 12};
    p.max_tokens = 3;
    p.sampler.temperature = 0;
    p.sampler.logit_bias = {{base + 1, 100.0f}};  // the first token is <|tool_call|>, then it is penalized away
    p.sampler.repeat_penalty = 1e6f;
    if (preserve) p.preserved_tokens = tool_marker_tokens(*tok, ToolFormat::granite);
    auto r = e.submit(p);
    run_until_idle(e);
    return collect(*r);
  };
  const RequestOutput kept = reply(true), plain = reply(false);
  ASSERT_EQ(kept.token_ids.size(), 3u) << kept.error;
  EXPECT_EQ(kept.token_ids[0], base + 1);
  EXPECT_EQ(kept.token_ids, plain.token_ids);
  EXPECT_TRUE(kept.text.starts_with("<|tool_call|>")) << kept.text;
  EXPECT_EQ(kept.text.substr(13), plain.text);  // without it: the same text, no marker
}

// EmbedBatcher (runtime/embed.h): calls from many threads at once are embedded together (fewer
// batches than calls) and each gets bitwise the vectors embed() gives it alone, with its own
// dimensions and normalization; a call whose check throws while it waits gets that exception and
// the others are unaffected. stories260K's embedding graph on the cpu backend, a pool of 4 contexts.
TEST(EngineEmbedBatcher, ConcurrentCallsAreBatchedAndGiveTheirVectorsAlone) {
  ModelFile m = load_model(std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
  BuildOptions bo{64, false};
  bo.embeddings = true;
  bo.kv_pool_tokens = 4 * 64;
  Graph g = build_graph(m, bo);
  BackendOptions o;
  o.threads = 2;
  auto backend = make_backend("cpu", g, m, o);
  const Hparams hp = read_hparams(m);
  const int n_calls = 8;
  std::vector<std::vector<std::vector<int32_t>>> inputs(n_calls);
  for (int c = 0; c < n_calls; ++c)
    for (int k = 0; k < 1 + c % 3; ++k) {
      std::vector<int32_t> in;
      for (int t = 0; t < 3 + (c * 7 + k * 5) % 20; ++t) in.push_back(1 + (c * 31 + k * 17 + t * 13) % 500);
      inputs[static_cast<size_t>(c)].push_back(std::move(in));
    }
  auto dims_of = [&](int c) { return c % 3 == 0 ? int64_t{0} : c % 3 == 1 ? int64_t{16} : hp.n_embd; };
  std::vector<std::vector<std::vector<float>>> alone;
  for (int c = 0; c < n_calls; ++c) {
    EmbedOptions eo;
    eo.pooling = Pooling::mean;
    eo.dimensions = dims_of(c);
    eo.normalize = c % 2 == 0;
    alone.push_back(embed(*backend, hp.n_embd, 64, hp.n_vocab, inputs[static_cast<size_t>(c)], eo));
  }
  EmbedBatcher batcher(*backend, hp.n_embd, 64, hp.n_vocab, Pooling::mean);
  std::atomic<int> started{0};
  std::vector<std::vector<std::vector<float>>> got(n_calls);
  std::vector<std::thread> threads;
  std::atomic<bool> left_early{false};
  for (int c = 0; c <= n_calls; ++c)
    threads.emplace_back([&, c] {
      ++started;
      if (c == n_calls) {  // a call that leaves while it waits (its check throws)
        try {
          batcher.embed(inputs[0], 0, true, [&] { throw std::runtime_error("gone"); });
        } catch (const std::runtime_error& e) {
          left_early = std::string(e.what()) == "gone";
        }
        return;
      }
      // the first call's batch waits (its check) until every thread has started: the others queue
      got[static_cast<size_t>(c)] = batcher.embed(inputs[static_cast<size_t>(c)], dims_of(c), c % 2 == 0, [&] {
        while (started < n_calls + 1) std::this_thread::yield();
      });
    });
  for (auto& t : threads) t.join();
  for (int c = 0; c < n_calls; ++c) EXPECT_EQ(got[static_cast<size_t>(c)], alone[static_cast<size_t>(c)]) << "call " << c;
  EXPECT_EQ(got[1][0].size(), 16u);
  EXPECT_TRUE(left_early);
  const EmbedBatcher::Stats st = batcher.stats();
  EXPECT_GE(st.calls, static_cast<uint64_t>(n_calls));  // + 1 when the leaving call was in a batch when it left
  EXPECT_LT(st.batches, static_cast<uint64_t>(n_calls));
}

// A batch runs its calls smallest first and a call returns when its own part is done: a short
// request batched with a long one is answered first, and the long one ending (its check throws, as
// a --timeout does) does not end the short one (new-user trial 55: both got 408).
TEST(EngineEmbedBatcher, ShortCallsReturnFirstAndOutliveALongOnesError) {
  ModelFile m = load_model(std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
  BuildOptions bo{64, false};
  bo.embeddings = true;
  bo.kv_pool_tokens = 2 * 64;
  Graph g = build_graph(m, bo);
  BackendOptions o;
  o.threads = 2;
  auto backend = make_backend("cpu", g, m, o);
  const Hparams hp = read_hparams(m);
  std::vector<std::vector<int32_t>> big, small = {{5, 6, 7}}, gate = {{9}};
  for (int k = 0; k < 6; ++k) big.push_back(std::vector<int32_t>(60, 11 + k));
  EmbedOptions eo;
  eo.pooling = Pooling::mean;
  const auto small_alone = embed(*backend, hp.n_embd, 64, hp.n_vocab, small, eo);
  EmbedBatcher batcher(*backend, hp.n_embd, 64, hp.n_vocab, Pooling::mean);
  std::atomic<int> queued{0}, order{0};
  std::atomic<bool> gate_done{false};
  int small_done = -1, big_done = -1;
  std::vector<std::vector<float>> small_got;
  bool big_failed = false;
  std::thread gate_thread([&] {  // its batch holds the backend until the other two wait
    batcher.embed(gate, 0, true, [&] {
      while (queued < 2) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    });
    gate_done = true;
  });
  while (batcher.stats().batches < 1) std::this_thread::yield();
  std::thread big_thread([&] {
    int steps = 0;
    ++queued;
    try {
      batcher.embed(big, 0, true, [&] {  // counts the steps of its batch (it is also called while it waits)
        if (!gate_done) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a long request's steps
        if (++steps > 2) throw std::runtime_error("timed out");
      });
    } catch (const std::runtime_error&) {
      big_failed = true;
    }
    big_done = order++;
  });
  std::thread small_thread([&] {
    ++queued;
    small_got = batcher.embed(small, 0, true, {});
    small_done = order++;
  });
  for (auto* t : {&gate_thread, &big_thread, &small_thread}) t->join();
  EXPECT_EQ(small_got, small_alone);
  EXPECT_TRUE(big_failed);
  EXPECT_LT(small_done, big_done);
  EXPECT_EQ(batcher.stats().calls, 3u);
}

}  // namespace
}  // namespace mk
