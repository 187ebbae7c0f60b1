#include "runtime/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>

#include "ir/topk.h"
#include "runtime/lookup.h"
#include "support/error.h"

namespace mk {

namespace {
using clock = std::chrono::steady_clock;
// Most threads that draw a step's tokens from whole logits rows (the scheduler thread among them).
constexpr size_t kSamplingThreads = 4;
// Bookkeeping block size of a backend without paged KV (one sequence at a time: pool row == position).
constexpr int64_t kSerialBlockSize = 16;

int64_t pool_blocks(Backend& b, const EngineOptions& o) {
  int64_t n = b.kv_pool_blocks() > 0 ? b.kv_pool_blocks()
                                     : (std::max<int64_t>(o.n_ctx, 1) + kSerialBlockSize - 1) / kSerialBlockSize;
  return n;
}
int64_t block_size(Backend& b) { return b.kv_pool_blocks() > 0 ? b.kv_block_size() : kSerialBlockSize; }

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none:
      return "none";
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::timeout:
      return "timeout";
    case FinishReason::error:
      return "error";
  }
  return "none";
}

void Histogram::observe(double seconds) {
  size_t i = 0;
  while (i < bounds.size() && seconds > bounds[i]) ++i;
  ++counts[i];
  sum += seconds;
  ++count;
}

StopScan scan_stop_strings(const std::string& text, const std::vector<std::string>& stop) {
  StopScan r;
  for (const auto& s : stop) {
    if (s.empty()) continue;
    size_t at = text.find(s);
    if (at != std::string::npos && at < r.found) r.found = at;
  }
  if (r.found != std::string::npos) {
    r.safe = r.found;
    return r;
  }
  size_t hold = 0;  // longest suffix of text that is a proper prefix of a stop string
  for (const auto& s : stop)
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  r.safe = text.size() - hold;
  return r;
}

bool Request::wait(RequestOutput& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  auto has_news = [&] { return pending_.done || !pending_.text.empty() || !pending_.token_ids.empty(); };
  if (!cv_.wait_for(lock, timeout, has_news)) return false;
  out.text += pending_.text;
  out.token_ids.insert(out.token_ids.end(), pending_.token_ids.begin(), pending_.token_ids.end());
  std::move(pending_.logprobs.begin(), pending_.logprobs.end(), std::back_inserter(out.logprobs));
  std::move(pending_.prompt_logprobs.begin(), pending_.prompt_logprobs.end(), std::back_inserter(out.prompt_logprobs));
  pending_.text.clear();
  pending_.token_ids.clear();
  pending_.logprobs.clear();
  pending_.prompt_logprobs.clear();
  if (pending_.done) {
    out.done = true;
    out.finish = pending_.finish;
    out.error = pending_.error;
    out.n_prompt = pending_.n_prompt;
    out.n_generated = pending_.n_generated;
    out.n_cached = pending_.n_cached;
    out.ttft_ms = pending_.ttft_ms;
  }
  return true;
}

void RequestSignal::notify() {
  {
    std::lock_guard lock(mu_);
    ++count_;
  }
  cv_.notify_all();
}

uint64_t RequestSignal::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

bool RequestSignal::wait_past(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return count_ != seen; });
}

bool Request::done() const {
  std::lock_guard lock(mu_);
  return pending_.done;
}

// One sequence: its request, tokens (prompt then generated), KV blocks and detokenizer state.
struct Engine::Seq {
  std::shared_ptr<Request> req;
  RequestParams params;
  std::vector<int32_t> tokens;
  int64_t n_prompt = 0, n_computed = 0, n_generated = 0, max_tokens = 0;
  std::vector<int32_t> blocks;
  int64_t n_cached = 0;     // prompt rows taken from the prefix cache at admission
  int64_t n_keyed = 0;      // leading blocks keyed in the prefix cache (runtime/kv_blocks.h)
  uint64_t prefix_key = 0;  // the key of blocks[n_keyed - 1] (0: none)
  Sampler sampler;
  Utf8Stream utf8;
  std::string text;  // generated text so far (valid UTF-8)
  size_t sent = 0;   // text[0, sent) has been published
  std::vector<int32_t> new_ids;
  std::vector<GeneratedLogprob> new_logprobs;  // of new_ids, when params.logprobs >= 0
  std::vector<GeneratedLogprob> prompt_lps;    // prompt tokens' entries not yet published (prompt_logprobs)
  clock::time_point submitted, deadline = clock::time_point::max(), last_token;
  double ttft_ms = 0;
  bool finished = false;
  bool in_running = false;  // admitted into running_ (under mu_)
  std::optional<JsonPrefix> json;  // the reply so far, with RequestParams::json
  std::vector<int32_t> draft;      // this step's drafted tokens after its decode row (prompt lookup)
  DraftBackoff draft_backoff;
  explicit Seq(RequestParams p) : params(std::move(p)), sampler(params.sampler) {
    for (int32_t t : params.prompt_ids) sampler.accept(t);  // the penalty window starts with the prompt
  }
};

