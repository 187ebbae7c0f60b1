#include "backend/cpu/interpreter.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "passes/pass.h"
#include "support/error.h"

namespace mk::cpu {

namespace {

// Shared activation slots (StepMemory::act_shared): three keys in flight at once is more than a
// decoder layer's chain of matmuls ever has; act_shared_slots checks each reuse.
constexpr int kActSharedSlots = 3;

// Zeroed memory for the interpreter's large buffers (freed with std::free). From 1 MiB up it is
// 2 MiB-aligned and asks for transparent huge pages (madvise MADV_HUGEPAGE, the setting most
// distributions ship: THP only where asked): a step streams every weight and most of the KV cache,
// and with 4 KiB pages each 4 KiB of it is a TLB miss.
uint8_t* alloc_zeroed(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = bytes >= (size_t{1} << 20);
  const size_t align = huge ? kHuge : 64;
  bytes = (bytes + align - 1) / align * align;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(align, bytes);
  if (!p) fail("cpu: cannot allocate {} bytes", bytes);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
#endif
  std::memset(p, 0, bytes);
  return static_cast<uint8_t*>(p);
}

// Sleeps while *addr == expected, at most timeout_ns (spurious returns are fine: callers re-check).
void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, int64_t timeout_ns) {
#if defined(__linux__)
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
#else
  (void)addr, (void)expected, (void)timeout_ns;
  std::this_thread::yield();
#endif
}

void futex_wake_all(std::atomic<uint32_t>* addr) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
#else
  (void)addr;
#endif
}

// Wrap-safe "counter value has reached target" for 32-bit counters that only grow.
inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

}  // namespace

Interpreter::Interpreter(Program program, const ModelFile& model, bool trace, bool act_quant, bool kv_f16)
    : p_(std::move(program)), tracing_(trace), kv_f16_(kv_f16), gelu_f16_(act_quant) {
  validate_program(p_);
  t0_ = 0;
  t0_ = now_ns();
  for (const ProgramWeight& pw : p_.weights) {
    const WeightTensor& t = model.get(pw.name);
    if (t.dtype != pw.dtype) fail("{}: program expects {}, file has {}", pw.name, dtype_name(pw.dtype), dtype_name(t.dtype));
    if (t.shape != pw.shape) fail_tensor_shape(model.path, t, pw.shape);
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16 && !dtype_is_quantized(t.dtype))
      fail("{}: the cpu backend cannot read {} weights", pw.name, dtype_name(t.dtype));
    WeightRef w;
    w.dtype = t.dtype;
    w.quant = quant::quant_type(t.dtype);
    w.act_q8 = act_quant && w.quant && w.quant->act;
    w.data = t.data;
    w.row_elems = t.shape.back();
    w.row_bytes = dtype_bytes(t.dtype, w.row_elems);
    if (t.dtype == DType::F32) {
      if (reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
        w.f32 = reinterpret_cast<const float*>(t.data);
      } else {
        auto copy = std::make_unique<std::vector<float>>(static_cast<size_t>(t.numel()));
        std::memcpy(copy->data(), t.data, copy->size() * 4);
        w.f32 = copy->data();
        converted_.push_back(std::move(copy));
      }
    }
    weights_.push_back(w);
  }
  // The matmul weights that the 16-row tiles read packed (QuantType::pack): packed once here, the
  // GGUF rows then untouched by matmuls.
  // All packed matrices share one allocation (huge pages: alloc_zeroed), each 64-byte aligned.
  if (quant::gemm_packed_available()) {
    std::vector<std::pair<int, int64_t>> todo;  // (weight, rows)
    size_t total = 0;
    std::vector<bool> seen(weights_.size(), false);
    for (const OpDesc& o : p_.ops) {
      if (o.opcode != Opcode::matmul && o.opcode != Opcode::moe_matmul) continue;
      for (const int id : {o.w, o.w_up}) {
        if (id < 0 || seen[static_cast<size_t>(id)]) continue;
        seen[static_cast<size_t>(id)] = true;
        const WeightRef& w = weights_[static_cast<size_t>(id)];
        if (!w.act_q8 || !w.quant->pack) continue;
        const int64_t nw = static_cast<int64_t>(w.row_elems > 0 ? model.get(p_.weights[static_cast<size_t>(id)].name).numel() / w.row_elems : 0);
        todo.emplace_back(id, nw);
        total += (w.quant->packed_bytes(nw, w.row_elems) + 63) / 64 * 64;
      }
    }
    if (total > 0) packed_ = alloc_zeroed(total);
    size_t at = 0;
    for (const auto& [id, nw] : todo) {
      WeightRef& w = weights_[static_cast<size_t>(id)];
      w.quant->pack(w.data, w.row_bytes, nw, w.row_elems, packed_ + at);
      w.packed = packed_ + at;
      at += (w.quant->packed_bytes(nw, w.row_elems) + 63) / 64 * 64;
      for (const auto& f : model.files) f->drop_pages(w.data, static_cast<size_t>(nw) * w.row_bytes);  // read from here on only by embedding lookups
      w.packed_group_bytes = w.quant->packed_bytes(16, w.row_elems);
    }
  }
  act_key_ = act_cache_keys(p_, weights_.data());
  act_slot_ = act_shared_slots(p_, weights_.data(), act_key_, kActSharedSlots);
  arena_ = alloc_zeroed(static_cast<size_t>(p_.arena_bytes));
  // An f16 cache keeps every KV buffer at half its offset, in half its bytes (StepMemory::kv_f16).
  kv_alloc_bytes_ = static_cast<size_t>(kv_f16_ ? (p_.kv_bytes / 2 + 63) / 64 * 64 : p_.kv_bytes);
  kv_ = alloc_zeroed(kv_alloc_bytes_);
  counters_ = std::make_unique<Counter[]>(p_.counters.size());
  scratch_floats_ = scratch_floats(p_);
  const size_t sf = scratch_floats_ + act_cache_floats(p_);
  const int W = p_.workers;
  for (int w = 0; w < W; ++w) scratch_.push_back(reinterpret_cast<float*>(alloc_zeroed(sf * sizeof(float))));
  act_shared_ = std::make_unique<ActShared[]>(kActSharedSlots);
  for (int i = 0; i < kActSharedSlots; ++i)
    act_shared_[i].rows = alloc_zeroed(act_cache_floats(p_) * sizeof(float));
  trace_.assign(static_cast<size_t>(W), {});
  // Worker 0 is the calling thread (step() runs its share), so a step wakes no thread for it.
  for (int w = 1; w < W; ++w) threads_.emplace_back([this, w] { worker_main(w); });
}

