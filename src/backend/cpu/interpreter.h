// The CPU megakernel: persistent worker threads interpret one Program.
//
// Each step (one ragged batch of n_tokens rows, backend/step_batch.h), the host writes the inputs, bumps the
// step epoch and wakes the workers; the calling thread is worker 0 and runs its share itself. A worker takes instructions from the dynamic queue (one
// global atomic claim index, epoch-relative: never reset) or walks its static list; before an
// instruction it spins (acquire) until each waited counter reaches epoch * count — after a short
// spin it sleeps on the counter (futex), so oversubscribed or busy machines do not starve the
// worker it waits for — and after it it increments its counter (release), waking sleepers. Counters only grow. The host waits for every worker to finish
// the step. A wait that does not complete within `wait_timeout_s` turns into an mk::Error naming
// the instruction, counter, value and target instead of a hang.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/step_batch.h"
#include "isa/program.h"
#include "model/model_file.h"

namespace mk::cpu {

struct TraceEvent {
  uint32_t instr = 0, step = 0;
  int64_t wait_ns = 0, start_ns = 0, end_ns = 0;  // since the interpreter started
};

class Interpreter {
 public:
  // Binds the program's weights to `model` (dtype and shape checked), validates the program and
  // starts program.workers - 1 threads (the caller of step() is worker 0). Throws mk::Error on a mismatch or an invalid program.
  // act_quant: matmuls over quantized weights whose type has an 8-bit activation block (all eleven)
  // quantize the activation rows as llama.cpp does (kernels.h WeightRef::act_q8), and GELU (tanh form)
  // goes through llama.cpp's f16 table (StepMemory::gelu_f16).
  // kv_f16: K/V/query/probabilities rounded to f16 as llama.cpp's f16 KV cache (StepMemory::kv_f16).
  Interpreter(Program program, const ModelFile& model, bool trace = false, bool act_quant = false, bool kv_f16 = false);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // One step: a checked ragged batch (prepare_step with limits()). Throws mk::Error for a token id
  // outside the embedding table or a failure of an instruction (wait timeout).
  void step(const StepInputs& in);
  // The one-sequence case: tokens.size() <= max_tokens tokens at positions n_past.., block table
  // 0, 1, 2, ..., the last row's logits (every row's for an all-rows output).
  void step(std::span<const int32_t> tokens, int64_t n_past);
  // Rows per step, context, KV geometry of the program.
  StepLimits limits() const;
  // The named graph output after the last step: rows x cols floats, row-major.
  std::span<const float> output(const std::string& name, int64_t* rows = nullptr, int64_t* cols = nullptr) const;
  void reset_kv();
  // Whether the following steps compute the `topk` output (default true); the cpu backend turns it
  // off for steps whose caller reads only logits or greedy ids (StepMemory::want_topk).
  void set_want_topk(bool want) { want_topk_ = want; }

  const Program& program() const { return p_; }
  uint64_t steps() const { return epoch_; }
  // Trace events per worker (empty unless tracing) and per-step wall times.
  const std::vector<std::vector<TraceEvent>>& trace() const { return trace_; }
  const std::vector<std::pair<int64_t, int64_t>>& step_times() const { return step_times_; }
  double wait_timeout_s = 60.0;

 private:
  // A counter and how many workers sleep on it (so signalling skips the wake-up syscall when
  // nobody does).
  struct alignas(64) Counter {
    std::atomic<uint32_t> value{0};
    std::atomic<uint32_t> sleepers{0};
  };
  void signal(Counter& c);
  void worker_main(int w);
  template <class Done>
  void await(std::atomic<uint32_t>& a, Done done);
  void run_step(int w, uint32_t epoch);
  bool wait_for(int w, const Instr& in, uint32_t epoch);
  int64_t now_ns() const;

  Program p_;
  std::vector<WeightRef> weights_;
  std::vector<int32_t> act_key_;  // StepMemory::act_key (act_cache_keys)
  std::vector<int32_t> act_slot_;  // StepMemory::act_slot (act_shared_slots)
  std::unique_ptr<ActShared[]> act_shared_;
  std::vector<std::unique_ptr<std::vector<float>>> converted_;  // unaligned f32 copies
  uint8_t* packed_ = nullptr;  // every WeightRef::packed matrix, one allocation
  uint8_t* arena_ = nullptr;
  uint8_t* kv_ = nullptr;
  size_t kv_alloc_bytes_ = 0;  // kv_bytes, or half of it for an f16 cache
  mutable KvWritten written_;  // pool rows written so far; limits() hands it to prepare_step
  std::vector<float*> scratch_;  // per worker: scratch_floats, then act_cache_floats (kernels.h)
  size_t scratch_floats_ = 0;
  std::unique_ptr<Counter[]> counters_;
  std::vector<uint32_t> wait_target_;  // count per wait, flattened
  SymValues sym_;
  uint32_t epoch_ = 0;

  alignas(64) std::atomic<uint64_t> queue_head_{0};
  alignas(64) std::atomic<uint32_t> start_{0};
  alignas(64) std::atomic<uint32_t> done_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::mutex error_mu_;
  std::string error_;
  std::vector<std::thread> threads_;

  bool tracing_ = false;
  bool kv_f16_ = false;
  bool gelu_f16_ = false;
  bool want_topk_ = true;
  std::vector<std::vector<TraceEvent>> trace_;
  std::vector<std::pair<int64_t, int64_t>> step_times_;
  int64_t t0_ = 0;
};

// Writes a Chrome/Perfetto JSON trace (one track per worker, one slice per instruction with
// opcode/op/layer/tile args, waits as their own slices) and returns the summary text: busy / wait
// / idle share per worker and time per opcode.
std::string write_trace(const Interpreter& interp, const std::string& path);
std::string trace_summary(const Interpreter& interp);

// The same writer and summary for any backend's events: `tracks[t]` are the events of track t
// (a CPU worker, a GPU SM), times in ns from a common origin; `step_times` the steps' [begin, end).
// `process` names the process ("megakernel cpu"), `track_label` the tracks ("worker", "SM").
struct TraceData {
  const Program* program = nullptr;
  const std::vector<std::vector<TraceEvent>>* tracks = nullptr;
  const std::vector<std::pair<int64_t, int64_t>>* step_times = nullptr;
  std::string process = "megakernel cpu", track_label = "worker";
};
std::string write_trace(const TraceData& data, const std::string& path);
std::string trace_summary(const TraceData& data);

}  // namespace mk::cpu