Engine::Engine(Backend& backend, const Tokenizer* tokenizer, EngineOptions options)
    : backend_(backend),
      tok_(tokenizer),
      o_(options),
      paged_(backend.kv_pool_blocks() > 0),
      prefix_cache_(paged_ && options.prefix_cache),
      max_rows_(paged_ ? backend.max_batch_rows() : options.n_ctx),
      n_vocab_(options.n_vocab),
      blocks_(pool_blocks(backend, options), block_size(backend)) {
  if (o_.n_ctx <= 0) fail("engine: context length must be positive, got {}", o_.n_ctx);
  if (o_.n_vocab <= 0) fail("engine: vocabulary size must be positive, got {}", o_.n_vocab);
  if (o_.parallel < 1) fail("--parallel must be at least 1, got {}", o_.parallel);
  if (o_.max_queue < 0) fail("queue size must be >= 0, got {}", o_.max_queue);
  if (paged_ && max_rows_ < 1) fail("backend '{}' has a paged KV pool but takes no batch rows", backend.name());
  if (!paged_) o_.parallel = 1;  // one sequence at a time through forward(tokens, n_past)
  o_.parallel = static_cast<int>(std::min<int64_t>(o_.parallel, max_rows_));
  stats_.ttft = Histogram(latency_buckets());
  stats_.itl = Histogram(latency_buckets());
  stats_.kv_block_size = blocks_.block_size();
  update_gauges_locked();
}

Engine::~Engine() { shutdown(true); }

namespace {
template <typename... A>
[[noreturn]] void invalid(std::string param, fmt::format_string<A...> f, A&&... a) {
  throw RequestInvalid(fmt::format(f, std::forward<A>(a)...), std::move(param));
}
}  // namespace

std::shared_ptr<Request> Engine::submit(RequestParams p) {
  const int64_t n_prompt = static_cast<int64_t>(p.prompt_ids.size());
  if (n_prompt == 0) invalid("prompt", "the prompt is empty (no tokens)");
  for (int32_t t : p.prompt_ids)
    if (t < 0 || t >= n_vocab_) invalid("prompt", "prompt token id {} is outside the vocabulary [0, {})", t, n_vocab_);
  if (n_prompt >= o_.n_ctx)
    invalid("prompt", "the prompt is {} tokens but the context is {} tokens (the prompt and at least one generated token must fit)",
         n_prompt, o_.n_ctx);
  if (p.max_tokens < -1) invalid("max_tokens", "max_tokens must be at least 0, got {}", p.max_tokens);
  if (p.max_tokens > o_.n_ctx - n_prompt)
    invalid("max_tokens", "the context is {} tokens, but {} in the prompt + {} max_tokens do not fit; lower max_tokens", o_.n_ctx,
         n_prompt, p.max_tokens);
  if (p.logprobs < -1 || p.logprobs > kMaxTopLogprobs)
    invalid("logprobs", "logprobs must be between 0 and {} alternatives, got {}", kMaxTopLogprobs, p.logprobs);
  if (p.prompt_logprobs && p.logprobs < 0) invalid("logprobs", "prompt log-probabilities need logprobs >= 0");
  if (p.prompt_logprobs && !paged_)
    invalid("logprobs", "prompt log-probabilities need a backend with a paged KV cache ('{}' has none)", backend_.name());
  try {
    check_logit_bias(p.sampler, n_vocab_);
  } catch (const Error& e) {
    throw RequestInvalid(std::string("logit_bias: ") + e.what(), "logit_bias");
  }
  if (p.json) {
    if (!tok_) invalid("response_format", "a JSON reply needs the model's tokenizer, and this model has none");
    std::call_once(json_mask_once_, [&] { json_mask_ = JsonTokenMask::of(*tok_, n_vocab_); });
  }
  auto seq = std::make_unique<Seq>(std::move(p));  // Sampler checks temperature/top_k/top_p
  if (seq->params.json) seq->json.emplace(*seq->params.json);
  seq->n_prompt = n_prompt;
  seq->max_tokens = seq->params.max_tokens < 0 ? o_.n_ctx - n_prompt : seq->params.max_tokens;
  // Reserve blocks for every row the sequence can write: the prompt and all but the last token.
  int64_t need = blocks_.blocks_for(n_prompt + std::max<int64_t>(seq->max_tokens - 1, 0));
  if (const int64_t prompt_blocks = blocks_.blocks_for(n_prompt); prompt_blocks > blocks_.n_blocks())
    invalid("prompt", "the prompt is {} tokens: {} KV blocks of {}, but the pool has {}; shorten the prompt or raise --kv-tokens",
            n_prompt, prompt_blocks, blocks_.block_size(), blocks_.n_blocks());
  if (need > blocks_.n_blocks())
    invalid("max_tokens", "the request needs {} KV blocks ({} tokens{}) but the pool has {}; {} or raise --kv-tokens", need,
            need * blocks_.block_size(), seq->params.max_tokens < 0 ? ": no max_tokens, so up to the context" : "",
            blocks_.n_blocks(), seq->params.max_tokens < 0 ? "set max_tokens" : "lower max_tokens");
  seq->tokens = seq->params.prompt_ids;
  seq->req = std::make_shared<Request>();
  seq->submitted = clock::now();
  if (seq->params.timeout.count() > 0) seq->deadline = seq->submitted + seq->params.timeout;
  auto req = seq->req;
  {
    std::lock_guard lock(mu_);
    if (draining_) throw EngineBusy("the server is shutting down", true);
    const int64_t free_slots =
        std::max<int64_t>(o_.parallel - (static_cast<int64_t>(running_.size()) - finished_unreaped_), 0);
    if (static_cast<int64_t>(queue_.size()) >= o_.max_queue + free_slots) {
      ++stats_.requests_rejected;
      throw EngineBusy(fmt::format("the queue is full (--max-queue {} beyond --parallel {})", o_.max_queue, o_.parallel), false);
    }
    queue_.push_back(std::move(seq));
    ++stats_.requests_submitted;
    stats_.prompt_tokens += static_cast<uint64_t>(n_prompt);
    update_gauges_locked();
  }
  cv_.notify_all();
  return req;
}