Interpreter::~Interpreter() {
  stop_.store(true, std::memory_order_relaxed);
  start_.fetch_add(1, std::memory_order_release);
  start_.notify_all();
  for (auto& t : threads_) t.join();
  for (float* s : scratch_) std::free(s);
  for (int i = 0; act_shared_ && i < kActSharedSlots; ++i) std::free(act_shared_[i].rows);
  std::free(arena_);
  std::free(kv_);
  std::free(packed_);
}

int64_t Interpreter::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0_;
}

void Interpreter::reset_kv() {
  std::memset(kv_, 0, kv_alloc_bytes_);
  written_.clear();
}

StepLimits Interpreter::limits() const {
  StepLimits l;
  l.max_rows = p_.max_tokens;
  l.n_ctx = p_.n_ctx;
  l.block_size = p_.kv_block_size;
  l.pool_blocks = p_.kv_block_size > 0 ? p_.kv_pool_rows / p_.kv_block_size : 0;
  l.max_blocks_per_seq = p_.max_blocks_per_seq();
  l.written = &written_;
  return l;
}

void Interpreter::step(std::span<const int32_t> tokens, int64_t n_past) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1 || n > p_.max_tokens) fail("cpu: {} tokens in one step (the program allows 1..{})", n, p_.max_tokens);
  if (n_past < 0 || (p_.n_ctx > 0 && n_past + n > p_.n_ctx))  // no KV cache (op tests): no context limit
    fail("context overflow: {} tokens in the cache + {} new > context length {}", n_past, n, p_.n_ctx);
  bool all_rows = false;
  for (const auto& [name, b] : p_.outputs)
    if (is_main_output(name)) all_rows = p_.buffers[static_cast<size_t>(b)].rows == SymExpr::tokens();
  step(one_sequence_step(tokens, n_past, limits(), all_rows));
}

