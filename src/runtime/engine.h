// Continuous batching: many requests share one Backend, one step at a time (Orca, Yu et al., OSDI
// 2022; vLLM). Each step is one ragged batch (backend/step_batch.h): one decode row per running
// sequence plus chunks of the prompts of newly admitted ones (chunked prefill, so running streams
// keep flowing while a long prompt is read). Sequences own KV blocks of a shared paged pool
// (runtime/kv_blocks.h), freed in the step the request ends.
//
// Admission is first come, first served: the head of the queue starts when a running slot
// (EngineOptions::parallel) and KV blocks for its prompt + max_tokens are free; nobody overtakes it.
// The queue is bounded: submit() throws EngineBusy when it is full.
//
// Prefix caching (EngineOptions::prefix_cache, runtime/kv_blocks.h): the whole blocks of KV a
// sequence computed stay keyed by their tokens after it ends; a request whose prompt begins with the
// same tokens (a system prompt, the earlier turns of a chat) starts its prefill after them. A row's
// numbers do not depend on the batch it is computed in, so the tokens are the same as without it.
//
// A backend without a paged KV pool (kv_pool_blocks() == 0) runs one sequence at a time through
// forward(tokens, n_past), the whole prompt in one step: the same results as `run`.
//
// Threads: start() runs the scheduler on its own thread; submit(), Request::wait/cancel and stats()
// may be called from any thread. Without start(), a single thread may drive it with step().
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "model/tokenizer.h"
#include "runtime/json_prefix.h"
#include "runtime/kv_blocks.h"
#include "runtime/sampler.h"
#include "support/error.h"

