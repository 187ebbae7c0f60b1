// Embeddings: one vector per input text, from the hidden state a decoder ends each row with (the
// output norm's rows, BuildOptions::embeddings), pooled over the input's positions and by default
// L2-normalized; as llama.cpp's `llama-embedding` / server `--embeddings` and sentence-transformers'
// Pooling module. Attention stays causal (decoder embedding models such as Qwen3-Embedding or
// e5-mistral are read with last-token pooling).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "model/model_file.h"

namespace mk {

// none: every row; mean: the rows' average; cls: the first row; last: the last row.
enum class Pooling { none, mean, cls, last };
// "none" | "mean" | "cls" | "last"; pooling_from_name throws mk::Error naming the choices.
const char* pooling_name(Pooling p);
Pooling pooling_from_name(std::string_view name);

// The pooling the model file names: GGUF `{arch}.pooling_type` (0 none, 1 mean, 2 cls, 3 last; 4,
// a reranker's rank, is refused), or an HF directory's sentence-transformers `1_Pooling/config.json`
// (pooling_mode_mean_tokens / _cls_token / _lasttoken); mean when it names none. Throws mk::Error
// for a value it cannot use, naming the file and key.
Pooling model_pooling(const ModelFile& m);

struct EmbedOptions {
  Pooling pooling = Pooling::mean;
  bool normalize = true;  // divide each vector by its L2 norm (a zero vector stays zero)
  // > 0: keep the first `dimensions` values of each vector (before normalizing): OpenAI's shortened
  // embeddings, meaningful for models trained for it (Matryoshka). 0 or >= n_embd: all.
  int64_t dimensions = 0;
  // Called before each backend step; an exception it throws ends embed() (a server's deadline or
  // shutdown). Empty: none.
  std::function<void()> before_step;
};

// Embeds each input (token ids, BOS/EOS already added) on a backend whose graph was built with
// BuildOptions::embeddings (its forward() returns [rows, n_embd]). Returns, per input, [d] floats
// (d = n_embd, or EmbedOptions::dimensions), or with Pooling::none [n_tokens * d] row-major (each row
// normalized). Inputs are
// batched: on a paged backend as many sequences as the KV pool holds at once, at most
// max_batch_rows() rows a step, one after another otherwise; the vectors do not depend on the
// batching. Throws mk::Error naming the input (its index) for: no tokens, more than n_ctx tokens or
// than the KV pool's rows, an id outside [0, n_vocab), a hidden state that is not finite.
std::vector<std::vector<float>> embed(Backend& backend, int64_t n_embd, int64_t n_ctx, int64_t n_vocab,
                                      std::span<const std::vector<int32_t>> inputs, const EmbedOptions& o);

// Callers on many threads (a server's concurrent /v1/embeddings requests) embedded together: a call
// that finds the backend busy waits, and the next batch takes every call waiting then, their inputs
// in one embed() (a step of many short inputs costs little more than one). Each call's vectors are
// bitwise those embed() gives it alone (they do not depend on the batching); `dimensions` and
// normalization are per call (EmbedOptions'), pooling is the batcher's.
class EmbedBatcher {
 public:
  EmbedBatcher(Backend& backend, int64_t n_embd, int64_t n_ctx, int64_t n_vocab, Pooling pooling);
  // Blocks until this call's vectors are ready. A batch runs its calls smallest first, in parts of
  // about one step's rows, and a call returns when its part is done (the thread running the batch
  // hands the rest on once its own call is done). `check` (may be empty) runs while the call waits
  // and before each step of its part; what it throws ends the call with that exception (waiting: at
  // once; in a part: when the part ends, or at once when it ends every call of the part). A batch that fails with mk::Error (a hidden state that overflowed) is run again
  // call by call, so each call gets its own vectors or its own error (naming its own input index).
  std::vector<std::vector<float>> embed(std::span<const std::vector<int32_t>> inputs, int64_t dimensions, bool normalize,
                                        const std::function<void()>& check = {});
  struct Stats {
    uint64_t calls = 0, batches = 0;  // calls served, and the batches that served them
  };
  Stats stats() const;

 private:
  struct Call;
  // Runs `batch` (taken from the queue by the thread whose call is `own`) in parts, smallest calls
  // first; called and returning with busy_ set, the lock released on entry and held on return.
  void run(std::vector<Call*>& batch, Call* own, std::unique_lock<std::mutex>& lock);
  void run_part(std::vector<Call*>& batch);
  Backend& backend_;
  int64_t n_embd_, n_ctx_, n_vocab_;
  Pooling pooling_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call*> waiting_;
  bool busy_ = false;
  Stats stats_;
};

}  // namespace mk
