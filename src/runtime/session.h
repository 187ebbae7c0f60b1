// A Session holds one loaded model, its tokenizer, its compiled graph and a backend with a KV cache.
// generate() runs prompt + decode steps; one graph/program serves the whole generation.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "runtime/json_prefix.h"
#include "runtime/sampler.h"

namespace mk {

struct SessionOptions {
  std::string model_path;      // GGUF file, llama2.c .bin, HF directory, or synth:<shape>
  std::string tokenizer_path;  // optional (-z); llama2.c checkpoints need one
  std::string backend;         // "" = default_backend_name()
  BackendOptions backend_options;
  int64_t n_ctx = 0;           // 0 = the model's context length, capped at kDefaultMaxCtx
  bool all_logits = false;     // logits for every prompt position (the `logits` command)
  bool embeddings = false;     // an embedding graph (BuildOptions::embeddings; runtime/embed.h): eval() returns hidden states
  // Paged KV pool (BuildOptions): rows shared by all sequences (0 = kv_pool_seqs x n_ctx; `run`
  // has one sequence) and rows per block (0 = the default, 16). `serve` sizes it for --parallel.
  int64_t kv_pool_tokens = 0;
  int64_t kv_pool_seqs = 1;
  int64_t kv_block_size = 0;
  bool need_tokenizer = true;
  // With need_tokenizer false: still load the tokenizer when there is one (-z, or the model's own),
  // and go on without one otherwise (synthetic models, `run --ids`). An explicit -z must load.
  bool tokenizer_if_available = false;
};
inline constexpr int64_t kDefaultMaxCtx = 4096;

// The context length a request of n_ctx gives (0: the model's training context, capped at
// kDefaultMaxCtx; 4096 without one). Throws mk::Error for a negative n_ctx or one above the
// model's training context.
int64_t resolve_n_ctx(const Hparams& hp, int64_t n_ctx);

// Loads a model by path: files and directories via load_model, "synth:<name>" via the synthetic
// model table when available. with_data = false is enough for anything that needs names, dtypes and
// shapes only (building the graph, compiling the program, `info`): synthetic models then carry no
// weight data (tensor data == nullptr); files are mapped either way.
ModelFile open_model(const std::string& path, bool with_data = true);
// Why the model's own tokenizer (GGUF metadata, an HF tokenizer.json, a llama2.c tokenizer file
// beside it) cannot be loaded, or that a llama2.c checkpoint has none beside it; "" when it loads
// or another model carries none.
std::string tokenizer_problem(const ModelFile& m, int64_t n_vocab);

class Session {
 public:
  explicit Session(const SessionOptions& options);
  // Runs the tokens at positions n_past.. and advances n_past; returns the backend's logits.
  std::vector<float> eval(std::span<const int32_t> tokens);
  // The same step, returning the last token's greedy choice (Backend::forward_greedy) instead of logits.
  GreedyRow eval_greedy(std::span<const int32_t> tokens);
  // The same step, returning the last token's kTopK best candidates (Backend::forward_topk).
  TopKRow eval_topk(std::span<const int32_t> tokens);
  // Greedy decoding `steps` tokens ahead from `token` at n_past (Backend::decode_greedy; at most
  // the context's room); advances n_past by the rows returned. The caller sets n_past back to the
  // positions it keeps when it stops before using every row.
  std::vector<GreedyRow> eval_greedy_steps(int32_t token, int steps);
  // The same steps returning every token's row (a paged backend: at most max_batch_rows() tokens):
  // prompt lookup decoding checks its draft tokens with them. eval_rows: [tokens, n_vocab] logits.
  std::vector<GreedyRow> eval_greedy_rows(std::span<const int32_t> tokens);
  std::vector<TopKRow> eval_topk_rows(std::span<const int32_t> tokens);
  std::vector<float> eval_rows(std::span<const int32_t> tokens);
  void reset();

