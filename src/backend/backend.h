// A backend executes one model Graph step by step, keeping the KV cache between steps.
//
// forward() runs the tokens at positions n_past .. n_past+n_tokens-1 and returns the graph output
// named "logits" as float32, row-major [rows, n_vocab] (rows = 1 when the graph keeps only the last
// position, n_tokens when built with all_logits). Errors (context overflow, device failures) throw
// mk::Error.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/step_batch.h"
#include "ir/graph.h"
#include "model/model_file.h"

namespace mk {

struct BackendOptions {
  int threads = 0;                    // CPU workers; 0 = hardware concurrency
  std::string schedule = "dynamic";   // dynamic | static-rr | static-cp
  std::string trace_path;             // write a Chrome/Perfetto trace here when set
  // cpu: matmuls over q4_0/q4_1/q5_0/q5_1/q8_0 weights quantize the activations to 8-bit blocks
  // (q8_0/q8_1) and dot them as integers, as llama.cpp's CPU backend does: "on", "off", or "auto"
  // (on for models in GGUF form with weights of a block type (q4_0 ... q8_0, q2_K ... q6_K): GGUF files
  // and synthetic models, synth:<name>:q4_1 and the like; so that greedy decoding follows llama.cpp's
  // token for token).
  std::string act_quant = "auto";
  // cpu: KV cache precision: "f16" (llama.cpp's default: K, V, the query and the attention
  // probabilities rounded to f16), "f32", or "auto" (f16 where act_quant's auto is on).
  std::string kv_type = "auto";
  // Flash-decoding splits of attention (CompileOptions::attn_splits): -1 = the backend's default
  // (cpu: 1, one attention op, llama.cpp-like numerics; cuda, cuda-perop, cuda-graph, cuda-emu: 0 =
  // auto, ceil(blocks / n_head_kv) so that the attention tiles cover the SMs), 0 = auto, S >= 1.
  int attn_splits = -1;
  // Row parts of attention tiles (CompileOptions::attn_row_parts): 0 = auto (the default), P >= 1.
  // Any value gives the same bits.
  int attn_row_parts = 0;
  // Matmuls feeding RoPE or attention tiled in whole heads (CompileOptions::head_tiles; the CUDA
  // backends also read MK_CUDA_HEAD_TILES). Any value gives the same bits.
  bool head_tiles = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_past) = 0;
  // Runs one ragged batch on the paged KV pool (backend/step_batch.h); returns
  // [batch.logit_rows.size(), n_vocab] float32. Throws mk::Error for a malformed batch (rows of a
  // sequence not consecutive, a position past the sequence's blocks, a block outside the pool, more
  // rows than max_batch_rows()) and where the backend has no paged KV (the default).
  virtual std::vector<float> forward(const StepBatch& batch);
  // Each logit row's `kind` row instead of its logits (OutputKind, backend/step_batch.h): i32
  // [batch.logit_rows.size(), output_row_words(kind, k)], in batch.logit_rows order. Backends read the
  // program's output of that name (the argmax or topk op), so a GPU copies 16 or 16 + 8 * kTopK bytes
  // per row instead of 4 * n_vocab; the default computes the rows (k = kTopK) from forward(batch)'s
  // logits on the host. Same errors as forward(batch). The runtime calls the typed forms below.
  virtual std::vector<int32_t> forward_rows(const StepBatch& batch, OutputKind kind);
  // Greedy decoding without copying logits: each logit row's GreedyRow (the token id, ties to the
  // lowest id, and the row's non-finite count).
  std::vector<GreedyRow> forward_greedy(const StepBatch& batch);
  // Sampling without copying logits: each logit row's kTopK (ir/topk.h) best candidates (TopKRow: ids
  // and logits in the sampler's order, and the non-finite count): enough for Sampler::sample_top with
  // top_k in [1, kTopK].
  std::vector<TopKRow> forward_topk(const StepBatch& batch);
  // The one-sequence cases: the last token's row, as forward(tokens, n_past) would give it (prompts
  // longer than max_batch_rows() run in chunks through forward_rows).
  GreedyRow forward_greedy(std::span<const int32_t> tokens, int64_t n_past);
  TopKRow forward_topk(std::span<const int32_t> tokens, int64_t n_past);
  // Greedy decoding of one sequence `steps` (>= 1) tokens ahead: step j runs the token that step
  // j - 1 chose (step 0: `token`) at position n_past + j; returns each step's GreedyRow. Steps after
  // a row with non-finite logits are not run (the rows stop there). The CUDA megakernel issues all
  // the steps before it waits (each chosen id goes to the next step's input on the device), so the
  // host's round trip per token goes; the default runs forward_greedy step by step. Positions past
  // those the caller keeps are cache rows a later step overwrites before it reads them.
  virtual std::vector<GreedyRow> decode_greedy(int32_t token, int64_t n_past, int steps);
  // How many steps one decode_greedy call should carry (1: the backend gains nothing from more).
  virtual int decode_steps() const { return 1; }
  // Paged KV geometry: rows per block and blocks in the pool (0 = the backend has no paged KV).
  virtual int64_t kv_block_size() const { return 0; }
  virtual int64_t kv_pool_blocks() const { return 0; }
  // Most rows one forward(StepBatch) may carry.
  virtual int64_t max_batch_rows() const { return 0; }
  // Forgets the KV cache contents (the next forward must start at n_past = 0).
  virtual void reset() {}
  // True after a device error (CUDA backends): every step fails until reset().
  virtual bool stopped() const { return false; }
  // Called once after the last step (writes traces, prints summaries).
  virtual void finish() {}

