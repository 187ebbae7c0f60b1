// The CUDA backends: "cuda" (the persistent megakernel), the baselines it must beat with the same
// device functions: "cuda-perop" (one launch per op on a stream) and "cuda-graph" (that launch
// sequence captured once into a CUDA graph and replayed each step), and "cuda-emu" (the megakernel's
// exact source compiled for the host and run on emulated blocks and threads, with a race check; see
// device/emu_host.h). All four run this file's host code; only the DeviceRuntime differs (the driver,
// or the emulator), so a step on cuda-emu is a step on cuda up to the launch.
//
// Setup: compile the Program for one block per SM (workers = SM count; cuda-emu: its block count),
// generate the source, compile it for the device (NVRTC, or the host compiler; disk-cached), upload
// weights (ggml blocks raw, rows padded to 16 bytes), allocate the arena, KV storage, counters and tables. A step: copy
// tokens/positions/symbols from pinned staging, launch, copy the logits back (greedy decoding: the
// argmax op's 16 bytes per row instead; top-k sampling: the topk op's 16 + 8k), synchronise, then read
// the host-mapped error record (a counter wait that timed out, a bad token id, on cuda-emu a race)
// and turn it into an mk::Error. After a device error the backend refuses further steps until reset().
//
// Without a driver or GPU the constructor of cuda/cuda-perop/cuda-graph throws "no CUDA driver: <reason>".
//
// Tracing (--trace FILE, megakernel only): the source is generated with MK_TRACE, every block
// records (instruction, SM, wait start, start, end) in %globaltimer ns; after each step the records
// are copied back, and finish() writes the same Chrome/Perfetto trace as the CPU backend (one track
// per SM) with its summary.
//
// Environment (development and benchmarks): MK_CUDA_DEVICE (ordinal), MK_CUDA_WORKERS (blocks,
// default the SM count), MK_CUDA_MAX_TOKENS (tokens per step, default 256), MK_CUDA_WAIT_TIMEOUT_MS
// (watchdog bound per wait, default 10000), MK_CUDA_VERBOSE=1 (compile times on stderr),
// MK_CUDA_TILE_BYTES / MK_CUDA_TILES_PER_WORKER / MK_CUDA_HEAD_TILES (the tile pass's matmul tiles:
// CompileOptions),
// MK_CUDA_PRELOAD=0 / MK_CUDA_CLAIM_AHEAD=1 / MK_CUDA_EVICT_FIRST=1 (codegen variants:
// CudaCodegenOptions),
// MK_DEBUG_BREAK_WAIT=1 (makes one wait unsatisfiable: the watchdog check in bench/device_check.sh);
// cuda-emu: MK_EMU_BLOCKS / -t (grid), MK_EMU_THREADS (threads per block, default 128),
// MK_EMU_RACE_CHECK=0, MK_EMU_CXX (host compiler).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/interpreter.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/device_runtime.h"
#include "passes/pass.h"
#include "quant/quant.h"
#include "support/env.h"
#include "support/error.h"