void Engine::update_gauges_locked() {
  stats_.queue_depth = static_cast<int64_t>(queue_.size());
  stats_.running = static_cast<int64_t>(running_.size()) - finished_unreaped_;
  stats_.kv_blocks_used = blocks_.n_used();
  stats_.kv_blocks_free = blocks_.n_free();
  stats_.kv_blocks_cached = blocks_.n_cached();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Engine::publish(Seq& s, bool final) {
  StopScan scan = scan_stop_strings(s.text, s.params.stop);
  size_t upto = final ? s.text.size() : scan.safe;
  std::lock_guard lock(s.req->mu_);
  auto& p = s.req->pending_;
  if (upto > s.sent) {
    p.text.append(s.text, s.sent, upto - s.sent);
    s.sent = upto;
  }
  p.token_ids.insert(p.token_ids.end(), s.new_ids.begin(), s.new_ids.end());
  s.new_ids.clear();
  std::move(s.new_logprobs.begin(), s.new_logprobs.end(), std::back_inserter(p.logprobs));
  s.new_logprobs.clear();
  std::move(s.prompt_lps.begin(), s.prompt_lps.end(), std::back_inserter(p.prompt_logprobs));
  s.prompt_lps.clear();
}

void Engine::finish(Seq& s, FinishReason why, const std::string& error) {
  if (s.finished) return;
  s.finished = true;
  if (why != FinishReason::stop || scan_stop_strings(s.text, s.params.stop).found == std::string::npos) {
    std::string tail = s.utf8.flush();
    s.text += tail;
  }
  publish(s, true);
  {
    // The same step: the next admission can take them. Under mu_, as submit() and stats() read the
    // pool's counts from other threads.
    std::lock_guard lock(mu_);
    blocks_.release(s.blocks);
    if (s.in_running) ++finished_unreaped_;
    update_gauges_locked();
    ++stats_.finished[finish_reason_name(why)];  // before the client learns of the end: /metrics read
                                                 // after a reply's last byte counts its request
  }
  {
    std::lock_guard lock(s.req->mu_);
    auto& p = s.req->pending_;
    p.done = true;
    p.finish = why;
    p.error = error;
    p.n_prompt = s.n_prompt;
    p.n_generated = s.n_generated;
    p.n_cached = s.n_cached;
    p.ttft_ms = s.ttft_ms;
  }
  s.req->prompt_read_ = true;
  s.req->cv_.notify_all();
  if (s.params.signal) s.params.signal->notify();
}

Engine::Choice Engine::choose(Seq& s, int64_t pos, int32_t fed, std::span<const float> logits, const GreedyRow* greedy,
                              const TopKRow* top) {
  Choice c;
  try {
    const std::string where = fmt::format("position {}", pos);
    if (greedy) {  // chosen by the backend (forward_greedy): the same rule and the same refusal
      check_finite_count(greedy->n_nonfinite, greedy->first_nonfinite, greedy->first_value, n_vocab_, where);
      c.id = greedy->id;
    } else if (top) {  // the row's best candidates (forward_topk): the same token as from the row
      check_finite_count(top->n_nonfinite, top->first_nonfinite, top->first_value, n_vocab_, where);
      c.id = s.sampler.sample_top(top->ids, top->logits, n_vocab_);
    } else {
      check_finite_logits(logits, where);
      if (s.json) {
        std::vector<uint8_t> allowed;
        json_mask_->allowed(*s.json, allowed);
        c.id = s.sampler.sample(logits, allowed);
      } else {
        c.id = s.sampler.sample(logits);
      }
      if (s.params.logprobs >= 0) {
        c.lp = generated_logprob(logits, c.id, s.params.logprobs, [&](int32_t t) {
          return tok_ ? tok_->token_bytes(fed, t) : std::string();
        });
      }
    }
  } catch (const Error& e) {
    c.error = e.what();
  }
  return c;
}

bool Engine::emit(Seq& s, const Choice& c, clock::time_point now) {
  if (!c.error.empty()) {
    finish(s, FinishReason::error, c.error);
    return false;
  }
  const int32_t next = c.id;
  // An end-of-generation token is not a generated token: no first-token or inter-token time for it.
  if (tok_ && !s.params.ignore_eos && (tok_->is_eos(next) || (o_.stop_at_bos && next == tok_->bos_id))) {
    finish(s, FinishReason::stop);
    return false;
  }
  {
    std::lock_guard lock(mu_);
    if (s.n_generated == 0) {
      s.ttft_ms = std::chrono::duration<double, std::milli>(now - s.submitted).count();
      stats_.ttft.observe(s.ttft_ms / 1000);
    } else {
      stats_.itl.observe(std::chrono::duration<double>(now - s.last_token).count());
    }
  }
  s.last_token = now;
  int32_t prev = s.tokens.back();
  s.tokens.push_back(next);
  if (!c.accepted) s.sampler.accept(next);
  ++s.n_generated;
  s.new_ids.push_back(next);
  {
    std::lock_guard lock(mu_);
    ++stats_.generated_tokens;
  }
  if (s.params.logprobs >= 0) s.new_logprobs.push_back(c.lp);
  if (tok_) {
    const auto& keep = s.params.preserved_tokens;
    s.text += s.utf8.push(std::find(keep.begin(), keep.end(), next) != keep.end() ? tok_->token_text(next)
                                                                                    : tok_->token_bytes(prev, next));
  }
  StopScan scan = scan_stop_strings(s.text, s.params.stop);
  if (scan.found != std::string::npos) {
    s.text.resize(scan.found);
    finish(s, FinishReason::stop);
    return false;
  }
  if (s.json) {  // the token was drawn from the ones that fit
    MK_CHECK(s.json->feed(json_mask_->bytes(next)), "token {} does not continue the JSON reply", next);
    if (s.json->complete()) {
      finish(s, FinishReason::stop);
      return false;
    }
  }
  if (s.n_generated >= s.max_tokens || static_cast<int64_t>(s.tokens.size()) >= o_.n_ctx) {
    finish(s, FinishReason::length);
    return false;
  }
  publish(s, false);
  s.req->prompt_read_ = true;
  s.req->cv_.notify_all();
  if (s.params.signal) s.params.signal->notify();
  return true;
}

bool Engine::step() {
  auto now = clock::now();
  // Ends of running requests that were cancelled or timed out: their blocks are free for admission.
  bool ended = false;
  for (auto& s : running_) {
    if (s->req->cancelled_)
      finish(*s, FinishReason::cancelled);
    else if (now >= s->deadline)
      finish(*s, FinishReason::timeout);
    ended |= s->finished;
  }
  // Admission (FCFS) and ends of queued requests that were cancelled or timed out.
  std::vector<std::unique_ptr<Seq>> dropped;
  {
    std::lock_guard lock(mu_);  // running_ changes only under mu_ (submit and stats read its size)
    finished_unreaped_ -= static_cast<int64_t>(std::erase_if(running_, [](const auto& s) { return s->finished; }));
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->req->cancelled_ || now >= (*it)->deadline) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    while (!queue_.empty() && static_cast<int>(running_.size()) < o_.parallel) {
      Seq& s = *queue_.front();
      if (s.params.after && !s.params.after->prompt_read()) break;  // its leader is still reading the prompt
      int64_t need = blocks_.blocks_for(s.n_prompt + std::max<int64_t>(s.max_tokens - 1, 0));
      // The prompt's longest cached prefix in whole blocks, short of its last token (whose row gives
      // the first logits); then blocks of its own for the rest.
      const int64_t hit = prefix_cache_ && !s.params.prompt_logprobs ? blocks_.acquire_prefix(std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.n_prompt)),
                                                                  (s.n_prompt - 1) / blocks_.block_size(), s.blocks, s.prefix_key)
                                        : 0;
      if (!blocks_.allocate(need - hit, s.blocks)) {  // the head waits for blocks; nobody overtakes it
        blocks_.release(s.blocks);
        s.prefix_key = 0;
        break;
      }
      s.n_keyed = hit;
      s.n_cached = s.n_computed = hit * blocks_.block_size();
      stats_.prompt_tokens_cached += static_cast<uint64_t>(s.n_cached);
      s.in_running = true;
      running_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    update_gauges_locked();
  }
  for (auto& s : dropped) finish(*s, s->req->cancelled_ ? FinishReason::cancelled : FinishReason::timeout);
  if (running_.empty()) {
    std::lock_guard lock(mu_);
    update_gauges_locked();
    return ended || !dropped.empty();
  }

  // The batch: one decode row per sequence past its prompt, then prompt chunks in arrival order.
  std::vector<Seq*> seqs;
  std::vector<int64_t> rows;
  int64_t budget = max_rows_;
  for (auto& s : running_)
    if (s->n_computed >= s->n_prompt && budget > 0) {
      seqs.push_back(s.get());
      rows.push_back(1);
      --budget;
    }
  const size_t n_decode = seqs.size();
  for (auto& s : running_)
    if (s->n_computed < s->n_prompt && budget > 0) {
      int64_t n = std::min(s->n_prompt - s->n_computed, budget);
      if (o_.prefill_chunk > 0) n = std::min(n, o_.prefill_chunk);
      seqs.push_back(s.get());
      rows.push_back(n);
      budget -= n;
    }
  // Drafts (prompt lookup) of the decoding sequences, from the rows the prompts' chunks left
  // (a draft may be refused; a prompt row is always used): no more than the tokens still to come
  // after the next one (the KV blocks reserved for them) or the context holds.
  for (size_t i = 0; i < n_decode; ++i) {
    Seq& s = *seqs[i];
    s.draft.clear();
    if (budget <= 0) continue;
    if (s.params.draft <= 0 || !paged_ || s.json) continue;
    const int64_t room = std::min({static_cast<int64_t>(s.draft_backoff.limit(s.params.draft)), budget,
                                   s.max_tokens - s.n_generated - 1, o_.n_ctx - 1 - s.n_computed});
    if (room <= 0) continue;
    s.draft = lookup_draft(s.tokens, kLookupMinNgram, kLookupMaxNgram, static_cast<int>(room));
    rows[i] += static_cast<int64_t>(s.draft.size());
    budget -= static_cast<int64_t>(s.draft.size());
  }
  run_batch(seqs, rows);
  std::lock_guard lock(mu_);
  finished_unreaped_ -= static_cast<int64_t>(std::erase_if(running_, [](const auto& s) { return s->finished; }));
  update_gauges_locked();
  return true;
}

