// The CUDA backends: "cuda" (the persistent megakernel), and the baselines it must beat with the
// same device functions: "cuda-perop" (one launch per op on a stream) and "cuda-graph" (that launch
// sequence captured once into a CUDA graph and replayed each step).
//
// Setup: compile the Program for one block per SM (workers = SM count), generate the source,
// NVRTC it for the device's architecture (disk-cached), upload weights (Q8_0 converted to f32),
// allocate the arena, KV storage, counters and tables. A step: copy tokens/positions/symbols from
// pinned staging, launch, copy the logits back, synchronise, then read the host-mapped error record
// (a counter wait that timed out, a bad token id) and turn it into an mk::Error. After a device
// error the backend refuses further steps until reset().
//
// Without a driver or GPU the constructor throws "no CUDA driver: <reason>".
//
// Tracing (--trace FILE, megakernel only): the source is generated with MK_TRACE, every block
// records (instruction, SM, wait start, start, end) in %globaltimer ns; after each step the records
// are copied back, and finish() writes the same Chrome/Perfetto trace as the CPU backend (one track
// per SM) with its summary.
//
// Environment (development and benchmarks): MK_CUDA_DEVICE (ordinal), MK_CUDA_WORKERS (blocks,
// default the SM count), MK_CUDA_MAX_TOKENS (tokens per step, default 256), MK_CUDA_WAIT_TIMEOUT_MS
// (watchdog bound per wait, default 10000), MK_CUDA_VERBOSE=1 (compile times on stderr),
// MK_DEBUG_BREAK_WAIT=1 (makes one wait unsatisfiable:
// the watchdog check in bench/device_check.sh).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/interpreter.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/driver.h"
#include "backend/cuda/nvrtc.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mk {

#if MK_HAVE_NVRTC

namespace {

using cuda::driver;

enum class CudaMode { megakernel, perop, graph };

int64_t env_int(const char* name, int64_t def) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : def;
}

// A device allocation freed on destruction (errors while freeing are ignored: nothing to do then).
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  void alloc(size_t n) {
    bytes = std::max<size_t>(n, 256);
    MK_CU(cuMemAlloc, &ptr, bytes);
    MK_CU(cuMemsetD8, ptr, 0, bytes);
  }
  ~DeviceBuffer() {
    if (ptr) driver().cuMemFree(ptr);
  }
};

// The retained primary context, released after every other member is gone (declared first).
struct PrimaryContext {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  ~PrimaryContext() {
    if (ctx) driver().cuDevicePrimaryCtxRelease(dev);
  }
};

// Pinned host memory freed on destruction.
struct HostBuffer {
  void* ptr = nullptr;
  void alloc(size_t n, unsigned flags = 0) {
    MK_CU(cuMemHostAlloc, &ptr, std::max<size_t>(n, 64), flags);
    std::memset(ptr, 0, std::max<size_t>(n, 64));
  }
  ~HostBuffer() {
    if (ptr) driver().cuMemFreeHost(ptr);
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Graph& graph, const ModelFile& model, const BackendOptions& options, CudaMode mode)
      : mode_(mode), trace_path_(options.trace_path) {
    if (!trace_path_.empty() && mode != CudaMode::megakernel)
      fail("--trace: the {} backend has no trace; use --backend cuda (the megakernel)", mode == CudaMode::perop ? "cuda-perop" : "cuda-graph");
    std::string reason;
    if (!cuda::cuda_available(&reason)) fail("no CUDA driver: {}", reason);
    const auto& d = driver();
    int ordinal = static_cast<int>(env_int("MK_CUDA_DEVICE", 0));
    MK_CU(cuDeviceGet, &dev_, ordinal);
    int sms = 0, major = 0, minor = 0, smem_optin = 0;
    MK_CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev_);
    MK_CU(cuDeviceGetAttribute, &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev_);
    MK_CU(cuDeviceGetAttribute, &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev_);
    MK_CU(cuDeviceGetAttribute, &smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev_);
    MK_CU(cuDevicePrimaryCtxRetain, &pctx_.ctx, dev_);
    pctx_.dev = dev_;
    ctx_ = pctx_.ctx;
    MK_CU(cuCtxSetCurrent, ctx_);
    (void)d;