namespace mk {

namespace {

enum class CudaMode { megakernel, perop, graph };


// Bytes a weight tensor takes on the device (quantized matrices: rows cuda::device_row_bytes apart).
size_t device_bytes(const WeightTensor& t) {
  if (!quant::quant_type(t.dtype) || t.shape.empty()) return t.nbytes;
  const int64_t k = t.shape.back();
  return static_cast<size_t>(t.numel() / k * cuda::device_row_bytes(t.dtype, k));
}

// Dynamic shared memory a block of the generated kernels may use (1 KB below the opt-in limit).
int64_t device_smem_budget(const cuda::DeviceInfo& dev) { return std::max(48 * 1024, dev.smem_optin - 1024); }

// Compiles the graph into the Program the device runs (one worker per SM or emulated block).
Program compile_for_device(const Graph& graph, int workers, const cuda::DeviceInfo& dev, const BackendOptions& options) {
  // The device computes with float32 activations and a float32 KV cache; llama.cpp's numerics
  // (8-bit activation blocks, f16 KV) exist on the cpu backend only. "auto" means float here.
  if (options.act_quant == "on") usage_fail("--act-quant on: the CUDA backends keep activations in float32 (cpu only)");
  if (options.kv_type == "f16") usage_fail("--kv-type f16: the CUDA backends keep the KV cache in float32 (cpu only)");
  CompileOptions co;
  co.workers = workers;
  co.max_tokens = env_int("MK_CUDA_MAX_TOKENS", 256, 1, int64_t{1} << 24);
  for (const Node& n : graph.nodes)  // as the cpu backend: no step is longer than the context
    if (n.op == Op::kv_cache) co.max_tokens = std::min<int64_t>(co.max_tokens, kv_geometry(n).n_ctx);
  co.schedule = schedule_from_name(options.schedule);
  co.attn_splits = options.attn_splits < 0 ? 0 : options.attn_splits;  // auto: attention tiles cover the SMs
  co.attn_row_parts = options.attn_row_parts;
  co.head_tiles = options.head_tiles;
  co.rms_partials = env_flag("MK_CUDA_RMS_PARTIALS", true);  // RMS statistic once per op (docs/cuda.md)
  cuda::apply_env(co);
  cuda::apply_device_limits(co, device_smem_budget(dev), dev.threads);
  return compile_program(graph, co);
}

// Greedy decode steps one decode_greedy call issues before it waits (MK_CUDA_DECODE_STEPS): the
// default, and the most (staging slots).
constexpr int kDefaultDecodeSteps = 8, kMaxDecodeSteps = 16;

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::unique_ptr<cuda::DeviceRuntime> rt, Program program, const ModelFile& model, const BackendOptions& options,
              CudaMode mode, std::string name)
      : rt_(std::move(rt)), mode_(mode), name_(std::move(name)), trace_path_(options.trace_path), program_(std::move(program)) {
    if (!trace_path_.empty() && mode != CudaMode::megakernel)
      fail("--trace: the {} backend has no trace; use --backend cuda (the megakernel)", name_);
    const cuda::DeviceInfo& dev = rt_->info();
    const auto t_compile = std::chrono::steady_clock::now();
    if (env_flag("MK_DEBUG_BREAK_WAIT", false) && mode_ == CudaMode::megakernel) {
      const int i = cuda::break_one_wait(program_);
      std::fprintf(stderr, "MK_DEBUG_BREAK_WAIT: instruction %d now waits for a signal that never comes\n", i);
    }
    const Program& p = program_;

    // Weights: their file dtype (ggml blocks stay raw; each row of a quantized matrix starts at a
    // multiple of 16 bytes, cuda::device_row_bytes), 256-byte aligned in one allocation with 256
    // bytes of slack at the end (a matmul lane's last 16-byte window may reach past its row).
    cuda::CudaCodegenOptions cg;
    cg.threads = dev.threads;
    cg.max_smem_bytes = device_smem_budget(dev);
    cg.trace = !trace_path_.empty();
    cg.perop_kernels = mode_ != CudaMode::megakernel;
    cuda::apply_env(cg);
    std::vector<size_t> woff;
    size_t wbytes = 0;
    for (const ProgramWeight& pw : p.weights) {
      const WeightTensor& t = model.get(pw.name, pw.shape);
      if (t.dtype != pw.dtype) fail("{}: program expects {}, file has {}", pw.name, dtype_name(pw.dtype), dtype_name(t.dtype));
      if (t.dtype == DType::I32) fail("{}: the CUDA backend cannot read {} weights", pw.name, dtype_name(t.dtype));
      cg.weight_dtypes.push_back(t.dtype);
      woff.push_back(wbytes);
      wbytes += (device_bytes(t) + 255) / 256 * 256;
    }
    wbytes += 256;
    src_ = cuda::generate_cuda(p, cg);
    tables_ = cuda::build_device_tables(p, src_);
    const cuda::ModuleInfo built = rt_->load(src_, p);
    if (env_flag("MK_CUDA_VERBOSE", false)) {  // bench/device_check.sh reads this line
      const double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_compile).count();
      std::fprintf(stderr, "%s compile: %zu instructions, %d functions, %zu KB source, %s %.0f ms (%s), total %.0f ms\n",
                   name_.c_str(), p.instrs.size(), src_.n_functions, src_.code.size() / 1024, built.what.c_str(), built.compile_ms,
                   built.from_cache ? "cache hit" : "cache miss", total);
    }
    grid_ = p.workers;
    if (mode_ == CudaMode::megakernel) {
      const int resident = rt_->max_resident_blocks(src_.kernel_name, src_.threads, src_.smem_bytes);
      if (resident < grid_)
        fail("{}: {} blocks of {} threads with {} bytes of shared memory cannot all be resident ({} fit on {})", name_, grid_,
             src_.threads, src_.smem_bytes, resident, dev.name);
    }
    if (p.schedule != ScheduleKind::dynamic && static_cast<int>(p.lists.size()) != grid_)
      fail("{}: static schedule has {} lists for {} blocks", name_, p.lists.size(), grid_);

