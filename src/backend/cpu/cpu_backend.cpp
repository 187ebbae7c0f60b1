// The "cpu" backend: compiles the graph once (passes/default_pipeline) for the requested worker
// count and schedule, then runs every step on the persistent-thread interpreter.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/interpreter.h"
#include "passes/pass.h"
#include "quant/quant.h"
#include "support/error.h"

namespace mk {

namespace {

// Weights whose matmuls take 8-bit activations (a block-quantized type with q->act), in any file form.
bool any_act_weights(const ModelFile& m) {
  for (const WeightTensor& t : m.tensors())
    if (const quant::QuantType* q = quant::quant_type(t.dtype); q && q->act) return true;
  return false;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Graph& g, const ModelFile& m, const BackendOptions& o) : trace_path_(o.trace_path) {
    CompileOptions co;
    co.workers = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    co.schedule = schedule_from_name(o.schedule.empty() ? "dynamic" : o.schedule);
    // One attention op by default: on a CPU the groups x heads already cover the cores of a step,
    // and the unsplit op keeps llama.cpp's f16-KV softmax numerics (kernels.h).
    co.attn_splits = o.attn_splits < 0 ? 1 : o.attn_splits;
    co.attn_row_parts = o.attn_row_parts;
    co.head_tiles = o.head_tiles;
    int64_t n_ctx = 0;
    for (const Node& n : g.nodes)
      if (n.op == Op::kv_cache) n_ctx = kv_geometry(n).n_ctx;
    co.max_tokens = n_ctx > 0 ? std::min<int64_t>(co.max_tokens, n_ctx) : co.max_tokens;
    const bool llama_like = cpu_llama_cpp_numerics(m);
    bool act_quant = llama_like, kv_f16 = llama_like;
    const bool has_gelu = std::any_of(g.nodes.begin(), g.nodes.end(), [](const Node& n) { return n.op == Op::gelu || n.op == Op::gelu_tanh; });
    if (o.act_quant == "on" && !any_act_weights(m) && !has_gelu)  // (with GELU: llama.cpp's f16 GELU table)
      std::fprintf(stderr, "note: --act-quant on: the model has no block-quantized weights, and matmuls over float "
                           "weights keep float32 activations (as llama.cpp's): it changes nothing here\n");
    if (o.act_quant == "on") act_quant = true;
    else if (o.act_quant == "off") act_quant = false;
    else if (o.act_quant != "auto") fail("--act-quant: expected auto, on or off, got '{}'", o.act_quant);
    if (o.kv_type == "f16") kv_f16 = true;
    else if (o.kv_type == "f32") kv_f16 = false;
    else if (o.kv_type != "auto") fail("--kv-type: expected auto, f16 or f32, got '{}'", o.kv_type);
    interp_ = std::make_unique<cpu::Interpreter>(compile_program(g, co), m, !trace_path_.empty(), act_quant, kv_f16);
    for (const auto& [name, b] : interp_->program().outputs)
      if (is_main_output(name)) {
        main_output_ = name;
        per_token_ = interp_->program().buffers[static_cast<size_t>(b)].rows == SymExpr::tokens();
      }
  }

  std::string name() const override { return "cpu"; }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_past) override {
    if (tokens.empty()) fail("forward: no tokens");
    const int64_t max = interp_->program().max_tokens;
    std::vector<float> all;
    for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(max)) {
      auto chunk = tokens.subspan(at, std::min(tokens.size() - at, static_cast<size_t>(max)));
      interp_->set_want_topk(false);
      interp_->step(chunk, n_past + static_cast<int64_t>(at));
      auto out = interp_->output(main_output_);
      if (!per_token_) all.clear();
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  }

  std::vector<float> forward(const StepBatch& batch) override {
    StepInputs in = prepare_step(batch, interp_->limits());
    interp_->set_want_topk(false);
    interp_->step(in);
    int64_t rows = 0, cols = 0;
    auto out = interp_->output(main_output_, &rows, &cols);
    return select_logit_rows(out, rows, cols, batch, in);
  }
  std::vector<int32_t> forward_rows(const StepBatch& batch, OutputKind kind) override {
    bool has = false;  // a graph without the argmax / topk op: compute the rows from the logits here
    for (const auto& [name, b] : interp_->program().outputs) has |= name == output_name(kind);
    if (!has) return Backend::forward_rows(batch, kind);
    StepInputs in = prepare_step(batch, interp_->limits());
    interp_->set_want_topk(kind == OutputKind::topk);
    interp_->step(in);
    int64_t rows = 0, cols = 0;
    auto out = interp_->output(output_name(kind), &rows, &cols);  // i32 [rows, 4] (argmax) or [rows, 4 + 2k] (topk)
    return select_logit_rows(std::span<const int32_t>(reinterpret_cast<const int32_t*>(out.data()), out.size()), rows, cols,
                             batch, in);
  }
  int64_t kv_block_size() const override { return interp_->program().kv_block_size; }
  int64_t kv_pool_blocks() const override { return interp_->limits().pool_blocks; }
  int64_t max_batch_rows() const override { return interp_->program().max_tokens; }

  void reset() override { interp_->reset_kv(); }

  void finish() override {
    if (trace_path_.empty() || finished_) return;
    finished_ = true;
    std::string summary = cpu::write_trace(*interp_, trace_path_);
    std::fprintf(stderr, "wrote %s\n%s", trace_path_.c_str(), summary.c_str());
  }

  ~CpuBackend() override {
    try {  // the callers call finish() first; here only what they did not write yet
      finish();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
    }
  }

 private:
  std::string trace_path_;
  bool finished_ = false;
  std::string main_output_ = "logits";  // is_main_output: "logits", or "embd" in an embedding graph
  bool per_token_ = false;              // it has a row for every position (all_logits, embd) or only the last one
  std::unique_ptr<cpu::Interpreter> interp_;
};

}  // namespace

bool cpu_llama_cpp_numerics(const ModelFile& m) { return m.format == "gguf" && any_act_weights(m); }

std::unique_ptr<Backend> make_cpu_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return std::make_unique<CpuBackend>(g, m, o);
}

}  // namespace mk