namespace mk {

struct EngineOptions {
  int parallel = 4;           // most sequences running at once (capped by the backend's max_batch_rows())
  int max_queue = 32;         // requests waiting for admission; more -> EngineBusy
  int64_t n_ctx = 0;          // per-sequence context (prompt + generated tokens); required
  int64_t n_vocab = 0;        // logits row length; required
  int64_t prefill_chunk = 0;  // most prompt rows of one sequence per step; 0 = as many as the batch holds
  bool stop_at_bos = false;   // llama2.c convention: the model ends a story with BOS
  bool prefix_cache = true;   // reuse the KV blocks of earlier requests' prefixes (paged backends)
};

class Request;

// Wakes one thread that waits on several requests (serve's n > 1 and several prompts): notified
// whenever any request that holds it has news. Thread-safe.
class RequestSignal {
 public:
  void notify();
  uint64_t count() const;
  // Blocks until the count passes `seen` (a value count() returned before the caller looked at its
  // requests) or `timeout` passes; true when it did.
  bool wait_past(uint64_t seen, std::chrono::milliseconds timeout);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;
};

struct RequestParams {
  std::vector<int32_t> prompt_ids;  // evaluated as given (the caller adds BOS / renders the chat template)
  // Most generated tokens; -1 = until the context is full; 0 = none (the prompt is read, e.g. for
  // its log-probabilities, and the request ends with "length").
  int64_t max_tokens = -1;
  SamplerOptions sampler;
  std::vector<std::string> stop;  // stop strings: generation ends before the first occurrence in the text
  bool ignore_eos = false;
  std::chrono::milliseconds timeout{0};  // from submit() to the end; 0 = none
  // -1: none. n in [0, kMaxTopLogprobs]: each generated token's log-probability and the n most likely
  // tokens at its position (RequestOutput::logprobs, runtime/sampler.h GeneratedLogprob). Such a
  // request is sampled from the whole logits row (not the backend's greedy or top-k ops).
  int logprobs = -1;
  // With logprobs >= 0: also each prompt token's log-probability given the tokens before it, and
  // the `logprobs` most likely tokens there (RequestOutput::prompt_logprobs; OpenAI's echo, what
  // lm-evaluation-harness scores with). Needs the logits of every prompt row: no prefix cache.
  bool prompt_logprobs = false;
  // Non-null: the reply is one JSON value of this schema (OpenAI's response_format json_object:
  // JsonSchema::any_object(); json_schema: JsonSchema::compile): each token is drawn from those that
  // keep the text a prefix of one (runtime/json_prefix.h), and the request ends ("stop") when the
  // value is complete. Needs a tokenizer.
  std::shared_ptr<const JsonSchema> json;
  // Also notified whenever this request has news (Request::wait's condition); may be shared.
  std::shared_ptr<RequestSignal> signal;
  // Non-null: this request is not admitted before `after` has read its whole prompt (its first
  // token, or its end), so that with the prefix cache it starts from the KV blocks `after` computed
  // for the same prompt (serve's n > 1: one prefill, not n). It waits at the head of the queue.
  std::shared_ptr<const Request> after;
  // Tokens whose literal text goes into the reply although decoding gives them none (control tokens
  // that mark a tool call: runtime/tool_calls.h tool_marker_tokens).
  std::vector<int32_t> preserved_tokens;
  // Prompt lookup decoding (runtime/lookup.h): up to `draft` tokens drafted from the prompt and reply
  // each step, checked in the same step's batch, on a paged backend (not for JSON replies). Each
  // row's token is chosen as without drafts (a sampled one with the same random numbers, after the
  // tokens before it) and the rows after the first draft it differs from are dropped: the tokens
  // are the same as without. 0 = off.
  int draft = 0;
};

// "stop": EOS/end of turn or a stop string; "length": max_tokens or the context is full;
// "cancelled": Request::cancel() (client gone); "timeout"; "error": the backend failed (message in error).
enum class FinishReason { none, stop, length, cancelled, timeout, error };
const char* finish_reason_name(FinishReason r);

// Output produced since the previous Request::wait.
struct RequestOutput {
  std::string text;                // valid UTF-8; text that may begin a stop string is held back
  std::vector<int32_t> token_ids;  // generated ids (EOS not included)
  std::vector<GeneratedLogprob> logprobs;  // one per token_ids entry when RequestParams::logprobs >= 0
  // With RequestParams::prompt_logprobs: one per prompt token after the first (the first has no
  // context), in order; they arrive before (or with) the first generated token.
  std::vector<GeneratedLogprob> prompt_logprobs;
  bool done = false;
  FinishReason finish = FinishReason::none;
  std::string error;
  int64_t n_prompt = 0, n_generated = 0;  // set when done
  int64_t n_cached = 0;                   // prompt tokens whose KV came from the prefix cache; set when done
  double ttft_ms = 0;                     // submit to first token; set when done (0: no token)
};

class Request {
 public:
  // Moves the output produced since the last call into `out` (appending text and ids). Blocks up to
  // `timeout` while there is none; returns true when something new arrived or the request is done.
  bool wait(RequestOutput& out, std::chrono::milliseconds timeout);
  // Ends the request at the next step (a queued one never starts); its blocks are freed then.
  void cancel() { cancelled_ = true; }
  bool done() const;
  // The whole prompt has been read (the first token is chosen, or the request ended).
  bool prompt_read() const { return prompt_read_; }

 private:
  friend class Engine;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> prompt_read_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  RequestOutput pending_;
};

// Raised by submit() when the queue is full or the engine is shutting down.
class EngineBusy : public Error {
 public:
  EngineBusy(const std::string& what, bool shutting_down) : Error(what), shutting_down(shutting_down) {}
  bool shutting_down;
};

// submit() refusing a request because of one of its fields: `param` names it as the OpenAI API does
// ("prompt", "max_tokens").
class RequestInvalid : public Error {
 public:
  RequestInvalid(const std::string& what, std::string param) : Error(what), param(std::move(param)) {}
  std::string param;
};

// Prometheus-style histogram: counts per upper bound (seconds), plus +Inf, sum and count.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // bounds.size() + 1 (the last is +Inf), not cumulative
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double seconds);
};

struct EngineStats {
  uint64_t requests_submitted = 0, requests_rejected = 0, prompt_tokens = 0, generated_tokens = 0;
  uint64_t steps = 0, batch_rows = 0;
  uint64_t prompt_tokens_cached = 0;  // prompt tokens of admitted requests read from the prefix cache
  uint64_t draft_tokens = 0, draft_tokens_accepted = 0;  // prompt lookup (RequestParams::draft)
  std::map<std::string, uint64_t> finished;  // by finish_reason_name
  int64_t queue_depth = 0, running = 0, kv_blocks_used = 0, kv_blocks_free = 0, kv_block_size = 0;
  int64_t kv_blocks_cached = 0;  // free blocks (counted in kv_blocks_free) still holding a cached prefix
  Histogram ttft, itl;  // time to first token, inter-token latency (seconds)
};
// Prometheus text exposition format (version 0.0.4), metric names prefixed "megakernel_".
std::string prometheus_text(const EngineStats& s);