    // Memory.
    weights_ = rt_->alloc(wbytes);
    for (size_t i = 0; i < p.weights.size(); ++i) {
      const WeightTensor& t = model.get(p.weights[i].name);
      if (quant::quant_type(t.dtype) && device_bytes(t) != t.nbytes) {  // rows padded to 16 bytes
        const int64_t k = t.shape.back(), rows = t.numel() / k;
        const size_t src_row = dtype_bytes(t.dtype, k), dst_row = static_cast<size_t>(cuda::device_row_bytes(t.dtype, k));
        std::vector<uint8_t> padded(static_cast<size_t>(rows) * dst_row, 0);
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(padded.data() + static_cast<size_t>(r) * dst_row, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r) * src_row,
                      src_row);
        rt_->copy_to_device(weights_ + woff[i], padded.data(), padded.size(), false);
      } else {
        rt_->copy_to_device(weights_ + woff[i], t.data, t.nbytes, false);
      }
    }
    arena_bytes_ = std::max<size_t>(static_cast<size_t>(p.arena_bytes), 4);
    kv_bytes_ = std::max<size_t>(static_cast<size_t>(p.kv_bytes), 4);
    arena_ = rt_->alloc(arena_bytes_);
    kv_ = rt_->alloc(kv_bytes_);
    rt_->set_regions(arena_, arena_bytes_, kv_, kv_bytes_);
    counters_bytes_ = std::max<size_t>(p.counters.size(), 1) * 4;
    counters_ = rt_->alloc(counters_bytes_);
    queue_ = rt_->alloc(8);
    abort_ = rt_->alloc(4);
    sym_dev_ = rt_->alloc(sizeof(cuda::MkSym));
    if (cg.trace) {
      trace_header_ = (static_cast<size_t>(grid_) * 4 + 255) / 256 * 256;
      trace_ = rt_->alloc(trace_header_ + static_cast<size_t>(grid_) * p.instrs.size() * sizeof(cuda::MkTraceRec));
      trace_tracks_.assign(static_cast<size_t>(dev.sms), {});
    }
    instrs_ = upload(tables_.instrs);
    waits_ = upload(tables_.waits);
    list_offsets_ = upload(tables_.list_offsets);
    list_items_ = upload(tables_.list_items);
    op_instrs_ = upload(tables_.op_instrs);
    std::vector<cuda::MkOpArgs> args(p.ops.size());
    auto buf = [&](int b) -> uint64_t {
      if (b < 0) return 0;
      const Buffer& B = p.buffers[static_cast<size_t>(b)];
      return (B.kind == BufferKind::kv ? kv_ : arena_) + static_cast<uint64_t>(B.offset);
    };
    auto wt = [&](int w) -> uint64_t { return w < 0 ? 0 : weights_ + woff[static_cast<size_t>(w)]; };
    for (size_t i = 0; i < p.ops.size(); ++i) {
      const OpDesc& o = p.ops[i];
      cuda::MkOpArgs& a = args[i];
      a.out = buf(o.out);
      a.x = buf(o.x);
      a.y = buf(o.y);
      a.z = buf(o.z);
      a.res = buf(o.res);
      a.pos = buf(o.pos);
      a.ids = buf(o.ids);
      a.w = wt(o.w);
      a.w_up = wt(o.w_up);
      a.norm_w = wt(o.norm_w);
      a.bias = wt(o.bias);
      a.ss = buf(o.ss);
      a.ss_out = buf(o.ss_out);
      // Step inputs of a ragged batch (abi.cuh: which slot carries which).
      const bool store = o.opcode == Opcode::kv_store ||
                         (o.opcode == Opcode::matmul && (o.epi == Epi::store || o.epi == Epi::rope_store));
      if (store) a.ids = buf(p.kv_slot_buffer);
      if (o.opcode == Opcode::attention || o.opcode == Opcode::attention_partial) {
        a.pos = buf(p.positions_buffer);
        a.ids = buf(p.row_seq_buffer);
        a.tab = buf(p.block_table_buffer);
      }
      if (o.opcode == Opcode::last_row) a.ids = buf(p.logit_rows_buffer);
    }
    ops_ = upload(args);

    // Host-mapped error record; pinned staging for inputs, symbols and logits.
    error_host_ = static_cast<volatile cuda::MkError*>(rt_->host_alloc(sizeof(cuda::MkError), &error_dev_));
    if (p.tokens_buffer < 0) fail("{}: the program has no token input", name_);
    in_lo_ = static_cast<size_t>(p.buffers[static_cast<size_t>(p.tokens_buffer)].offset);
    in_hi_ = in_lo_;
    for (const Buffer& B : p.buffers)  // every step input (memplan pins them together at the arena's start)
      if (B.kind == BufferKind::input) {
        in_lo_ = std::min(in_lo_, static_cast<size_t>(B.offset));
        in_hi_ = std::max(in_hi_, static_cast<size_t>(B.offset + B.bytes()));
      }
    // One staging slot per step in flight (decode_greedy issues up to kMaxDecodeSteps before it
    // waits; a slot's async copies read it until then).
    decode_steps_ = mode_ == CudaMode::graph || !trace_path_.empty()
                        ? 1
                        : static_cast<int>(env_int("MK_CUDA_DECODE_STEPS", kDefaultDecodeSteps, 1, kMaxDecodeSteps));
    stage_bytes_ = (in_hi_ - in_lo_ + sizeof(cuda::MkSym) + 63) / 64 * 64;
    in_host_ = rt_->host_alloc(stage_bytes_ * static_cast<size_t>(decode_steps_), nullptr);
    steps_host_ = static_cast<int32_t*>(rt_->host_alloc(static_cast<size_t>(kMaxDecodeSteps) * 4 * sizeof(int32_t), nullptr));
    out_buffer_ = -1;
    for (const auto& [oname, b] : p.outputs)
      if (is_main_output(oname)) out_buffer_ = b;
    if (out_buffer_ < 0) fail("{}: the program has no output named logits or embd", name_);
    const Buffer& ob = p.buffers[static_cast<size_t>(out_buffer_)];
    out_host_ = rt_->host_alloc(static_cast<size_t>(ob.max_rows * ob.cols) * 4, nullptr);
    for (OutputKind kind : {OutputKind::greedy, OutputKind::topk}) {  // what greedy decoding / top-k sampling copies back
      int& buffer = rows_buffer_[static_cast<size_t>(kind)];
      for (const auto& [oname, b] : p.outputs)
        if (oname == output_name(kind)) buffer = b;
      if (buffer < 0) continue;
      const Buffer& B = p.buffers[static_cast<size_t>(buffer)];
      rows_host_[static_cast<size_t>(kind)] = rt_->host_alloc(static_cast<size_t>(B.max_rows * B.cols) * 4, nullptr);
    }
    timeout_ns_ = static_cast<uint64_t>(env_int("MK_CUDA_WAIT_TIMEOUT_MS", 10000, 1, int64_t{1} << 40)) * 1000000ull;
    n_ctx_ = p.n_ctx;
    limits_.max_rows = p.max_tokens;
    limits_.n_ctx = p.n_ctx;
    limits_.block_size = p.kv_block_size;
    limits_.pool_blocks = p.kv_block_size > 0 ? p.kv_pool_rows / p.kv_block_size : 0;
    limits_.max_blocks_per_seq = p.max_blocks_per_seq();
    limits_.written = &written_;
  }

  std::string name() const override { return name_; }

  bool stopped() const override { return !broken_.empty(); }
  void reset() override {
    rt_->synchronize();
    rt_->memset0(kv_, kv_bytes_);
    rt_->memset0(arena_, arena_bytes_);
    rt_->memset0(counters_, counters_bytes_);
    rt_->memset0(queue_, 8);
    rt_->memset0(abort_, 4);
    rt_->synchronize();
    std::memset(const_cast<cuda::MkError*>(error_host_), 0, sizeof(cuda::MkError));
    epoch_ = 0;
    broken_.clear();
    written_.clear();
  }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_past) override {
    if (!broken_.empty()) fail("{}: the backend stopped after a device error ({}); reset() first", name_, broken_);
    if (tokens.empty()) fail("forward: no tokens");
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n_ctx_ > 0 && n_past + n > n_ctx_)
      fail("context overflow: {} tokens in the cache + {} new > context length {}", n_past, n, n_ctx_);
    std::vector<float> all;
    std::vector<float> last;
    const Buffer& ob = program_.buffers[static_cast<size_t>(out_buffer_)];
    const bool all_rows = ob.rows == SymExpr::tokens();  // all_logits programs return one row per token
    // Steps of at most max_tokens tokens: the KV cache carries the earlier chunks.
    for (int64_t off = 0; off < n; off += program_.max_tokens) {
      const int64_t m = std::min<int64_t>(program_.max_tokens, n - off);
      last = step(one_sequence_step(tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(m)), n_past + off, limits_,
                                    all_rows));
      all.insert(all.end(), last.begin(), last.end());
    }
    return all_rows ? all : last;
  }

  std::vector<float> forward(const StepBatch& batch) override {
    if (!broken_.empty()) fail("{}: the backend stopped after a device error ({}); reset() first", name_, broken_);
    StepInputs in = prepare_step(batch, limits_);
    std::vector<float> out = step(in);
    const int64_t cols = program_.buffers[static_cast<size_t>(out_buffer_)].cols;
    return select_logit_rows(out, static_cast<int64_t>(out.size()) / cols, cols, batch, in);
  }
  // Copies the argmax op's 16 bytes or the topk op's 16 + 8k bytes per row instead of the logits.
  std::vector<int32_t> forward_rows(const StepBatch& batch, OutputKind kind) override {
    const int buffer = rows_buffer_[static_cast<size_t>(kind)];
    if (buffer < 0) return Backend::forward_rows(batch, kind);
    if (!broken_.empty()) fail("{}: the backend stopped after a device error ({}); reset() first", name_, broken_);
    StepInputs in = prepare_step(batch, limits_);
    void* host = rows_host_[static_cast<size_t>(kind)];
    const size_t words = run_step(in, buffer, host);
    const int64_t cols = program_.buffers[static_cast<size_t>(buffer)].cols;
    return select_logit_rows(std::span<const int32_t>(static_cast<const int32_t*>(host), words),
                             static_cast<int64_t>(words) / cols, cols, batch, in);
  }
  int decode_steps() const override { return decode_steps_; }
  // decode_steps_ steps at a time (decode_chunk): one wait per chunk, not per token.
  std::vector<GreedyRow> decode_greedy(int32_t token, int64_t n_past, int steps) override {
    const int buffer = rows_buffer_[static_cast<size_t>(OutputKind::greedy)];
    if (steps <= 1 || decode_steps_ <= 1 || buffer < 0) return Backend::decode_greedy(token, n_past, steps);
    std::vector<GreedyRow> rows;
    while (static_cast<int>(rows.size()) < steps) {  // decode_steps_ at a time
      const int done = static_cast<int>(rows.size());
      const std::vector<GreedyRow> more =
          decode_chunk(buffer, done == 0 ? token : rows.back().id, n_past + done, std::min(steps - done, decode_steps_));
      rows.insert(rows.end(), more.begin(), more.end());
      if (rows.back().n_nonfinite > 0) break;
    }
    return rows;
  }
  int64_t kv_block_size() const override { return limits_.block_size; }
  int64_t kv_pool_blocks() const override { return limits_.pool_blocks; }
  int64_t max_batch_rows() const override { return limits_.max_rows; }

 private:
  // decode_greedy's steps [n_past, n_past + steps), steps <= decode_steps_: issued back to back,
  // each one's argmax row copied to its own pinned slot and its id copied on the device into the
  // next step's token input; one wait at the end.
  std::vector<GreedyRow> decode_chunk(int buffer, int32_t token, int64_t n_past, int steps) {
    if (!broken_.empty()) fail("{}: the backend stopped after a device error ({}); reset() first", name_, broken_);
    const Program& p = program_;
    const uint64_t chosen = arena_ + static_cast<uint64_t>(p.buffers[static_cast<size_t>(buffer)].offset);  // row 0, word 0
    const uint64_t next_in = arena_ + static_cast<uint64_t>(p.buffers[static_cast<size_t>(p.tokens_buffer)].offset);
    const uint32_t first_epoch = epoch_ + 1;
    for (int j = 0; j < steps; ++j) {
      const int32_t t[1] = {token};  // step 0's; the others' is replaced on the device
      const StepInputs in = prepare_step(one_sequence_batch(t, n_past + j, limits_.block_size, false), limits_);
      MK_CHECK(in.n_out() == 1, "decode step with {} output rows", in.n_out());
      issue_step(in, buffer, steps_host_ + 4 * j, j, j == 0 ? 0 : chosen, next_in);
    }
    const std::string error =
        finish_steps(first_epoch, fmt::format("steps at positions {}..{}", n_past, n_past + steps - 1));
    // A row with non-finite logits ends the rows (the session names it). When every logit was NaN
    // its id is -1, and the next step stopped on that token (error kind 2): that error is this row's
    // consequence, so the row is returned (the backend stays stopped until reset()).
    const bool nan_token = !error.empty() && error_host_->kind == 2 && error_host_->counter == -1;
    std::vector<GreedyRow> rows;
    if (error.empty() || nan_token)
      for (int j = 0; j < steps; ++j) {
        rows.push_back(decode_greedy_row(std::span<const int32_t>(steps_host_ + 4 * j, 4)));
        if (rows.back().n_nonfinite > 0) return rows;
      }
    if (!error.empty()) fail("{}", error);
    return rows;
  }

  template <class T>
  uint64_t upload(const std::vector<T>& v) {
    const uint64_t p = rt_->alloc(v.size() * sizeof(T));
    if (!v.empty()) rt_->copy_to_device(p, v.data(), v.size() * sizeof(T), false);
    return p;
  }

  cuda::MkParams params() const {
    cuda::MkParams prm{};
    prm.instrs = instrs_;
    prm.waits = waits_;
    prm.list_offsets = list_offsets_;
    prm.list_items = list_items_;
    prm.op_instrs = op_instrs_;
    prm.ops = ops_;
    prm.counters = counters_;
    prm.queue = queue_;
    prm.error = error_dev_;
    prm.abort_flag = abort_;
    prm.sym_dev = sym_dev_;
    prm.trace = trace_;
    prm.timeout_ns = timeout_ns_;
    return prm;
  }

  // Issues the per-op launches (on the stream or into a capture).
  void launch_perop(const cuda::MkParams& prm) {
    for (int32_t op : tables_.launch_order) {
      const int first = tables_.op_first[static_cast<size_t>(op)];
      const unsigned blocks = static_cast<unsigned>(tables_.op_count[static_cast<size_t>(op)]);
      rt_->launch(fmt::format("mk_perop_{}", src_.op_function[static_cast<size_t>(op)]), blocks, static_cast<unsigned>(src_.threads),
                  src_.smem_bytes, prm, first, false);
    }
  }

  std::vector<float> step(const StepInputs& si) {
    const float* o = static_cast<const float*>(out_host_);
    return std::vector<float>(o, o + run_step(si, out_buffer_, out_host_));
  }

  // One step; copies output buffer `out_buffer` (this step's rows) to pinned `out_host` and returns
  // its size in 32-bit words.
  size_t run_step(const StepInputs& si, int out_buffer, void* out_host) {
    const size_t words = issue_step(si, out_buffer, out_host, 0, 0, 0);
    const int64_t n_past = si.positions.empty() ? 0 : si.positions[0];  // for error messages
    if (const std::string error = finish_steps(epoch_, fmt::format("step at position {}", n_past)); !error.empty())
      fail("{}", error);
    return words;
  }

  // Issues one step (nothing waits): its inputs staged in staging slot `slot` and copied, the
  // launch(es), then the copy of output buffer `out_buffer` (this step's rows) to pinned `out_host`.
  // token_src != 0: 4 bytes at that device address then replace the first row's token (at
  // token_dst), after the inputs' copies. Returns the output's size in 32-bit words.
  size_t issue_step(const StepInputs& si, int out_buffer, void* out_host, int slot, uint64_t token_src, uint64_t token_dst) {
    const Program& p = program_;
    const int64_t m = si.n_rows();
    // Stage inputs exactly as they lie in the arena, then the symbols.
    auto* in = static_cast<uint8_t*>(in_host_) + static_cast<size_t>(slot) * stage_bytes_;
    // The bytes each input uses this step (arena offsets): only those are copied. The block table
    // is sized for max_tokens sequences of n_ctx positions (256 KB for the 1B at 4096 tokens) while
    // a decode step of one sequence uses one row of it.
    std::vector<std::pair<size_t, size_t>> used;
    auto put = [&](int buffer, const std::vector<int32_t>& v) {
      if (buffer < 0) return;
      const Buffer& B = p.buffers[static_cast<size_t>(buffer)];
      MK_CHECK(static_cast<int64_t>(v.size()) <= B.max_rows * B.cols, "step input {} too long", B.name);
      std::memcpy(in + static_cast<size_t>(B.offset) - in_lo_, v.data(), v.size() * 4);
      if (!v.empty()) used.emplace_back(static_cast<size_t>(B.offset), static_cast<size_t>(B.offset) + v.size() * 4);
    };
    put(p.tokens_buffer, si.tokens);
    put(p.positions_buffer, si.positions);
    put(p.kv_slot_buffer, si.kv_slot);
    put(p.row_seq_buffer, si.row_seq);
    put(p.block_table_buffer, si.block_table);
    put(p.logit_rows_buffer, si.logit_rows);
    // want_topk: only a top-k step reads the topk op's rows; the others skip its selection.
    cuda::MkSym sym{static_cast<int32_t>(m), static_cast<int32_t>(si.n_out()), out_buffer == rows_buffer_[static_cast<size_t>(OutputKind::topk)] ? 1 : 0, 0};
    std::memcpy(in + (in_hi_ - in_lo_), &sym, sizeof sym);
    const Buffer& ob = p.buffers[static_cast<size_t>(out_buffer)];
    const int64_t out_rows = ob.rows.eval({m, si.n_out()});
    const size_t out_bytes = static_cast<size_t>(out_rows * ob.cols) * 4;
    const uint64_t out_dev = arena_ + static_cast<uint64_t>(ob.offset);

    cuda::MkParams prm = params();
    prm.sym = sym;
    // The used ranges merged where less than 4 KB apart (a copy call costs more than that many
    // bytes); the graph's captured copy is fixed at capture, so it takes the whole input region.
    std::sort(used.begin(), used.end());
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const auto& [lo, hi] : used)
      if (!ranges.empty() && lo <= ranges.back().second + 4096) ranges.back().second = std::max(ranges.back().second, hi);
      else ranges.emplace_back(lo, hi);
    auto copy_in = [&] {
      if (mode_ == CudaMode::graph) {
        rt_->copy_to_device(arena_ + in_lo_, in_host_, in_hi_ - in_lo_, true);
      } else {
        for (const auto& [lo, hi] : ranges) rt_->copy_to_device(arena_ + lo, in + (lo - in_lo_), hi - lo, true);
      }
      rt_->copy_to_device(sym_dev_, in + (in_hi_ - in_lo_), sizeof sym, true);
      if (token_src != 0) rt_->copy_on_device(token_dst, token_src, 4);
    };
    switch (mode_) {
      case CudaMode::megakernel: {
        // The step's epoch becomes current only once its launch is issued: wait targets and queue
        // slots are functions of the epoch, so a copy or launch that fails must leave it where the
        // device counters are, or every later step would wait for a step that never ran.
        prm.epoch = epoch_ + 1;
        copy_in();
        rt_->launch(src_.kernel_name, static_cast<unsigned>(grid_), static_cast<unsigned>(src_.threads), src_.smem_bytes, prm, -1, true);
        epoch_ = prm.epoch;
        rt_->copy_to_host(out_host, out_dev, out_bytes, true);
        break;
      }
      case CudaMode::perop:
        copy_in();
        launch_perop(prm);
        rt_->copy_to_host(out_host, out_dev, out_bytes, true);
        break;
      case CudaMode::graph:
        if (!captured_) {  // captured once: the input copies read the pinned staging at replay
          rt_->begin_capture();
          copy_in();
          launch_perop(prm);
          rt_->end_capture();
          captured_ = true;
        }
        rt_->replay();
        // After the replay on the same stream (not captured: a step copies the logits or, for
        // greedy decoding, the argmax rows).
        rt_->copy_to_host(out_host, out_dev, out_bytes, true);
        break;
    }
    return out_bytes / 4;
  }

  // Waits for the issued steps (the first of them ran at epoch first_epoch; `what` names them);
  // "" when they all succeeded, else the error message (the backend then stays stopped until
  // reset()).
  std::string finish_steps(uint32_t first_epoch, const std::string& what) {
    const std::string sync_error = rt_->synchronize();
    if (!sync_error.empty()) {
      broken_ = sync_error;
      return fmt::format("{}: {} failed: {}{}", name_, what, broken_, device_error_text());
    }
    if (error_host_->flag) {
      broken_ = device_error_text();
      return fmt::format("{}: {}", name_, broken_);
    }
    if (!trace_path_.empty()) collect_trace(first_epoch);
    return "";
  }

  // Appends this step's records to the per-SM tracks; times in ns from the earliest record of the
  // first traced step.
  void collect_trace(uint32_t epoch) {
    std::vector<uint32_t> counts(static_cast<size_t>(grid_));
    rt_->copy_to_host(counts.data(), trace_, counts.size() * 4, false);
    const size_t n = program_.instrs.size();
    std::vector<cuda::MkTraceRec> recs, block;
    for (int b = 0; b < grid_; ++b) {
      const size_t c = std::min<size_t>(counts[static_cast<size_t>(b)], n);
      if (!c) continue;
      block.resize(c);
      rt_->copy_to_host(block.data(), trace_ + trace_header_ + (static_cast<size_t>(b) * n) * sizeof(cuda::MkTraceRec),
                        c * sizeof(cuda::MkTraceRec), false);
      recs.insert(recs.end(), block.begin(), block.end());
    }
    if (recs.empty()) return;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const cuda::MkTraceRec& r : recs) {
      lo = std::min(lo, r.wait_ns);
      hi = std::max(hi, r.end_ns);
    }
    if (trace_t0_ == 0) trace_t0_ = lo;
    const auto rel = [&](uint64_t t) { return static_cast<int64_t>(t - trace_t0_); };
    for (const cuda::MkTraceRec& r : recs) {
      cpu::TraceEvent e;
      e.instr = static_cast<uint32_t>(r.instr);
      e.step = epoch;
      e.wait_ns = rel(r.wait_ns);
      e.start_ns = rel(r.start_ns);
      e.end_ns = rel(r.end_ns);
      if (r.smid >= trace_tracks_.size()) trace_tracks_.resize(r.smid + 1);
      trace_tracks_[r.smid].push_back(e);
    }
    trace_steps_.push_back({rel(lo), rel(hi)});
  }

 public:
  void finish() override {
    if (trace_path_.empty() || trace_written_) return;
    trace_written_ = true;
    for (auto& t : trace_tracks_)
      std::sort(t.begin(), t.end(), [](const cpu::TraceEvent& a, const cpu::TraceEvent& b) { return a.wait_ns < b.wait_ns; });
    cpu::TraceData d{&program_, &trace_tracks_, &trace_steps_, "megakernel " + name_, "SM"};
    std::string summary = cpu::write_trace(d, trace_path_);
    std::fprintf(stderr, "wrote %s\n%s", trace_path_.c_str(), summary.c_str());
  }

 private:
  std::string device_error_text() const {
    cuda::MkError e;
    std::memcpy(&e, const_cast<const cuda::MkError*>(error_host_), sizeof e);
    if (!e.flag) return "";
    const Program& p = program_;
    auto instr = [&](int i) -> std::string {
      if (i < 0 || i >= static_cast<int>(p.instrs.size())) return fmt::format("instruction {}", i);
      const Instr& in = p.instrs[static_cast<size_t>(i)];
      return fmt::format("instruction {} ({} {} tile {})", i, opcode_name(in.opcode), p.ops[static_cast<size_t>(in.op)].name, in.tile);
    };
    if (e.kind == 1) {
      std::string cname = e.counter >= 0 && e.counter < static_cast<int>(p.counters.size())
                              ? p.counters[static_cast<size_t>(e.counter)].name : "?";
      return fmt::format("{} waited more than {} ms for counter {} ({}): value {}, expected {} (block {}, step {})", instr(e.instr),
                         timeout_ns_ / 1000000, e.counter, cname, e.value, e.target, e.block, e.epoch);
    }
    if (e.kind == 2) return fmt::format("{}: token id {} out of range [0, {})", instr(e.instr), e.counter, e.value);
    std::string r = rt_->describe_error(e, p);
    return r.empty() ? fmt::format("device error kind {} at {}", e.kind, instr(e.instr)) : r;
  }

  std::unique_ptr<cuda::DeviceRuntime> rt_;  // first: everything device-side is freed with it, last
  CudaMode mode_;
  std::string name_;
  std::string trace_path_;
  Program program_;
  cuda::CudaSource src_;
  cuda::DeviceTables tables_;
  int grid_ = 0;
  bool captured_ = false;
  uint64_t weights_ = 0, arena_ = 0, kv_ = 0, counters_ = 0, queue_ = 0, abort_ = 0, sym_dev_ = 0;
  uint64_t instrs_ = 0, waits_ = 0, list_offsets_ = 0, list_items_ = 0, op_instrs_ = 0, ops_ = 0, trace_ = 0;
  size_t arena_bytes_ = 0, kv_bytes_ = 0, counters_bytes_ = 0;
  size_t trace_header_ = 0;
  uint64_t trace_t0_ = 0;  // globaltimer ns of the first record
  bool trace_written_ = false;
  std::vector<std::vector<cpu::TraceEvent>> trace_tracks_;  // per SM
  std::vector<std::pair<int64_t, int64_t>> trace_steps_;
  volatile cuda::MkError* error_host_ = nullptr;
  uint64_t error_dev_ = 0;
  void* in_host_ = nullptr;  // decode_steps_ staging slots of stage_bytes_
  size_t stage_bytes_ = 0;
  int decode_steps_ = 1;
  int32_t* steps_host_ = nullptr;  // [kMaxDecodeSteps][4]: decode_greedy's argmax rows
  void* out_host_ = nullptr;
  size_t in_lo_ = 0, in_hi_ = 0;
  int out_buffer_ = -1;
  // By OutputKind: the argmax op's output (i32 [rows, 4]) and the topk op's (i32 [rows, 4 + 2k]);
  // -1 when the graph has none. Their pinned host copies.
  int rows_buffer_[2] = {-1, -1};
  void* rows_host_[2] = {nullptr, nullptr};
  int64_t n_ctx_ = 0;
  StepLimits limits_;
  KvWritten written_;  // pool rows written so far (prepare_step checks batches against it)
  uint64_t timeout_ns_ = 0;
  uint32_t epoch_ = 0;
  std::string broken_;
};