  ModelFile model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when need_tokenizer is false and none was found
  // With tokenizer_if_available: why the model's own tokenizer, which it carries, cannot be used (a
  // damaged file: the error a text prompt gets, "PATH: tokenizer model ... is not supported");
  // empty when it loaded or the model has none.
  std::string tokenizer_error;
  Graph graph;
  std::unique_ptr<Backend> backend;
  Hparams hparams;
  int64_t n_ctx = 0;
  int64_t n_past = 0;
  // The sequences the default KV pool was sized for: SessionOptions::kv_pool_seqs, at most a step's
  // rows (the most that can run at once).
  int64_t kv_pool_seqs = 1;
  bool stop_at_bos = false;  // llama2.c convention: the model ends a story by emitting BOS
};

struct GenerateOptions {
  std::string prompt;
  // Non-null: the reply is one JSON value of this schema (runtime/json_prefix.h; as serve's
  // response_format): tokens are drawn from those that continue it, and generation stops
  // (stop_reason "json") when it is complete. Needs a tokenizer.
  std::shared_ptr<const JsonSchema> json;
  // Non-empty: the prompt as token ids (no BOS added; evaluated at the session's n_past), not
  // `prompt`, which is then only echoed.
  std::vector<int32_t> prompt_ids;
  int n_new = 256;
  SamplerOptions sampler;
  bool ignore_eos = false;
  bool echo_prompt = false;  // pass the prompt text to on_text once it is known to fit the context
  // Add the vocabulary's BOS/EOS around the prompt (off for a rendered chat template, which writes
  // its own special tokens, as Hugging Face's apply_chat_template does). Special tokens written in
  // the prompt text are always parsed.
  bool add_bos = true;
  // Tokens before the prompt that the KV cache already holds (a conversation's earlier turns): they
  // enter the penalty window first, so that a chat turn is penalized as the whole conversation
  // would be (serve's chat sends the whole conversation as its prompt), and prompt lookup drafts
  // from them too.
  std::vector<int32_t> penalty_context;
  // When set and true, generation stops before the next token (stop_reason "interrupted"): `chat`
  // sets it from SIGINT so that Ctrl-C ends the reply, not the conversation.
  const std::atomic<bool>* interrupt = nullptr;
  // -1: none. n in [0, kMaxTopLogprobs]: each generated token's log-probability and the n most likely
  // tokens (GenerateResult::logprobs); the tokens are then chosen from the whole logits row.
  int logprobs = -1;
  // Prompt lookup decoding (runtime/lookup.h): up to `draft` tokens drafted from the text so far,
  // checked in one step on a backend with a paged KV cache (not for JSON replies). Each row's token
  // is chosen as without drafts (greedy, or sampled with the same random numbers) and the rows after
  // the first draft it differs from are dropped: the tokens are the same as without. 0 = off.
  int draft = 0;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids, generated_ids;
  std::vector<GeneratedLogprob> logprobs;  // one per generated id when GenerateOptions::logprobs >= 0
  std::string text;         // generated text only, valid UTF-8
  std::string stop_reason;  // "eos", "n_new", "context", "interrupted"
  double prompt_ms = 0, generation_ms = 0;
  int n_decode_steps = 0;
  int64_t n_drafted = 0, n_draft_accepted = 0;  // prompt lookup: tokens drafted, and those the model confirmed
  double prompt_ms_per_token() const { return prompt_ids.empty() ? 0 : prompt_ms / static_cast<double>(prompt_ids.size()); }
  double ms_per_token() const { return n_decode_steps ? generation_ms / n_decode_steps : 0; }
};

// Why GenerateOptions::draft cannot be used for these options on this session ("" when it can):
// drafts need a paged KV cache, and a JSON reply's choices depend on its grammar's state. `run` and
// `chat` print it as a note.
std::string draft_unused_reason(const Session& s, const GenerateOptions& o);

// Streams text pieces (valid UTF-8) to on_text and each generated id to on_token as they are
// generated. The caller calls s.backend->finish() when done with the session's steps (writes
// traces). A text prompt needs the session's tokenizer; prompt_ids do not: without a tokenizer
// there is no EOS (generation runs to n_new or the context) and no text. Throws mk::Error when the
// prompt does not fit the context or holds an id outside the vocabulary.
GenerateResult generate(Session& s, const GenerateOptions& o, const std::function<void(const std::string&)>& on_text = {},
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace mk