 private:
  // forward_rows over one sequence in chunks of max_batch_rows(): the last chunk's last row.
  std::vector<int32_t> last_row(std::span<const int32_t> tokens, int64_t n_past, OutputKind kind);
};

// Names: "reference", "cpu", "cuda", "cuda-perop", "cuda-graph", "cuda-emu". Throws mk::Error listing the
// available backends for an unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name, const Graph& graph, const ModelFile& model,
                                      const BackendOptions& options);
std::vector<std::string> backend_names();
std::string default_backend_name();

// Registration: each backend file defines a factory and registers it in registry.cpp.
using BackendFactory = std::unique_ptr<Backend> (*)(const Graph&, const ModelFile&, const BackendOptions&);
std::unique_ptr<Backend> make_reference_backend(const Graph&, const ModelFile&, const BackendOptions&);
// The CPU megakernel interpreter (backend/cpu/): compiles the graph once, runs every step.
std::unique_ptr<Backend> make_cpu_backend(const Graph&, const ModelFile&, const BackendOptions&);
// The cpu backend's `auto` for --act-quant and --kv-type: llama.cpp's numerics (8-bit activation
// blocks, an f16 KV cache) for a GGUF file whose weights include a block-quantized type that takes
// 8-bit activations; float32 otherwise. Reads tensor types only (a shapes-only model will do).
bool cpu_llama_cpp_numerics(const ModelFile& model);
// backend/cuda/cuda_backend.cpp: the megakernel and its two baselines. Throw "no CUDA driver: ..."
// where the driver or a GPU is missing.
std::unique_ptr<Backend> make_cuda_backend(const Graph&, const ModelFile&, const BackendOptions&);
std::unique_ptr<Backend> make_cuda_perop_backend(const Graph&, const ModelFile&, const BackendOptions&);
std::unique_ptr<Backend> make_cuda_graph_backend(const Graph&, const ModelFile&, const BackendOptions&);
// cuda-emu: the megakernel's exact CUDA source compiled for the host and run on emulated blocks
// (threads = -t, default 4) and threads (fibers), with a race check (backend/cuda/device/emu_host.h).
std::unique_ptr<Backend> make_cuda_emu_backend(const Graph&, const ModelFile&, const BackendOptions&);

}  // namespace mk