void Interpreter::step(const StepInputs& in) {
  if (failed_.load()) fail("cpu: the interpreter failed in an earlier step: {}", error_);
  const int64_t n = in.n_rows();
  if (n < 1 || n > p_.max_tokens) fail("cpu: {} tokens in one step (the program allows 1..{})", n, p_.max_tokens);
  auto put = [&](int buffer, const std::vector<int32_t>& v) {
    if (buffer < 0) return;
    const Buffer& B = p_.buffers[static_cast<size_t>(buffer)];
    MK_CHECK(static_cast<int64_t>(v.size()) <= B.max_rows * B.cols, "step input {} too long", B.name);
    std::memcpy(arena_ + B.offset, v.data(), v.size() * 4);
  };
  put(p_.tokens_buffer, in.tokens);
  put(p_.positions_buffer, in.positions);
  if (p_.kv_block_size > 0) {
    MK_CHECK(static_cast<int64_t>(in.kv_slot.size()) == n && in.block_table.size() == static_cast<size_t>(in.n_seqs * p_.max_blocks_per_seq()),
             "step inputs were prepared for another KV geometry");
    put(p_.kv_slot_buffer, in.kv_slot);
    put(p_.row_seq_buffer, in.row_seq);
    put(p_.block_table_buffer, in.block_table);
  }
  put(p_.logit_rows_buffer, in.logit_rows);
  for (const OpDesc& o : p_.ops) {  // table lookups must stay inside the table
    if (o.opcode != Opcode::embed) continue;
    const int32_t* ids = reinterpret_cast<const int32_t*>(arena_ + p_.buffers[static_cast<size_t>(o.ids)].offset);
    int64_t rows = p_.weights[static_cast<size_t>(o.w)].shape[0];
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] < 0 || ids[i] >= rows) fail("{}: id {} out of range [0, {})", o.name, ids[i], rows);
  }
  const int64_t n_out = in.n_out();
  sym_ = {n, n_out};
  const int64_t t_begin = now_ns();
  done_.store(0, std::memory_order_relaxed);
  ++epoch_;
  start_.store(epoch_, std::memory_order_release);
  start_.notify_all();
  run_step(0, epoch_);
  const uint32_t others = static_cast<uint32_t>(p_.workers - 1);
  await(done_, [&](uint32_t d) { return d >= others; });
  step_times_.push_back({t_begin, now_ns()});
  if (failed_.load()) {
    std::lock_guard<std::mutex> lock(error_mu_);
    fail("cpu: {}", error_);
  }
}

std::span<const float> Interpreter::output(const std::string& name, int64_t* rows, int64_t* cols) const {
  for (const auto& [n, b] : p_.outputs) {
    if (n != name) continue;
    const Buffer& B = p_.buffers[static_cast<size_t>(b)];
    int64_t r = B.rows.eval(sym_);
    if (rows) *rows = r;
    if (cols) *cols = B.cols;
    MK_CHECK(!(kv_f16_ && B.kind == BufferKind::kv), "cpu: output {} is an f16 KV cache buffer", name);
    const uint8_t* base = B.kind == BufferKind::kv ? kv_ : arena_;
    return {reinterpret_cast<const float*>(base + B.offset), static_cast<size_t>(r * B.cols)};
  }
  fail("cpu: the program has no output named {}", name);
}

template <class Done>
void Interpreter::await(std::atomic<uint32_t>& a, Done done) {
  // Spin, then yield, then sleep: between back-to-back steps a worker stays awake (waking a
  // sleeping thread costs ~100 us on a VM), while an idle interpreter costs no CPU.
  int64_t since = 0;
  for (int spins = 0;; ++spins) {
    uint32_t v = a.load(std::memory_order_acquire);
    if (done(v)) return;
    if (spins < 2000) {
      cpu_relax();
    } else if (since == 0 || now_ns() - since < 2'000'000) {
      if (since == 0) since = now_ns();
      std::this_thread::yield();
    } else {
      a.wait(v, std::memory_order_acquire);
    }
  }
}

void Interpreter::worker_main(int w) {
  uint32_t seen = 0;
  for (;;) {
    await(start_, [&](uint32_t s) { return s != seen; });
    uint32_t s = start_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = s;
    run_step(w, s);
    done_.fetch_add(1, std::memory_order_release);
    done_.notify_all();
  }
}

