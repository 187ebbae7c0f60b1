// A Session holds one loaded model, its tokenizer, its compiled graph and a backend with a KV cache.
// generate() runs prompt + decode steps; one graph/program serves the whole generation.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "runtime/sampler.h"

namespace mk {

struct SessionOptions {
  std::string model_path;      // GGUF file, llama2.c .bin, HF directory, or synth:<shape>
  std::string tokenizer_path;  // optional (-z); llama2.c checkpoints need one
  std::string backend;         // "" = default_backend_name()
  BackendOptions backend_options;
  int64_t n_ctx = 0;           // 0 = the model's context length, capped at kDefaultMaxCtx
  bool all_logits = false;     // logits for every prompt position (the `logits` command)
  bool need_tokenizer = true;
};
inline constexpr int64_t kDefaultMaxCtx = 4096;

// Loads a model by path: files and directories via load_model, "synth:<name>" via the synthetic
// model table when available.
ModelFile open_model(const std::string& path);

class Session {
 public:
  explicit Session(const SessionOptions& options);
  // Runs the tokens at positions n_past.. and advances n_past; returns the backend's logits.
  std::vector<float> eval(std::span<const int32_t> tokens);
  void reset();

  ModelFile model;
  std::unique_ptr<Tokenizer> tokenizer;
  Graph graph;
  std::unique_ptr<Backend> backend;
  Hparams hparams;
  int64_t n_ctx = 0;
  int64_t n_past = 0;
  bool stop_at_bos = false;  // llama2.c convention: the model ends a story by emitting BOS
};

struct GenerateOptions {
  std::string prompt;
  int n_new = 256;
  SamplerOptions sampler;
  bool ignore_eos = false;
  bool echo_prompt = false;  // pass the prompt text to on_text once it is known to fit the context
  // Add the vocabulary's BOS/EOS around the prompt (off for a rendered chat template, which writes
  // its own special tokens, as Hugging Face's apply_chat_template does). Special tokens written in
  // the prompt text are always parsed.
  bool add_bos = true;
  // When not empty: these tokens are the prompt (evaluated at the session's n_past), `prompt` is
  // only echoed.
  std::vector<int32_t> prompt_ids;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids, generated_ids;
  std::string text;         // generated text only, valid UTF-8
  std::string stop_reason;  // "eos", "n_new", "context"
  double prompt_ms = 0, generation_ms = 0;
  int n_decode_steps = 0;
  double prompt_ms_per_token() const { return prompt_ids.empty() ? 0 : prompt_ms / static_cast<double>(prompt_ids.size()); }
  double ms_per_token() const { return n_decode_steps ? generation_ms / n_decode_steps : 0; }
};

// Streams text pieces (valid UTF-8) to on_text as they are generated. The caller calls
// s.backend->finish() when done with the session's steps (writes traces). Throws mk::Error when the
// prompt does not fit the context.
GenerateResult generate(Session& s, const GenerateOptions& o, const std::function<void(const std::string&)>& on_text = {});

}  // namespace mk