void Engine::run_batch(std::vector<Seq*>& seqs, const std::vector<int64_t>& rows) {
  StepBatch b;
  // The logit rows of the step: a sequence's last row when it samples its next token, and with
  // prompt_logprobs every prompt row before its last (row p scores prompt token p + 1).
  struct Want {
    Seq* s;
    int64_t pos;
    bool sample;
    int32_t draft = -1;  // >= 0: the row after draft token `draft` (checked against row draft's choice)
    size_t seq = 0;      // s's index in seqs
  };
  std::vector<Want> wanted;
  bool prompt_rows = false;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = *seqs[i];
    const int64_t n_draft = s.n_computed >= s.n_prompt ? static_cast<int64_t>(s.draft.size()) : 0;
    for (int64_t r = 0; r < rows[i] - n_draft; ++r) {
      int64_t pos = s.n_computed + r;
      b.tokens.push_back(s.tokens[static_cast<size_t>(pos)]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.seq.push_back(static_cast<int32_t>(i));
      if (s.params.prompt_logprobs && pos + 1 < s.n_prompt) {
        b.logit_rows.push_back(static_cast<int32_t>(b.n_rows() - 1));
        wanted.push_back({&s, pos, false, -1, i});
        prompt_rows = true;
      }
    }
    if (s.n_computed + rows[i] - n_draft == static_cast<int64_t>(s.tokens.size()) && s.max_tokens > 0) {
      b.logit_rows.push_back(static_cast<int32_t>(b.n_rows() - 1));
      wanted.push_back({&s, s.n_computed + rows[i] - n_draft - 1, true, -1, i});
    }
    for (int64_t d = 0; d < n_draft; ++d) {  // the drafts, each row's choice wanted too
      const int64_t pos = s.n_computed + rows[i] - n_draft + d;
      b.tokens.push_back(s.draft[static_cast<size_t>(d)]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.seq.push_back(static_cast<int32_t>(i));
      b.logit_rows.push_back(static_cast<int32_t>(b.n_rows() - 1));
      wanted.push_back({&s, pos, true, static_cast<int32_t>(d), i});
    }
    b.block_tables.push_back(s.blocks);
  }
  const bool no_rows_wanted = wanted.empty();
  std::vector<float> logits;
  std::vector<GreedyRow> greedy;
  std::vector<TopKRow> top;
  // Every wanted row greedy: the backend picks the tokens where the logits are (a GPU returns 16
  // bytes per row instead of n_vocab floats). Every wanted row greedy or top-k sampled with
  // top_k <= kTopK: the backend returns each row's kTopK best candidates (16 + 8 * kTopK bytes).
  // Prompt rows need their whole logits.
  bool all_greedy = paged_ && !no_rows_wanted && !prompt_rows, all_top = all_greedy;
  for (const Want& w : wanted) {
    all_greedy &= w.s->sampler.decides_by_argmax() && w.s->params.logprobs < 0 && !w.s->json;
    all_top &= w.s->sampler.covered_by(kTopK, n_vocab_) && w.s->params.logprobs < 0 && !w.s->json;
  }
  all_top &= !all_greedy;
  try {
    if (all_greedy) {
      greedy = backend_.forward_greedy(b);
    } else if (all_top) {
      top = backend_.forward_topk(b);
    } else if (paged_) {
      logits = backend_.forward(b);  // no rows for a step of prompt chunks only
    } else {
      MK_CHECK(seqs.size() == 1);
      Seq& s = *seqs[0];
      if (s.n_computed == 0) backend_.reset();
      logits = backend_.forward(std::span<const int32_t>(b.tokens), s.n_computed);
      if (wanted.empty())
        logits.clear();
      else if (logits.size() > static_cast<size_t>(n_vocab_))  // graphs with all_logits: keep the last row
        logits.erase(logits.begin(), logits.end() - n_vocab_);
    }
  } catch (const Error& e) {
    for (Seq* s : seqs) finish(*s, FinishReason::error, e.what());
    return;
  }
  {
    std::lock_guard lock(mu_);
    ++stats_.steps;
    stats_.batch_rows += static_cast<uint64_t>(b.n_rows());
  }
  const size_t got = all_greedy ? greedy.size() : all_top ? top.size() : logits.size();
  if (all_greedy || all_top ? got != wanted.size() : got != wanted.size() * static_cast<size_t>(n_vocab_)) {
    std::string msg = fmt::format("backend '{}' returned {} {} for {} rows of {} tokens", backend_.name(), got,
                                  all_greedy ? "greedy rows" : all_top ? "top-k rows" : "logits", wanted.size(), n_vocab_);
    for (Seq* s : seqs) finish(*s, FinishReason::error, msg);
    return;
  }
  const auto now = clock::now();
  std::vector<Choice> chosen(wanted.size());
  auto row_of = [&](size_t k) {
    return std::span<const float>(logits.data() + k * static_cast<size_t>(n_vocab_), static_cast<size_t>(n_vocab_));
  };
  auto choose_row = [&](size_t k) {
    const Want& w = wanted[k];
    const int32_t fed = b.tokens[static_cast<size_t>(b.logit_rows[k])];
    return all_greedy ? choose(*w.s, w.pos, fed, {}, &greedy[k], nullptr)
           : all_top  ? choose(*w.s, w.pos, fed, {}, nullptr, &top[k])
                      : choose(*w.s, w.pos, fed, row_of(k), nullptr, nullptr);
  };
  auto choose_rows = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) {
      const Want& w = wanted[k];
      if (!w.sample) {  // a prompt row: the next prompt token's entry (a non-finite row ends the request)
        Choice& c = chosen[k];
        try {
          check_finite_logits(row_of(k), fmt::format("position {}", w.pos));
          const auto& t = w.s->tokens;
          const int32_t prev = t[static_cast<size_t>(w.pos)];
          c.id = t[static_cast<size_t>(w.pos + 1)];
          c.lp = generated_logprob(row_of(k), c.id, w.s->params.logprobs, [&](int32_t x) {
            return tok_ ? tok_->token_bytes(prev, x) : std::string();
          });
        } catch (const Error& e) {
          c.error = e.what();
        }
        continue;
      }
      if (w.draft >= 0 && !w.s->sampler.decides_by_argmax()) continue;  // drawn below, once the token before it is known
      chosen[k] = choose_row(k);
    }
  };
  // Rows drawn from whole logits rows (~1 ms each at a 49152-token vocabulary on a Zen 1 core) are
  // shared out over a few threads; each touches only its own sequence's sampler.
  const size_t helpers = all_greedy || all_top || n_vocab_ < 4096 ? 0
                         : std::min<size_t>({wanted.size() / 2, kSamplingThreads - 1,
                                             std::max(1u, std::thread::hardware_concurrency()) - 1});
  if (helpers == 0) {
    choose_rows(0, wanted.size());
  } else {
    std::vector<std::thread> pool;
    const size_t per = (wanted.size() + helpers) / (helpers + 1);
    for (size_t h = 1; h <= helpers; ++h)
      pool.emplace_back(choose_rows, std::min(wanted.size(), h * per), std::min(wanted.size(), (h + 1) * per));
    choose_rows(0, std::min(wanted.size(), per));
    for (auto& t : pool) t.join();
  }
  // Drafts: a sequence keeps the rows up to its first draft that the row before it did not choose
  // (their KV holds the tokens it generates; later steps overwrite the rest), and the choices of
  // those rows are its next tokens. (A draft's row follows the row before it in `wanted`.) A sampled
  // sequence draws a draft's row only once the row before it chose the draft: its penalty window
  // takes that token first, and its random numbers go to the rows it keeps, as without drafts.
  std::vector<int64_t> accepted(seqs.size(), 0);
  auto drafted = [&](size_t i) { return seqs[i]->n_computed >= seqs[i]->n_prompt ? static_cast<int64_t>(seqs[i]->draft.size()) : 0; };
  for (size_t k = 0; k < wanted.size(); ++k) {
    const Want& w = wanted[k];
    if (w.draft < 0 || accepted[w.seq] != w.draft) continue;
    Choice& before = chosen[k - 1];
    if (!before.error.empty() || before.id != w.s->draft[static_cast<size_t>(w.draft)]) continue;
    ++accepted[w.seq];
    if (!w.s->sampler.decides_by_argmax()) {
      w.s->sampler.accept(before.id);
      before.accepted = true;
      chosen[k] = choose_row(k);
    }
  }
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < seqs.size(); ++i) {
      stats_.draft_tokens += static_cast<uint64_t>(drafted(i));
      stats_.draft_tokens_accepted += static_cast<uint64_t>(accepted[i]);
      seqs[i]->draft_backoff.record(drafted(i), accepted[i]);
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->n_computed += rows[i] - drafted(i) + accepted[i];
    if (prefix_cache_) key_full_blocks(*seqs[i]);
  }
  // In row order: a sequence's prompt entries come before its first token.
  for (size_t k = 0; k < wanted.size(); ++k) {
    Seq& s = *wanted[k].s;
    if (s.finished) continue;
    if (wanted[k].draft >= accepted[wanted[k].seq]) continue;  // a draft's row after a refused draft (-1: not a draft)
    if (wanted[k].sample) {
      emit(s, chosen[k], now);
    } else if (!chosen[k].error.empty()) {
      finish(s, FinishReason::error, chosen[k].error);
    } else {
      s.prompt_lps.push_back(std::move(chosen[k].lp));
    }
  }
  for (Seq* s : seqs)  // max_tokens 0: the request ends once its prompt is read
    if (!s->finished && s->max_tokens == 0 && s->n_computed >= s->n_prompt) finish(*s, FinishReason::length);
}

