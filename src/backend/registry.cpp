#include <fmt/ranges.h>

#include "backend/backend.h"
#include "backend/cuda/driver.h"
#include "ir/topk.h"
#include "support/error.h"

namespace mk {

namespace {
struct BackendEntry {
  const char* name;
  BackendFactory make;
};
// Every backend; default_backend_name() picks one for machines with and without a GPU.
const BackendEntry kBackends[] = {
    {"cpu", make_cpu_backend},
    {"reference", make_reference_backend},
    {"cuda", make_cuda_backend},
    {"cuda-perop", make_cuda_perop_backend},
    {"cuda-graph", make_cuda_graph_backend},
    {"cuda-emu", make_cuda_emu_backend},
};
}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> r;
  for (const auto& b : kBackends) r.emplace_back(b.name);
  return r;
}

// The CUDA megakernel where a GPU and driver are present, else the CPU megakernel interpreter.
std::string default_backend_name() { return cuda::cuda_available(nullptr) ? "cuda" : "cpu"; }

std::vector<float> Backend::forward(const StepBatch&) {
  fail("backend '{}' does not run ragged batches (no paged KV cache)", name());
}

std::vector<GreedyRow> Backend::forward_greedy(const StepBatch& batch) {
  std::vector<float> logits = forward(batch);
  std::vector<GreedyRow> r;
  if (batch.logit_rows.empty()) return r;
  const size_t n_vocab = logits.size() / batch.logit_rows.size();
  for (size_t i = 0; i < batch.logit_rows.size(); ++i) r.push_back(greedy_row(std::span<const float>(logits).subspan(i * n_vocab, n_vocab)));
  return r;
}

GreedyRow Backend::forward_greedy(std::span<const int32_t> tokens, int64_t n_past) {
  if (tokens.empty()) fail("forward: no tokens");
  const size_t max = max_batch_rows() > 0 ? static_cast<size_t>(max_batch_rows()) : tokens.size();
  std::vector<GreedyRow> last;
  for (size_t at = 0; at < tokens.size(); at += max) {
    const auto chunk = tokens.subspan(at, std::min(max, tokens.size() - at));
    last = forward_greedy(one_sequence_batch(chunk, n_past + static_cast<int64_t>(at), kv_block_size(), false));
  }
  MK_CHECK(last.size() == 1, "{}: {} greedy rows for one sequence", name(), last.size());
  return last[0];
}

std::vector<TopKRow> Backend::forward_topk(const StepBatch& batch) {
  std::vector<float> logits = forward(batch);
  std::vector<TopKRow> r;
  if (batch.logit_rows.empty()) return r;
  const size_t n_vocab = logits.size() / batch.logit_rows.size();
  for (size_t i = 0; i < batch.logit_rows.size(); ++i)
    r.push_back(topk_row(std::span<const float>(logits).subspan(i * n_vocab, n_vocab), kTopK));
  return r;
}

TopKRow Backend::forward_topk(std::span<const int32_t> tokens, int64_t n_past) {
  if (tokens.empty()) fail("forward: no tokens");
  const size_t max = max_batch_rows() > 0 ? static_cast<size_t>(max_batch_rows()) : tokens.size();
  std::vector<TopKRow> last;
  for (size_t at = 0; at < tokens.size(); at += max) {
    const auto chunk = tokens.subspan(at, std::min(max, tokens.size() - at));
    last = forward_topk(one_sequence_batch(chunk, n_past + static_cast<int64_t>(at), kv_block_size(), false));
  }
  MK_CHECK(last.size() == 1, "{}: {} topk rows for one sequence", name(), last.size());
  return last[0];
}

std::unique_ptr<Backend> make_backend(const std::string& name, const Graph& graph, const ModelFile& model,
                                      const BackendOptions& options) {
  if (options.threads < 0) fail("threads: {} is negative (0 = all cores)", options.threads);
  // Each worker holds its own scratch (~280 KB and up): thousands of threads only exhaust memory.
  if (options.threads > 1024) fail("threads: {} is more than 1024", options.threads);
  for (const auto& b : kBackends)
    if (name == b.name) return b.make(graph, model, options);
  fail("unknown backend '{}'; available: {}", name, fmt::join(backend_names(), ", "));
}

}  // namespace mk