void Interpreter::signal(Counter& c) {
  // seq_cst on both sides (here and in wait_for) so that either the signaller sees the sleeper or
  // the sleeper sees the new value before it sleeps.
  c.value.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&c.value);
}

bool Interpreter::wait_for(int w, const Instr& in, uint32_t epoch) {
  for (const Wait& wt : in.waits) {
    const uint32_t target = epoch * wt.count;
    Counter& c = counters_[static_cast<size_t>(wt.counter)];
    if (reached(c.value.load(std::memory_order_acquire), target)) continue;
    int spins = 0;
    int64_t since = 0;
    for (;;) {
      uint32_t v = c.value.load(std::memory_order_acquire);
      if (reached(v, target)) break;
      if (failed_.load(std::memory_order_relaxed)) return false;
      if (++spins < 2000) {  // ~50 us of pause-spinning: most waits end here
        cpu_relax();
        continue;
      }
      // Then yield for up to 2 ms: lets other threads run on a busy or oversubscribed machine
      // without sleeping (waking a sleeping thread costs tens to hundreds of microseconds on a
      // VM, more than most instructions take).
      const int64_t t_now = now_ns();
      if (since == 0) since = t_now;
      if (t_now - since < 2'000'000) {
        std::this_thread::yield();
        continue;
      }
      // Sleep until the counter moves (or 20 ms pass, to check for failure and the deadline).
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      v = c.value.load(std::memory_order_seq_cst);
      if (!reached(v, target)) futex_wait(&c.value, v, 20'000'000);
      c.sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (static_cast<double>(now_ns() - since) > wait_timeout_s * 1e9) {
        std::lock_guard<std::mutex> lock(error_mu_);
        if (!failed_.load()) {
          error_ = fmt::format("worker {} timed out in step {} before instruction {}: counter c{} ({}) is {}, waiting for {}",
                               w, epoch, p_.instr_str(static_cast<int>(&in - p_.instrs.data())), wt.counter,
                               p_.counters[static_cast<size_t>(wt.counter)].name, c.value.load(), target);
          failed_.store(true);
        }
        return false;
      }
    }
  }
  return true;
}

void Interpreter::run_step(int w, uint32_t epoch) {
  float* scratch = scratch_[static_cast<size_t>(w)];
  StepMemory m{arena_, kv_, weights_.data(), sym_, kv_f16_, scratch + scratch_floats_, act_key_.data(),
               act_slot_.data(), act_shared_.get(), epoch, want_topk_};
  m.gelu_f16 = gelu_f16_;
  const uint64_t n = p_.instrs.size();
  auto exec = [&](uint64_t idx) -> bool {
    const Instr& in = p_.instrs[idx];
    TraceEvent ev;
    if (tracing_) ev.wait_ns = now_ns();
    if (!wait_for(w, in, epoch)) return false;
    if (tracing_) ev.start_ns = now_ns();
    execute(p_, in, m, scratch);
    signal(counters_[static_cast<size_t>(in.signal)]);
    if (tracing_) {
      ev.end_ns = now_ns();
      ev.instr = static_cast<uint32_t>(idx);
      ev.step = epoch;
      trace_[static_cast<size_t>(w)].push_back(ev);
    }
    return true;
  };
  if (p_.schedule == ScheduleKind::dynamic) {
    // Each worker makes exactly one failing claim per step, so step e's claims start here.
    const uint64_t base = static_cast<uint64_t>(epoch - 1) * (n + static_cast<uint64_t>(p_.workers));
    for (;;) {
      uint64_t idx = queue_head_.fetch_add(1, std::memory_order_relaxed) - base;
      if (idx >= n || !exec(idx)) break;
    }
  } else {
    for (int32_t idx : p_.lists[static_cast<size_t>(w)])
      if (!exec(static_cast<uint64_t>(idx))) break;
  }
}

namespace {
TraceData trace_data(const Interpreter& it) { return TraceData{&it.program(), &it.trace(), &it.step_times()}; }
}  // namespace

std::string trace_summary(const Interpreter& it) { return trace_summary(trace_data(it)); }
std::string write_trace(const Interpreter& it, const std::string& path) { return write_trace(trace_data(it), path); }