std::unique_ptr<Backend> make_on_gpu(const Graph& g, const ModelFile& m, const BackendOptions& o, CudaMode mode, const char* name) {
  if (!o.trace_path.empty() && mode != CudaMode::megakernel)
    fail("--trace: the {} backend has no trace; use --backend cuda (the megakernel)", name);
  auto rt = cuda::make_driver_runtime();
  // -t: the grid (one worker per block), as on cuda-emu; by default one block per SM. More than can be
  // resident is refused at launch set-up, naming both counts.
  const int workers = o.threads > 0 ? o.threads : static_cast<int>(env_int("MK_CUDA_WORKERS", rt->info().sms, 1, 1 << 20));
  Program p = compile_for_device(g, workers, rt->info(), o);
  return std::make_unique<CudaBackend>(std::move(rt), std::move(p), m, o, mode, name);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return make_on_gpu(g, m, o, CudaMode::megakernel, "cuda");
}
std::unique_ptr<Backend> make_cuda_perop_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return make_on_gpu(g, m, o, CudaMode::perop, "cuda-perop");
}
std::unique_ptr<Backend> make_cuda_graph_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return make_on_gpu(g, m, o, CudaMode::graph, "cuda-graph");
}

std::unique_ptr<Backend> make_cuda_emu_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  cuda::EmuOptions eo = cuda::emu_options_from_env(4);
  if (o.threads > 0) eo.blocks = o.threads;  // -t: the grid
  auto rt = cuda::make_emu_runtime(eo);
  Program p = compile_for_device(g, eo.blocks, rt->info(), o);
  return std::make_unique<CudaBackend>(std::move(rt), std::move(p), m, o, CudaMode::megakernel, "cuda-emu");
}

std::unique_ptr<Backend> make_cuda_emu_program_backend(Program program, const ModelFile& m, const BackendOptions& o,
                                                       const cuda::EmuOptions& eo) {
  auto rt = cuda::make_emu_runtime(eo);
  return std::make_unique<CudaBackend>(std::move(rt), std::move(program), m, o, CudaMode::megakernel, "cuda-emu");
}

}  // namespace mk