// Keys every block of s whose rows all hold KV now, so that later requests can share its prefix: as
// far as s.tokens goes (the rows of accepted drafts hold tokens emit() adds after this; their blocks
// are keyed at the next step).
void Engine::key_full_blocks(Seq& s) {
  const int64_t bs = blocks_.block_size();
  const int64_t known = std::min<int64_t>(s.n_computed, static_cast<int64_t>(s.tokens.size()));
  std::lock_guard lock(mu_);  // the pool's bookkeeping changes under mu_
  for (; (s.n_keyed + 1) * bs <= known; ++s.n_keyed)
    s.prefix_key = blocks_.add_key(s.blocks[static_cast<size_t>(s.n_keyed)], s.prefix_key,
                                   std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.n_keyed * bs),
                                                                              static_cast<size_t>(bs)));
}

void Engine::start() {
  std::lock_guard lock(mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] {
    for (;;) {
      {
        std::unique_lock lock(mu_);
        if (stop_ && queue_.empty() && running_.empty()) return;
      }
      if (!step()) {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || !queue_.empty(); });
      }
    }
  });
}

void Engine::begin_drain() {
  std::lock_guard lock(mu_);
  draining_ = true;
}

void Engine::shutdown(bool cancel_all) {
  std::lock_guard shutdown_lock(shutdown_mu_);  // one caller at a time (a signal thread and main may both call)
  std::thread t;
  bool started;
  {
    std::lock_guard lock(mu_);
    draining_ = true;
    if (cancel_all) {
      for (auto& s : queue_) s->req->cancel();
      for (auto& s : running_) s->req->cancel();  // the flag is atomic; the scheduler ends them
    }
    stop_ = true;
    t = std::move(thread_);
    started = started_;
  }
  cv_.notify_all();
  if (started) {
    if (t.joinable()) t.join();
  } else {
    while (step()) {  // no scheduler thread: drive the remaining work here
    }
  }
}

