#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

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

// The trace is written after the last step (Backend::finish): a path that cannot be written fails
// here, before any step runs. Opened for appending, so an existing file is left as it is, and a file
// made by the check is removed again.
void check_trace_path(const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) fail("--trace: {}: cannot open for writing ({})", path, std::strerror(errno));
  std::fclose(f);
  if (!existed) std::filesystem::remove(path, ec);
}
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

std::vector<int32_t> Backend::forward_rows(const StepBatch& batch, OutputKind kind) {
  const std::vector<float> logits = forward(batch);
  std::vector<int32_t> words;
  if (batch.logit_rows.empty()) return words;
  const size_t n_rows = batch.logit_rows.size(), n_vocab = logits.size() / n_rows;
  const auto w = static_cast<size_t>(output_row_words(kind, kTopK));
  words.resize(n_rows * w);
  for (size_t i = 0; i < n_rows; ++i)
    encode_output_row(kind, std::span<const float>(logits).subspan(i * n_vocab, n_vocab), kTopK, words.data() + i * w);
  return words;
}

std::vector<int32_t> Backend::last_row(std::span<const int32_t> tokens, int64_t n_past, OutputKind kind) {
  if (tokens.empty()) fail("forward: no tokens");
  const size_t max = max_batch_rows() > 0 ? static_cast<size_t>(max_batch_rows()) : tokens.size();
  std::vector<int32_t> last;
  for (size_t at = 0; at < tokens.size(); at += max) {
    const auto chunk = tokens.subspan(at, std::min(max, tokens.size() - at));
    last = forward_rows(one_sequence_batch(chunk, n_past + static_cast<int64_t>(at), kv_block_size(), false), kind);
  }
  return last;
}

namespace {
// forward_rows' words cut into `n_rows` rows, each decoded.
template <class Row>
std::vector<Row> decode_rows(std::span<const int32_t> words, size_t n_rows, Row (*decode)(std::span<const int32_t>)) {
  std::vector<Row> r;
  if (n_rows == 0) return r;
  MK_CHECK(!words.empty() && words.size() % n_rows == 0, "{} words for {} rows", words.size(), n_rows);
  const size_t w = words.size() / n_rows;
  for (size_t i = 0; i < n_rows; ++i) r.push_back(decode(words.subspan(i * w, w)));
  return r;
}
}  // namespace

std::vector<GreedyRow> Backend::forward_greedy(const StepBatch& batch) {
  return decode_rows(forward_rows(batch, OutputKind::greedy), batch.logit_rows.size(), decode_greedy_row);
}

std::vector<TopKRow> Backend::forward_topk(const StepBatch& batch) {
  return decode_rows(forward_rows(batch, OutputKind::topk), batch.logit_rows.size(), decode_topk_row);
}

GreedyRow Backend::forward_greedy(std::span<const int32_t> tokens, int64_t n_past) {
  return decode_rows(last_row(tokens, n_past, OutputKind::greedy), 1, decode_greedy_row)[0];
}

TopKRow Backend::forward_topk(std::span<const int32_t> tokens, int64_t n_past) {
  return decode_rows(last_row(tokens, n_past, OutputKind::topk), 1, decode_topk_row)[0];
}

std::vector<GreedyRow> Backend::decode_greedy(int32_t token, int64_t n_past, int steps) {
  std::vector<GreedyRow> rows;
  for (int j = 0; j < steps; ++j) {
    const int32_t t[1] = {j == 0 ? token : rows.back().id};
    rows.push_back(forward_greedy(t, n_past + j));
    if (rows.back().n_nonfinite > 0) break;
  }
  return rows;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const Graph& graph, const ModelFile& model,
                                      const BackendOptions& options) {
  if (options.threads < 0) fail("threads: {} is negative (0 = all cores)", options.threads);
  // Each worker holds its own scratch (~280 KB and up): thousands of threads only exhaust memory.
  if (options.threads > 1024) fail("threads: {} is more than 1024", options.threads);
  if (!options.trace_path.empty()) check_trace_path(options.trace_path);
  for (const auto& b : kBackends)
    if (name == b.name) return b.make(graph, model, options);
  fail("unknown backend '{}'; available: {}", name, fmt::join(backend_names(), ", "));
}

}  // namespace mk