    // Compile: one worker per SM (one 512-thread block per SM is what the kernel is built for).
    CompileOptions co;
    co.workers = static_cast<int>(env_int("MK_CUDA_WORKERS", sms));
    co.max_tokens = env_int("MK_CUDA_MAX_TOKENS", 256);
    for (const Node& n : graph.nodes)  // as the cpu backend: no step is longer than the context
      if (n.op == Op::kv_cache) co.max_tokens = std::min<int64_t>(co.max_tokens, n.shape[0].c);
    co.schedule = schedule_from_name(options.schedule);
    const auto t_compile = std::chrono::steady_clock::now();
    program_ = compile_program(graph, co);
    if (env_int("MK_DEBUG_BREAK_WAIT", 0) != 0 && mode_ == CudaMode::megakernel) {
      const int i = cuda::break_one_wait(program_);
      std::fprintf(stderr, "MK_DEBUG_BREAK_WAIT: instruction %d now waits for a signal that never comes\n", i);
    }
    const Program& p = program_;

    // Weights: device dtype (Q8_0 becomes f32), 256-byte aligned in one allocation.
    cuda::CudaCodegenOptions cg;
    cg.max_smem_bytes = std::max(48 * 1024, smem_optin - 1024);
    cg.trace = !trace_path_.empty();
    cg.perop_kernels = mode_ != CudaMode::megakernel;
    std::vector<size_t> woff;
    size_t wbytes = 0;
    for (const ProgramWeight& pw : p.weights) {
      const WeightTensor& t = model.get(pw.name, pw.shape);
      if (t.dtype != pw.dtype) fail("{}: program expects {}, file has {}", pw.name, dtype_name(pw.dtype), dtype_name(t.dtype));
      DType dt = t.dtype == DType::Q8_0 ? DType::F32 : t.dtype;
      if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16)
        fail("{}: the CUDA backend cannot read {} weights", pw.name, dtype_name(t.dtype));
      cg.weight_dtypes.push_back(dt);
      woff.push_back(wbytes);
      wbytes += (dtype_bytes(dt, t.numel()) + 255) / 256 * 256;
    }
    src_ = cuda::generate_cuda(p, cg);
    tables_ = cuda::build_device_tables(p, src_);

    cuda::NvrtcOptions no;
    no.arch = cuda::arch_for_compute_capability(major, minor);
    no.name = "megakernel.cu";
    cuda::NvrtcResult built = cuda::compile_to_cubin(src_.code, no);
    MK_CU(cuModuleLoadData, &module_, built.cubin.data());
    if (env_int("MK_CUDA_VERBOSE", 0) != 0) {  // bench/device_check.sh reads this line
      const double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_compile).count();
      std::fprintf(stderr, "cuda compile: %zu instructions, %d functions, %zu KB source, NVRTC %.0f ms (%s), total %.0f ms\n",
                   p.instrs.size(), src_.n_functions, src_.code.size() / 1024, built.compile_ms,
                   built.from_cache ? "cache hit" : "cache miss", total);
    }
    MK_CU(cuModuleGetFunction, &mega_, module_, "mk_megakernel");
    for (int f = 0; f < (cg.perop_kernels ? src_.n_functions : 0); ++f) {
      CUfunction fn = nullptr;
      MK_CU(cuModuleGetFunction, &fn, module_, fmt::format("mk_perop_{}", f).c_str());
      perop_.push_back(fn);
    }
    const int smem = static_cast<int>(src_.smem_bytes);
    for (CUfunction fn : perop_) MK_CU(cuFuncSetAttribute, fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem);
    MK_CU(cuFuncSetAttribute, mega_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem);
    int per_sm = 0;
    MK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &per_sm, mega_, src_.threads, static_cast<size_t>(smem));
    grid_ = p.workers;
    if (per_sm * sms < grid_)
      fail("cuda: {} blocks of {} threads with {} bytes of shared memory cannot all be resident ({} per SM x {} SMs)", grid_,
           src_.threads, smem, per_sm, sms);
    if (p.schedule != ScheduleKind::dynamic && static_cast<int>(p.lists.size()) != grid_)
      fail("cuda: static schedule has {} lists for {} blocks", p.lists.size(), grid_);

    // Memory.
    weights_.alloc(wbytes);
    for (size_t i = 0; i < p.weights.size(); ++i) {
      const WeightTensor& t = model.get(p.weights[i].name);
      if (t.dtype == DType::Q8_0) {
        std::vector<float> f(static_cast<size_t>(t.numel()));
        to_f32(t.dtype, t.data, f.data(), t.numel());
        MK_CU(cuMemcpyHtoD, weights_.ptr + woff[i], f.data(), f.size() * 4);
      } else {
        MK_CU(cuMemcpyHtoD, weights_.ptr + woff[i], t.data, t.nbytes);
      }
    }
    arena_.alloc(static_cast<size_t>(p.arena_bytes));
    kv_.alloc(static_cast<size_t>(p.kv_bytes));
    counters_.alloc(std::max<size_t>(p.counters.size(), 1) * 4);
    queue_.alloc(8);
    abort_.alloc(4);
    sym_dev_.alloc(sizeof(cuda::MkSym));
    if (cg.trace) {
      trace_header_ = (static_cast<size_t>(grid_) * 4 + 255) / 256 * 256;
      trace_.alloc(trace_header_ + static_cast<size_t>(grid_) * p.instrs.size() * sizeof(cuda::MkTraceRec));
      trace_tracks_.assign(static_cast<size_t>(sms), {});
    }
    upload(instrs_, tables_.instrs);
    upload(waits_, tables_.waits);
    upload(list_offsets_, tables_.list_offsets);
    upload(list_items_, tables_.list_items);
    upload(op_instrs_, tables_.op_instrs);
    std::vector<cuda::MkOpArgs> args(p.ops.size());
    auto buf = [&](int b) -> uint64_t {
      if (b < 0) return 0;
      const Buffer& B = p.buffers[static_cast<size_t>(b)];
      return (B.kind == BufferKind::kv ? kv_.ptr : arena_.ptr) + static_cast<uint64_t>(B.offset);
    };
    auto wt = [&](int w) -> uint64_t { return w < 0 ? 0 : weights_.ptr + woff[static_cast<size_t>(w)]; };
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
    }
    upload(ops_, args);

    // Host-mapped error record; pinned staging for inputs, symbols and logits.
    error_mem_.alloc(sizeof(cuda::MkError), CU_MEMHOSTALLOC_DEVICEMAP);
    error_host_ = static_cast<volatile cuda::MkError*>(error_mem_.ptr);
    MK_CU(cuMemHostGetDevicePointer, &error_dev_, error_mem_.ptr, 0);
    if (p.tokens_buffer < 0) fail("cuda: the program has no token input");
    in_lo_ = static_cast<size_t>(p.buffers[static_cast<size_t>(p.tokens_buffer)].offset);
    in_hi_ = in_lo_ + static_cast<size_t>(p.max_tokens) * 4;
    if (p.positions_buffer >= 0) {
      const Buffer& B = p.buffers[static_cast<size_t>(p.positions_buffer)];
      in_lo_ = std::min(in_lo_, static_cast<size_t>(B.offset));
      in_hi_ = std::max(in_hi_, static_cast<size_t>(B.offset) + static_cast<size_t>(p.max_tokens) * 4);
    }
    in_mem_.alloc(in_hi_ - in_lo_ + sizeof(cuda::MkSym));
    in_host_ = in_mem_.ptr;
    out_buffer_ = -1;
    for (const auto& [name, b] : p.outputs)
      if (name == "logits") out_buffer_ = b;
    if (out_buffer_ < 0) fail("cuda: the program has no output named logits");
    const Buffer& ob = p.buffers[static_cast<size_t>(out_buffer_)];
    out_mem_.alloc(static_cast<size_t>(ob.max_rows * ob.cols) * 4);
    out_host_ = out_mem_.ptr;
    MK_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
    timeout_ns_ = static_cast<uint64_t>(env_int("MK_CUDA_WAIT_TIMEOUT_MS", 10000)) * 1000000ull;
    for (const Buffer& b : p.buffers)
      if (b.kind == BufferKind::kv) n_ctx_ = std::max(n_ctx_, b.max_rows);
  }

  ~CudaBackend() override {
    // Errors here cannot be reported; the buffers and the context free themselves afterwards.
    const auto& d = driver();
    if (stream_) d.cuStreamSynchronize(stream_);
    if (graph_exec_) d.cuGraphExecDestroy(graph_exec_);
    if (graph_) d.cuGraphDestroy(graph_);
    if (stream_) d.cuStreamDestroy(stream_);
    if (module_) d.cuModuleUnload(module_);
  }

  std::string name() const override {
    return mode_ == CudaMode::megakernel ? "cuda" : mode_ == CudaMode::perop ? "cuda-perop" : "cuda-graph";
  }

  void reset() override {
    MK_CU(cuCtxSetCurrent, ctx_);
    MK_CU(cuStreamSynchronize, stream_);
    MK_CU(cuMemsetD8, kv_.ptr, 0, kv_.bytes);
    MK_CU(cuMemsetD8, counters_.ptr, 0, counters_.bytes);
    MK_CU(cuMemsetD8, queue_.ptr, 0, queue_.bytes);
    MK_CU(cuMemsetD8, abort_.ptr, 0, abort_.bytes);
    std::memset(error_mem_.ptr, 0, sizeof(cuda::MkError));
    epoch_ = 0;
    broken_.clear();
  }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_past) override {
    if (!broken_.empty()) fail("cuda: the backend stopped after a device error ({}); reset() first", broken_);
    if (tokens.empty()) fail("forward: no tokens");
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n_ctx_ > 0 && n_past + n > n_ctx_)
      fail("context overflow: {} tokens in the cache + {} new > context length {}", n_past, n, n_ctx_);
    MK_CU(cuCtxSetCurrent, ctx_);
    std::vector<float> all;
    std::vector<float> last;
    // Steps of at most max_tokens tokens: the KV cache carries the earlier chunks.
    for (int64_t off = 0; off < n; off += program_.max_tokens) {
      const int64_t m = std::min<int64_t>(program_.max_tokens, n - off);
      last = step(tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(m)), n_past + off);
      all.insert(all.end(), last.begin(), last.end());
    }
    const Buffer& ob = program_.buffers[static_cast<size_t>(out_buffer_)];
    return ob.rows.is_const() ? last : all;  // all_logits programs return one row per token
  }

 private:
  template <class T>
  void upload(DeviceBuffer& b, const std::vector<T>& v) {
    b.alloc(v.size() * sizeof(T));
    if (!v.empty()) MK_CU(cuMemcpyHtoD, b.ptr, v.data(), v.size() * sizeof(T));
  }

  cuda::MkParams params() const {
    cuda::MkParams prm{};
    prm.instrs = instrs_.ptr;
    prm.waits = waits_.ptr;
    prm.list_offsets = list_offsets_.ptr;
    prm.list_items = list_items_.ptr;
    prm.op_instrs = op_instrs_.ptr;
    prm.ops = ops_.ptr;
    prm.counters = counters_.ptr;
    prm.queue = queue_.ptr;
    prm.error = error_dev_;
    prm.abort_flag = abort_.ptr;
    prm.sym_dev = sym_dev_.ptr;
    prm.trace = trace_.ptr;
    prm.timeout_ns = timeout_ns_;
    return prm;
  }

  // Issues the per-op launches (on the stream or into a capture).
  void launch_perop(cuda::MkParams& prm) {
    for (int32_t op : tables_.launch_order) {
      int first = tables_.op_first[static_cast<size_t>(op)];
      const unsigned blocks = static_cast<unsigned>(tables_.op_count[static_cast<size_t>(op)]);
      void* argv[] = {&prm, &first};
      MK_CU(cuLaunchKernel, perop_[static_cast<size_t>(src_.op_function[static_cast<size_t>(op)])], blocks, 1, 1,
            static_cast<unsigned>(src_.threads), 1, 1, static_cast<unsigned>(src_.smem_bytes), stream_, argv, nullptr);
    }
  }

  std::vector<float> step(std::span<const int32_t> tokens, int64_t n_past) {
    const Program& p = program_;
    const int64_t m = static_cast<int64_t>(tokens.size());
    // Stage inputs exactly as they lie in the arena, then the symbols.
    auto* in = static_cast<uint8_t*>(in_host_);
    const size_t tok_off = static_cast<size_t>(p.buffers[static_cast<size_t>(p.tokens_buffer)].offset) - in_lo_;
    std::memcpy(in + tok_off, tokens.data(), static_cast<size_t>(m) * 4);
    if (p.positions_buffer >= 0) {
      auto* pos = reinterpret_cast<int32_t*>(in + static_cast<size_t>(p.buffers[static_cast<size_t>(p.positions_buffer)].offset) - in_lo_);
      for (int64_t i = 0; i < m; ++i) pos[i] = static_cast<int32_t>(n_past + i);
    }
    cuda::MkSym sym{static_cast<int32_t>(m), static_cast<int32_t>(n_past)};
    std::memcpy(in + (in_hi_ - in_lo_), &sym, sizeof sym);
    const Buffer& ob = p.buffers[static_cast<size_t>(out_buffer_)];
    const int64_t out_rows = ob.rows.eval({m, n_past});
    const size_t out_bytes = static_cast<size_t>(out_rows * ob.cols) * 4;
    const size_t out_max = static_cast<size_t>(ob.max_rows * ob.cols) * 4;
    const CUdeviceptr out_dev = arena_.ptr + static_cast<uint64_t>(ob.offset);

    cuda::MkParams prm = params();
    prm.sym = sym;
    auto copy_in = [&] {
      MK_CU(cuMemcpyHtoDAsync, arena_.ptr + in_lo_, in_host_, in_hi_ - in_lo_, stream_);
      MK_CU(cuMemcpyHtoDAsync, sym_dev_.ptr, in + (in_hi_ - in_lo_), sizeof sym, stream_);
    };
    switch (mode_) {
      case CudaMode::megakernel: {
        // The step's epoch becomes current only once its launch is issued: wait targets and queue
        // slots are functions of the epoch, so a copy or launch that fails must leave it where the
        // device counters are, or every later step would wait for a step that never ran.
        prm.epoch = epoch_ + 1;
        copy_in();
        void* argv[] = {&prm};
        MK_CU(cuLaunchCooperativeKernel, mega_, static_cast<unsigned>(grid_), 1, 1, static_cast<unsigned>(src_.threads), 1, 1,
              static_cast<unsigned>(src_.smem_bytes), stream_, argv);
        epoch_ = prm.epoch;
        MK_CU(cuMemcpyDtoHAsync, out_host_, out_dev, out_bytes, stream_);
        break;
      }
      case CudaMode::perop:
        copy_in();
        launch_perop(prm);
        MK_CU(cuMemcpyDtoHAsync, out_host_, out_dev, out_bytes, stream_);
        break;
      case CudaMode::graph:
        if (!graph_exec_) {  // captured once: the copies read the pinned staging at replay
          MK_CU(cuStreamBeginCapture, stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
          copy_in();
          launch_perop(prm);
          MK_CU(cuMemcpyDtoHAsync, out_host_, out_dev, out_max, stream_);
          MK_CU(cuStreamEndCapture, stream_, &graph_);
          MK_CU(cuGraphInstantiate, &graph_exec_, graph_, 0);
        }
        MK_CU(cuGraphLaunch, graph_exec_, stream_);
        break;
    }
    CUresult r = driver().cuStreamSynchronize(stream_);
    if (r != CUDA_SUCCESS) {
      broken_ = cuda::error_text(r);
      fail("cuda: step at n_past {} failed: cuStreamSynchronize: {}{}", n_past, broken_, device_error_text());
    }
    if (error_host_->flag) {
      broken_ = device_error_text();
      fail("cuda: {}", broken_);
    }
    if (!trace_path_.empty()) collect_trace(prm.epoch);
    const float* o = static_cast<const float*>(out_host_);
    return std::vector<float>(o, o + out_bytes / 4);
  }

  // Appends this step's records to the per-SM tracks; times in ns from the earliest record of the
  // first traced step.
  void collect_trace(uint32_t epoch) {
    std::vector<uint32_t> counts(static_cast<size_t>(grid_));
    MK_CU(cuMemcpyDtoH, counts.data(), trace_.ptr, counts.size() * 4);
    const size_t n = program_.instrs.size();
    std::vector<cuda::MkTraceRec> recs, block;
    for (int b = 0; b < grid_; ++b) {
      const size_t c = std::min<size_t>(counts[static_cast<size_t>(b)], n);
      if (!c) continue;
      block.resize(c);
      MK_CU(cuMemcpyDtoH, block.data(), trace_.ptr + trace_header_ + (static_cast<size_t>(b) * n) * sizeof(cuda::MkTraceRec),
            c * sizeof(cuda::MkTraceRec));
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
    cpu::TraceData d{&program_, &trace_tracks_, &trace_steps_, "megakernel cuda", "SM"};
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
    return fmt::format("device error kind {} at {}", e.kind, instr(e.instr));
  }

  PrimaryContext pctx_;  // first: destroyed last
  HostBuffer error_mem_, in_mem_, out_mem_;
  CudaMode mode_;
  std::string trace_path_;
  Program program_;
  cuda::CudaSource src_;
  cuda::DeviceTables tables_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction mega_ = nullptr;
  std::vector<CUfunction> perop_;
  CUstream stream_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec graph_exec_ = nullptr;
  int grid_ = 0;
  DeviceBuffer weights_, arena_, kv_, counters_, queue_, abort_, sym_dev_;
  DeviceBuffer instrs_, waits_, list_offsets_, list_items_, op_instrs_, ops_, trace_;
  size_t trace_header_ = 0;
  uint64_t trace_t0_ = 0;  // globaltimer ns of the first record
  bool trace_written_ = false;
  std::vector<std::vector<cpu::TraceEvent>> trace_tracks_;  // per SM
  std::vector<std::pair<int64_t, int64_t>> trace_steps_;
  volatile cuda::MkError* error_host_ = nullptr;
  CUdeviceptr error_dev_ = 0;
  void* in_host_ = nullptr;
  void* out_host_ = nullptr;
  size_t in_lo_ = 0, in_hi_ = 0;
  int out_buffer_ = -1;
  int64_t n_ctx_ = 0;
  uint64_t timeout_ns_ = 0;
  uint32_t epoch_ = 0;
  std::string broken_;
};

std::unique_ptr<Backend> make(const Graph& g, const ModelFile& m, const BackendOptions& o, CudaMode mode) {
  return std::make_unique<CudaBackend>(g, m, o, mode);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return make(g, m, o, CudaMode::megakernel);
}
std::unique_ptr<Backend> make_cuda_perop_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return make(g, m, o, CudaMode::perop);
}
std::unique_ptr<Backend> make_cuda_graph_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  return make(g, m, o, CudaMode::graph);
}

#else  // !MK_HAVE_NVRTC

namespace {
[[noreturn]] void no_cuda() {
  std::string reason;
  cuda::cuda_available(&reason);
  fail("no CUDA driver: {}", reason);
}
}  // namespace
std::unique_ptr<Backend> make_cuda_backend(const Graph&, const ModelFile&, const BackendOptions&) { no_cuda(); }
std::unique_ptr<Backend> make_cuda_perop_backend(const Graph&, const ModelFile&, const BackendOptions&) { no_cuda(); }
std::unique_ptr<Backend> make_cuda_graph_backend(const Graph&, const ModelFile&, const BackendOptions&) { no_cuda(); }

#endif

}  // namespace mk
