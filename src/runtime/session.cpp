#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include "model/synth.h"
#include "runtime/lookup.h"
#include "passes/pass.h"
#include "ir/topk.h"
#include "support/error.h"

namespace mk {

namespace fs = std::filesystem;

ModelFile open_model(const std::string& path, bool with_data) {
  if (path.rfind("synth:", 0) == 0) return load_synthetic_model(path, with_data);
  return load_model(path);
}

namespace {
std::unique_ptr<Tokenizer> open_tokenizer(const ModelFile& m, const std::string& explicit_path, int64_t n_vocab) {
  if (!explicit_path.empty()) {
    if (explicit_path.ends_with(".json")) return load_hf_tokenizer_json(explicit_path);
    return load_llama2c_tokenizer(explicit_path, static_cast<int32_t>(n_vocab));
  }
  if (m.path.rfind("synth:", 0) == 0)
    fail("{}: synthetic models carry no tokenizer; pass one with -z (a llama2.c tokenizer.bin with at most {} tokens)", m.path, n_vocab);
  if (m.format == "llama2c") {
    // llama2.c convention: tokenizer.bin, or tok<vocab>.bin for custom vocabularies, beside the model.
    fs::path dir = fs::path(m.path).parent_path();
    for (const std::string& name : {"tok" + std::to_string(n_vocab) + ".bin", std::string("tokenizer.bin")})
      if (fs::exists(dir / name)) return load_llama2c_tokenizer((dir / name).string(), static_cast<int32_t>(n_vocab));
    fail("{}: llama2.c checkpoints carry no tokenizer; pass one with -z (e.g. tokenizer.bin)", m.path);
  }
  return load_model_tokenizer(m);
}

// Whether the model names a tokenizer of its own (loadable or not): GGUF tokenizer.ggml.model, an HF
// directory's tokenizer.json, a tokenizer file beside a llama2.c checkpoint.
bool carries_tokenizer(const ModelFile& m, int64_t n_vocab) {
  if (m.format == "gguf") return m.has("tokenizer.ggml.model");
  if (m.format == "hf") return fs::exists(fs::path(m.path) / "tokenizer.json");
  if (m.format == "llama2c") {
    const fs::path dir = fs::path(m.path).parent_path();
    return fs::exists(dir / ("tok" + std::to_string(n_vocab) + ".bin")) || fs::exists(dir / "tokenizer.bin");
  }
  return false;
}
}  // namespace

std::string tokenizer_problem(const ModelFile& m, int64_t n_vocab) {
  // (a llama2.c checkpoint without a tokenizer beside it: the error that says to pass one with -z)
  if (m.path.rfind("synth:", 0) == 0 || (!carries_tokenizer(m, n_vocab) && m.format != "llama2c")) return "";
  try {
    const auto t = open_tokenizer(m, "", n_vocab);
    if (t->n_vocab() > n_vocab) return fmt::format("tokenizer has {} tokens but the model's vocabulary is {}", t->n_vocab(), n_vocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

namespace {
// Refuses a KV cache that cannot fit in this machine's memory before any weight is read or
// synthesised (serve --parallel 65536 on synth:llama3.1-8b used to build 16 GB of weights first):
// the rows x n_layer x (K and V) x n_head_kv x head_dim at 2 bytes an element, a lower bound of
// every KV type, against the physical memory. CUDA backends keep the cache in device memory and
// find out there.
void check_kv_fits_memory(const Hparams& hp, int64_t rows, const std::string& backend) {
  if (backend.rfind("cuda", 0) == 0 && backend != "cuda-emu") return;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double bytes = 2.0 * 2.0 * static_cast<double>(rows) * static_cast<double>(hp.n_layer) *
                       static_cast<double>(hp.n_head_kv) * static_cast<double>(hp.head_dim);
  const double phys = static_cast<double>(pages) * static_cast<double>(page);
  if (bytes > phys)
    fail("cannot allocate the KV cache: {} rows x {} layers x {} KV heads x {} need at least {:.1f} GiB, more than "
         "this machine's {:.1f} GiB of memory",
         rows, hp.n_layer, hp.n_head_kv, hp.head_dim, bytes / (1 << 30), phys / (1 << 30));
}
}  // namespace

int64_t resolve_n_ctx(const Hparams& hp, int64_t n_ctx) {
  if (n_ctx < 0) fail("context length must be positive, got {}", n_ctx);
  if (hp.n_ctx_train > 0 && n_ctx > hp.n_ctx_train)
    fail("context length {} exceeds the model's training context {}", n_ctx, hp.n_ctx_train);
  return n_ctx > 0 ? n_ctx : std::min(hp.n_ctx_train > 0 ? hp.n_ctx_train : kDefaultMaxCtx, kDefaultMaxCtx);
}

// The model is opened for its shapes first (a synthetic model's weights are built only once the
// KV cache is known to fit); files are mapped either way.
Session::Session(const SessionOptions& o) : model(open_model(o.model_path, /*with_data=*/false)) {
  hparams = read_hparams(model);
  n_ctx = resolve_n_ctx(hparams, o.n_ctx);
  BuildOptions build{n_ctx, o.all_logits};
  build.embeddings = o.embeddings;
  if (o.kv_pool_tokens < 0) fail("KV pool size must be >= 0 tokens, got {}", o.kv_pool_tokens);
  if (o.kv_pool_seqs < 1) fail("KV pool must hold at least one sequence, got {}", o.kv_pool_seqs);
  // The default pool holds kv_pool_seqs full contexts, each a whole number of blocks (3 x 100 rows in
  // 19 blocks of 16 left the third sequence 2 blocks short); no more sequences than a step's rows
  // (CompileOptions::max_tokens, at most the context), which is all that can ever run at once.
  const int64_t block = o.kv_block_size > 0 ? o.kv_block_size : std::min(kDefaultKvBlockSize, n_ctx);
  kv_pool_seqs = std::min(o.kv_pool_seqs, std::min(CompileOptions{}.max_tokens, n_ctx));
  build.kv_pool_tokens = o.kv_pool_tokens > 0 ? o.kv_pool_tokens
                                              : (kv_pool_seqs > 1 ? kv_pool_seqs * ((n_ctx + block - 1) / block) * block : 0);
  build.kv_block_size = o.kv_block_size;
  check_kv_fits_memory(hparams, build.kv_pool_tokens > 0 ? build.kv_pool_tokens : n_ctx,
                       o.backend.empty() ? default_backend_name() : o.backend);
  if (o.model_path.rfind("synth:", 0) == 0) model = open_model(o.model_path);  // now its weights
  if (o.need_tokenizer || !o.tokenizer_path.empty()) {
    tokenizer = open_tokenizer(model, o.tokenizer_path, hparams.n_vocab);
  } else if (o.tokenizer_if_available && model.path.rfind("synth:", 0) != 0) {
    try {
      tokenizer = open_tokenizer(model, "", hparams.n_vocab);
    } catch (const Error& e) {
      // Ids in, ids out works without one; a tokenizer that is there but broken is kept for the
      // caller to name (a text prompt, `tokenize` and `chat` refuse the same model with this error).
      if (carries_tokenizer(model, hparams.n_vocab))
        tokenizer_error = e.what();
      else
        std::fprintf(stderr, "note: no tokenizer (%s): token ids only\n", e.what());
    }
  }
  if (tokenizer && tokenizer->n_vocab() > hparams.n_vocab)
    fail("tokenizer has {} tokens but the model's vocabulary is {}", tokenizer->n_vocab(), hparams.n_vocab);
  // A smaller vocabulary is allowed (a model's embedding rows are often padded past its tokenizer's),
  // but one given with -z may belong to another model: say so, since its text would be nonsense.
  if (tokenizer && !o.tokenizer_path.empty() && tokenizer->n_vocab() < hparams.n_vocab)
    std::fprintf(stderr,
                 "warning: -z %s: the tokenizer has %d tokens, the model's vocabulary %lld; ids from %d on print as "
                 "nothing (is it this model's tokenizer?)\n",
                 o.tokenizer_path.c_str(), tokenizer->n_vocab(), static_cast<long long>(hparams.n_vocab),
                 tokenizer->n_vocab());
  stop_at_bos = model.format == "llama2c";
  graph = build_graph(model, build);
  backend = make_backend(o.backend.empty() ? default_backend_name() : o.backend, graph, model, o.backend_options);
}

namespace {
// One step of `tokens` at n_past through `forward(n_past)` (one of the backend's forms): checks the
// context and the vocabulary first, advances n_past after.
template <class Forward>
auto eval_step(Session& s, std::span<const int32_t> tokens, Forward forward) {
  if (s.n_past + static_cast<int64_t>(tokens.size()) > s.n_ctx)
    fail("context overflow: {} tokens in the cache + {} new > context length {}", s.n_past, tokens.size(), s.n_ctx);
  for (int32_t t : tokens)
    if (t < 0 || t >= s.hparams.n_vocab) fail("token id {} is outside the vocabulary [0, {})", t, s.hparams.n_vocab);
  auto r = forward(s.n_past);
  s.n_past += static_cast<int64_t>(tokens.size());
  return r;
}
}  // namespace

std::vector<float> Session::eval(std::span<const int32_t> tokens) {
  return eval_step(*this, tokens, [&](int64_t at) { return backend->forward(tokens, at); });
}

GreedyRow Session::eval_greedy(std::span<const int32_t> tokens) {
  return eval_step(*this, tokens, [&](int64_t at) { return backend->forward_greedy(tokens, at); });
}

TopKRow Session::eval_topk(std::span<const int32_t> tokens) {
  return eval_step(*this, tokens, [&](int64_t at) { return backend->forward_topk(tokens, at); });
}

std::vector<GreedyRow> Session::eval_greedy_steps(int32_t token, int steps) {
  if (steps < 1) fail("eval_greedy_steps: {} steps", steps);
  const int32_t t[1] = {token};
  std::vector<GreedyRow> rows;
  eval_step(*this, t, [&](int64_t at) {
    rows = backend->decode_greedy(token, at, static_cast<int>(std::min<int64_t>(steps, n_ctx - at)));
    return 0;
  });
  MK_CHECK(!rows.empty(), "decode_greedy gave no rows");
  n_past += static_cast<int64_t>(rows.size()) - 1;  // eval_step advanced it by one
  return rows;
}

namespace {
// One step of `tokens` on the paged pool with every row a logit row, through `forward(batch)`.
template <typename Forward>
auto eval_all_rows(Session& s, std::span<const int32_t> tokens, Forward forward) {
  if (s.backend->kv_pool_blocks() <= 0) fail("eval_*_rows: backend '{}' has no paged KV cache", s.backend->name());
  if (static_cast<int64_t>(tokens.size()) > s.backend->max_batch_rows())
    fail("eval_*_rows: {} tokens, more than a step's {} rows", tokens.size(), s.backend->max_batch_rows());
  return eval_step(s, tokens, [&](int64_t at) {
    return forward(one_sequence_batch(tokens, at, s.backend->kv_block_size(), /*all_rows=*/true));
  });
}
}  // namespace

std::vector<GreedyRow> Session::eval_greedy_rows(std::span<const int32_t> tokens) {
  return eval_all_rows(*this, tokens, [&](const StepBatch& b) { return backend->forward_greedy(b); });
}

std::vector<TopKRow> Session::eval_topk_rows(std::span<const int32_t> tokens) {
  return eval_all_rows(*this, tokens, [&](const StepBatch& b) { return backend->forward_topk(b); });
}

std::vector<float> Session::eval_rows(std::span<const int32_t> tokens) {
  return eval_all_rows(*this, tokens, [&](const StepBatch& b) { return backend->forward(b); });
}

void Session::reset() {
  backend->reset();
  n_past = 0;
}

std::string draft_unused_reason(const Session& s, const GenerateOptions& o) {
  if (o.draft <= 0) return "";
  if (o.json) return "a JSON reply is drawn token by token from the tokens that continue it";
  if (s.backend->kv_pool_blocks() <= 0) return fmt::format("backend '{}' has no paged KV cache", s.backend->name());
  return "";
}

GenerateResult generate(Session& s, const GenerateOptions& o, const std::function<void(const std::string&)>& on_text,
                        const std::function<void(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) { return std::chrono::duration<double, std::milli>(clock::now() - t0).count(); };
  const Tokenizer* tok = s.tokenizer.get();
  if (o.prompt_ids.empty() && !tok) fail("generate: a text prompt needs a tokenizer (or give the prompt as token ids)");
  if (o.n_new < 0) fail("number of tokens to generate must be >= 0, got {}", o.n_new);
  GenerateResult r;
  if (!o.prompt_ids.empty()) {
    r.prompt_ids = o.prompt_ids;
    for (int32_t t : r.prompt_ids)
      if (t < 0 || t >= s.hparams.n_vocab) fail("prompt token id {} is outside the vocabulary [0, {})", t, s.hparams.n_vocab);
  } else {
    r.prompt_ids = tok->encode(o.prompt, o.add_bos, /*parse_special=*/true);
  }
  if (r.prompt_ids.empty())
    fail("{}", o.prompt.empty() ? "the prompt is empty and the tokenizer adds no BOS token to start from: give one (-p TEXT)"
                                : "the prompt encodes to no tokens and the tokenizer adds no BOS token");
  if (static_cast<int64_t>(r.prompt_ids.size()) > s.n_ctx - s.n_past)
    fail("prompt is {} tokens but only {} fit the context ({}); {}", r.prompt_ids.size(), s.n_ctx - s.n_past, s.n_ctx,
         s.hparams.n_ctx_train > 0 && s.n_ctx >= s.hparams.n_ctx_train
             ? "use a shorter prompt (the context is already the model's training context, the largest -c)"
             : "use a shorter prompt or a larger -c");
  Sampler sampler(o.sampler);
  for (int32_t t : o.penalty_context) sampler.accept(t);  // the penalty window: what came before,
  for (int32_t t : r.prompt_ids) sampler.accept(t);       // then the prompt (llama.cpp's)
  Utf8Stream utf8;
  auto emit = [&](const std::string& bytes) {
    std::string t = utf8.push(bytes);
    r.text += t;
    if (on_text && !t.empty()) on_text(t);
  };
  if (o.echo_prompt && on_text) {
    std::string echo = !o.prompt_ids.empty() ? (tok ? tok->decode(r.prompt_ids) : "") : o.prompt;
    if (!echo.empty()) on_text(echo);
  }
  // Greedy decoding asks the backend for the token ids and top-k sampling (top_k <= kTopK) for the
  // row's best candidates, computed where the logits are (on a GPU 16 or 16 + 8 * kTopK bytes per
  // step come back instead of the logits); other sampling (top_k 0 or > kTopK) needs the whole row.
  // Penalties change the row first: greedy then takes the argmax of the whole penalized row.
  // Log-probabilities are of the whole row.
  if (o.logprobs < -1 || o.logprobs > kMaxTopLogprobs)
    fail("logprobs must be between 0 and {} alternatives, got {}", kMaxTopLogprobs, o.logprobs);
  try {
    check_logit_bias(o.sampler, s.hparams.n_vocab);
  } catch (const Error& e) {
    fail("logit bias: {}", e.what());
  }
  // A JSON reply: the tokens that continue it (each token's bytes after an ordinary token), from
  // the whole row.
  std::optional<JsonPrefix> json;
  std::unique_ptr<JsonTokenMask> json_mask;
  std::vector<uint8_t> allowed;
  if (o.json) {
    if (!tok) fail("a JSON reply needs the model's tokenizer");
    json.emplace(*o.json);
    json_mask = JsonTokenMask::of(*tok, s.hparams.n_vocab);
  }
  const bool greedy = sampler.decides_by_argmax() && o.logprobs < 0 && !json;
  const bool top = !greedy && o.logprobs < 0 && !json && sampler.covered_by(kTopK, s.hparams.n_vocab);
  GreedyRow g;
  TopKRow c;
  std::vector<float> logits;
  // Rows computed ahead of their turn: greedy decoding takes backend->decode_steps() rows per call
  // (a GPU issues those steps before it waits), and prompt lookup a step of [next, drafts...]. Each
  // holds the n_past that using it leaves (the positions fed up to it) and the token it was fed
  // (-1: the greedy choice of the row before, which decode_greedy fed itself): a row is used only
  // when the token chosen from the row before it is the one it was fed, so the tokens are the same
  // as one step at a time. Stopping early, or a draft that differs, leaves n_past at the last row used.
  struct Ahead {
    GreedyRow g;
    TopKRow c;
    std::vector<float> logits;  // one row
    int64_t n_past = 0;
    int32_t fed = -1;
    bool drafted = false;  // fed a draft token
  };
  const int steps = greedy ? std::max(1, s.backend->decode_steps()) : 1;
  std::deque<Ahead> ahead;
  if (o.draft < 0) fail("draft tokens must be >= 0, got {}", o.draft);
  // Prompt lookup (runtime/lookup.h): a step of [next, drafts...] gives every row's greedy row,
  // candidates or logits.
  const int draft = draft_unused_reason(s, o).empty() ? static_cast<int>(std::min<int64_t>(o.draft, s.backend->max_batch_rows() - 1)) : 0;
  std::vector<int32_t> history;  // prompt + generated, for the lookup
  if (draft > 0) {  // the conversation's earlier turns too (chat)
    history = o.penalty_context;
    history.insert(history.end(), r.prompt_ids.begin(), r.prompt_ids.end());
  }
  DraftBackoff backoff;
  int64_t run_drafted = 0, run_accepted = 0;  // the latest draft: tokens drafted, and rows of it used
  auto eval = [&](std::span<const int32_t> t) {
    if (greedy)
      g = s.eval_greedy(t);
    else if (top)
      c = s.eval_topk(t);
    else
      logits = s.eval(t);
  };
  auto t0 = clock::now();
  eval(r.prompt_ids);
  r.prompt_ms = ms_since(t0);
  int64_t n_vocab = s.hparams.n_vocab;
  int32_t prev = r.prompt_ids.back();
  r.stop_reason = "n_new";
  auto t1 = clock::now();
  for (int i = 0; i < o.n_new; ++i) {
    if (o.interrupt && o.interrupt->load()) {
      r.stop_reason = "interrupted";
      break;
    }
    // Every backend's row goes through this check: a NaN/inf row is an error naming where it
    // appeared, never a token chosen by where the bad value sits.
    const std::string where = fmt::format("generation step {} (position {})", i, s.n_past - 1);
    int32_t next;
    GeneratedLogprob lp;
    if (greedy) {
      check_finite_count(g.n_nonfinite, g.first_nonfinite, g.first_value, n_vocab, where);
      next = g.id;
    } else if (top) {
      check_finite_count(c.n_nonfinite, c.first_nonfinite, c.first_value, n_vocab, where);
      next = sampler.sample_top(c.ids, c.logits, n_vocab);
    } else {
      std::span<const float> last(logits.data() + logits.size() - static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
      check_finite_logits(last, where);
      if (json) {
        json_mask->allowed(*json, allowed);
        next = sampler.sample(last, allowed);
      } else {
        next = sampler.sample(last);
      }
      if (o.logprobs >= 0)
        lp = generated_logprob(last, next, o.logprobs, [&](int32_t t) { return tok ? tok->token_bytes(prev, t) : std::string(); });
    }
    if (!o.ignore_eos && tok && (tok->is_eos(next) || (s.stop_at_bos && next == tok->bos_id))) {
      r.stop_reason = "eos";
      break;
    }
    r.generated_ids.push_back(next);
    if (draft > 0) history.push_back(next);
    if (o.logprobs >= 0) r.logprobs.push_back(std::move(lp));
    sampler.accept(next);
    if (on_token) on_token(next);
    if (tok) emit(tok->token_bytes(prev, next));
    prev = next;
    if (json) {
      MK_CHECK(json->feed(json_mask->bytes(next)), "token {} does not continue the JSON reply", next);
      if (json->complete()) {
        r.stop_reason = "json";
        break;
      }
    }
    if (i + 1 == o.n_new) break;
    if (s.n_past >= s.n_ctx) {
      r.stop_reason = "context";
      break;
    }
    ++r.n_decode_steps;
    if (!ahead.empty() && ahead.front().fed >= 0 && ahead.front().fed != next) ahead.clear();  // a draft the model did not choose
    if (draft > 0 && ahead.empty()) {  // drafts for the tokens after next: no more than will be used or fit
      if (run_drafted > 0) backoff.record(run_drafted, run_accepted);
      run_drafted = run_accepted = 0;
      const int64_t room = std::min<int64_t>({o.n_new - 2 - i, s.n_ctx - s.n_past - 1, backoff.limit(draft)});
      const std::vector<int32_t> d =
          lookup_draft(history, kLookupMinNgram, kLookupMaxNgram, static_cast<int>(std::min<int64_t>(draft, room)));
      if (!d.empty()) {
        std::vector<int32_t> fed = {next};
        fed.insert(fed.end(), d.begin(), d.end());
        const int64_t at = s.n_past;
        std::vector<GreedyRow> gs;
        std::vector<TopKRow> cs;
        std::vector<float> ls;
        if (greedy)
          gs = s.eval_greedy_rows(fed);
        else if (top)
          cs = s.eval_topk_rows(fed);
        else
          ls = s.eval_rows(fed);
        for (size_t j = 0; j < fed.size(); ++j) {
          Ahead a;
          if (greedy) a.g = gs.at(j);
          if (top) a.c = std::move(cs.at(j));
          if (!greedy && !top)
            a.logits.assign(ls.begin() + static_cast<std::ptrdiff_t>(j * static_cast<size_t>(n_vocab)),
                            ls.begin() + static_cast<std::ptrdiff_t>((j + 1) * static_cast<size_t>(n_vocab)));
          a.n_past = at + static_cast<int64_t>(j) + 1;
          a.fed = j == 0 ? -1 : fed[j];
          a.drafted = j > 0;
          ahead.push_back(std::move(a));
        }
        run_drafted = static_cast<int64_t>(d.size());
        r.n_drafted += run_drafted;
      }
    }
    if (greedy && ahead.empty() && steps > 1) {  // the next rows, up to the last token asked for
      const int64_t at = s.n_past;
      const std::vector<GreedyRow> rows = s.eval_greedy_steps(next, static_cast<int>(std::min<int64_t>(steps, o.n_new - 1 - i)));
      for (size_t j = 0; j < rows.size(); ++j) ahead.push_back({rows[j], {}, {}, at + static_cast<int64_t>(j) + 1, -1, false});
    }
    if (!ahead.empty()) {  // a row computed ahead: n_past as if it had been computed alone
      Ahead& a = ahead.front();
      g = a.g;
      c = std::move(a.c);
      logits = std::move(a.logits);
      s.n_past = a.n_past;
      if (a.drafted) {
        ++run_accepted;
        ++r.n_draft_accepted;
      }
      ahead.pop_front();
      continue;
    }
    int32_t tok[1] = {next};
    eval(tok);
  }
  r.generation_ms = ms_since(t1);
  std::string tail = utf8.flush();
  r.text += tail;
  if (on_text && !tail.empty()) on_text(tail);
  return r;
}

}  // namespace mk