// Stop strings in generated text: `found` is the offset of the earliest stop string (npos if
// none); `safe` is the length of the prefix that no continuation can turn into part of a stop string
// (the text minus its longest suffix that is a proper prefix of some stop string).
struct StopScan {
  size_t found = std::string::npos;
  size_t safe = 0;
};
StopScan scan_stop_strings(const std::string& text, const std::vector<std::string>& stop);

class Engine {
 public:
  // `tokenizer` may be null (synthetic models): then no EOS, no text, and stop strings never match.
  // Throws mk::Error for options that cannot work (n_ctx <= 0, parallel < 1).
  Engine(Backend& backend, const Tokenizer* tokenizer, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws mk::Error for a request that can never run (empty prompt, a token
  // outside the vocabulary, prompt + max_tokens beyond the context or the KV pool) and EngineBusy
  // when the queue is full or the engine is shutting down.
  std::shared_ptr<Request> submit(RequestParams params);
  void start();  // runs step() on a scheduler thread until shutdown()
  // Refuses new requests from now on (submit throws EngineBusy).
  void begin_drain();
  // begin_drain(); cancels every queued and running request when cancel_all, else lets them finish;
  // then stops the scheduler thread.
  void shutdown(bool cancel_all);
  // One scheduler iteration: admit, end cancelled/timed-out requests, run one batch, sample.
  // Returns false when there was nothing to run.
  bool step();
  EngineStats stats() const;
  int64_t n_ctx() const { return o_.n_ctx; }
  int64_t kv_block_size() const { return blocks_.block_size(); }
  int64_t kv_blocks_total() const { return blocks_.n_blocks(); }
  bool paged() const { return paged_; }
  bool prefix_cache() const { return prefix_cache_; }
  int parallel() const { return o_.parallel; }

 private:
  struct Seq;
  void finish(Seq& s, FinishReason why, const std::string& error = {});
  void publish(Seq& s, bool final);
  // The next token of a sequence, or why there is none (non-finite logits). `greedy`: the backend's
  // choice for a greedy request (forward_greedy), `top`: the row's best candidates (forward_topk) for
  // a request Sampler::covered_by them; either in place of the logits. Touches only s.sampler: rows
  // of different sequences may be chosen on different threads.
  struct Choice {
    int32_t id = -1;
    std::string error;
    GeneratedLogprob lp;  // when the request asks for logprobs
    bool accepted = false;  // already in the sampler's penalty window (a draft row followed it)
  };
  // The token of the row at position `pos` that was fed `fed` (logprobs' bytes follow it).
  Choice choose(Seq& s, int64_t pos, int32_t fed, std::span<const float> logits, const GreedyRow* greedy, const TopKRow* top);
  // The chosen token through EOS, the detokenizer, stop strings and limits; false when s ended.
  bool emit(Seq& s, const Choice& c, std::chrono::steady_clock::time_point now);
  void run_batch(std::vector<Seq*>& batch_seqs, const std::vector<int64_t>& n_rows_of);
  void update_gauges_locked();
  void key_full_blocks(Seq& s);

  Backend& backend_;
  const Tokenizer* tok_;
  EngineOptions o_;
  bool paged_;
  bool prefix_cache_;
  int64_t max_rows_;
  int64_t n_vocab_ = 0;
  KvBlockAllocator blocks_;
  std::once_flag json_mask_once_;
  std::unique_ptr<JsonTokenMask> json_mask_;  // every token's bytes, made for the first json_object request

  mutable std::mutex mu_;  // guards queue_, stats_, draining_, stop_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> queue_;
  std::vector<std::unique_ptr<Seq>> running_;  // scheduler thread only
  // Sequences of running_ already finished (their client may have its whole reply) but not yet
  // erased from it: their slots count as free for admission (a client with --parallel 1 that sends
  // its next request on the last byte of a reply is not refused with 429). Under mu_.
  int64_t finished_unreaped_ = 0;
  EngineStats stats_;
  bool draining_ = false, stop_ = false, started_ = false;
  std::thread thread_;
  std::mutex shutdown_mu_;
};

}  // namespace mk