std::string prometheus_text(const EngineStats& s) {
  std::string o;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    o += fmt::format("# HELP megakernel_{0} {1}\n# TYPE megakernel_{0} counter\nmegakernel_{0} {2}\n", name, help, v);
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    o += fmt::format("# HELP megakernel_{0} {1}\n# TYPE megakernel_{0} gauge\nmegakernel_{0} {2}\n", name, help, v);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    o += fmt::format("# HELP megakernel_{0} {1}\n# TYPE megakernel_{0} histogram\n", name, help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      o += fmt::format("megakernel_{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cum);
    }
    o += fmt::format("megakernel_{0}_bucket{{le=\"+Inf\"}} {1}\nmegakernel_{0}_sum {2}\nmegakernel_{0}_count {1}\n",
                     name, h.count, h.sum);
  };
  counter("requests_total", "Requests accepted into the queue.", s.requests_submitted);
  counter("requests_rejected_total", "Requests refused because the queue was full.", s.requests_rejected);
  o += "# HELP megakernel_requests_finished_total Requests ended, by finish reason.\n"
       "# TYPE megakernel_requests_finished_total counter\n";
  for (const char* r : {"stop", "length", "cancelled", "timeout", "error"}) {
    auto it = s.finished.find(r);
    o += fmt::format("megakernel_requests_finished_total{{reason=\"{}\"}} {}\n", r,
                     it == s.finished.end() ? 0 : it->second);
  }
  counter("prompt_tokens_total", "Prompt tokens of accepted requests.", s.prompt_tokens);
  counter("generated_tokens_total", "Tokens generated.", s.generated_tokens);
  counter("steps_total", "Batches run (forward steps).", s.steps);
  counter("batch_rows_total", "Rows (tokens) of all batches run.", s.batch_rows);
  counter("prompt_tokens_cached_total", "Prompt tokens whose KV came from the prefix cache.", s.prompt_tokens_cached);
  counter("draft_tokens_total", "Tokens drafted by prompt lookup (serve --draft).", s.draft_tokens);
  counter("draft_tokens_accepted_total", "Drafted tokens the model confirmed (generated without a step of their own).", s.draft_tokens_accepted);
  gauge("queue_depth", "Requests waiting for admission.", s.queue_depth);
  gauge("requests_running", "Sequences admitted and not yet ended.", s.running);
  gauge("kv_blocks_used", "KV cache blocks held by sequences.", s.kv_blocks_used);
  gauge("kv_blocks_free", "KV cache blocks free (cached ones included).", s.kv_blocks_free);
  gauge("kv_blocks_cached", "Free KV cache blocks still holding a prefix that later requests can reuse.",
        s.kv_blocks_cached);
  gauge("kv_block_size", "Token rows per KV cache block.", s.kv_block_size);
  histogram("time_to_first_token_seconds", "From the request's arrival to its first generated token.", s.ttft);
  histogram("inter_token_latency_seconds", "Between consecutive generated tokens of a request.", s.itl);
  return o;
}

}  // namespace mk