std::string trace_summary(const TraceData& it) {
  const Program& p = *it.program;
  int64_t wall = 0;
  for (auto [a, b] : *it.step_times) wall += b - a;
  std::string s = fmt::format("trace: {} steps, {:.3f} ms in steps\n", it.step_times->size(), static_cast<double>(wall) / 1e6);
  std::array<int64_t, kNumOpcodes> per_op{};
  std::array<int64_t, kNumOpcodes> per_op_n{};
  s += fmt::format("  {:>6}   busy    wait    idle\n", it.track_label);
  for (size_t w = 0; w < it.tracks->size(); ++w) {
    int64_t busy = 0, wait = 0;
    for (const TraceEvent& e : (*it.tracks)[w]) {
      busy += e.end_ns - e.start_ns;
      wait += e.start_ns - e.wait_ns;
      auto op = static_cast<size_t>(p.instrs[e.instr].opcode);
      per_op[op] += e.end_ns - e.start_ns;
      per_op_n[op]++;
    }
    double W = std::max<double>(1, static_cast<double>(wall));
    s += fmt::format("  {:>6} {:>6.1f}% {:>6.1f}% {:>6.1f}%\n", w, 100.0 * static_cast<double>(busy) / W,
                     100.0 * static_cast<double>(wait) / W, 100.0 * static_cast<double>(wall - busy - wait) / W);
  }
  s += "  opcode         count   total ms   us/instr\n";
  for (int o = 0; o < kNumOpcodes; ++o)
    if (per_op_n[static_cast<size_t>(o)])
      s += fmt::format("  {:<12} {:>7} {:>10.3f} {:>10.2f}\n", opcode_name(static_cast<Opcode>(o)), per_op_n[static_cast<size_t>(o)],
                       static_cast<double>(per_op[static_cast<size_t>(o)]) / 1e6,
                       static_cast<double>(per_op[static_cast<size_t>(o)]) / 1e3 / static_cast<double>(per_op_n[static_cast<size_t>(o)]));
  return s;
}

std::string write_trace(const TraceData& it, const std::string& path) {
  const Program& p = *it.program;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("{}: cannot open for writing", path);
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true, written = true;
  auto emit = [&](const std::string& ev) {
    out += first ? "" : ",\n";
    out += ev;
    first = false;
    if (out.size() > (1u << 20)) {
      written = written && std::fwrite(out.data(), 1, out.size(), f) == out.size();
      out.clear();
    }
  };
  emit(fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{{\"name\":\"{}\"}}}}", it.process));
  for (size_t w = 0; w < it.tracks->size(); ++w) {
    if ((*it.tracks)[w].empty() && it.track_label != "worker") continue;  // unused SMs
    emit(fmt::format("{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":\"{} {}\"}}}}", w,
                     it.track_label, w));
    for (const TraceEvent& e : (*it.tracks)[w]) {
      const Instr& in = p.instrs[e.instr];
      const OpDesc& o = p.ops[static_cast<size_t>(in.op)];
      if (e.start_ns > e.wait_ns)
        emit(fmt::format("{{\"name\":\"wait\",\"cat\":\"wait\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},"
                         "\"args\":{{\"instr\":{},\"step\":{}}}}}",
                         w, static_cast<double>(e.wait_ns) / 1e3, static_cast<double>(e.start_ns - e.wait_ns) / 1e3, e.instr, e.step));
      emit(fmt::format("{{\"name\":\"{}\",\"cat\":\"instr\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},"
                       "\"args\":{{\"instr\":{},\"opcode\":\"{}\",\"op\":\"{}\",\"layer\":{},\"tile\":{},\"cols\":\"{}:{}\",\"step\":{}}}}}",
                       opcode_name(in.opcode), w, static_cast<double>(e.start_ns) / 1e3,
                       static_cast<double>(e.end_ns - e.start_ns) / 1e3, e.instr, opcode_name(in.opcode), o.name, in.layer, in.tile, in.c0, in.c1, e.step));
    }
  }
  out += "\n]}\n";
  written = written && std::fwrite(out.data(), 1, out.size(), f) == out.size();
  written = std::fclose(f) == 0 && written;  // a full disk may show only at the flush
  if (!written) fail("{}: writing the trace failed ({})", path, std::strerror(errno));
  return trace_summary(it);
}

}  // namespace mk::cpu
