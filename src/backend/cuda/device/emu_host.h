// emu_host.h: the host versions of the device wrappers, for `--backend cuda-emu`.
//
// cuda-emu compiles the exact source the `cuda` backend hands to NVRTC (device/abi.cuh, ptx.cuh,
// prelude.cuh, the generated op functions, interpreter.cuh) with the host C++ compiler into a shared
// object, with this header around it:
//   MK_EMU_HEAD (before the source): CUDA keywords as host C++, float4/uint4, threadIdx & co., the
//     host version of every wrapper of ptx.cuh;
//   MK_EMU_TAIL (after it): mk_emu_run, the launcher the backend calls through dlsym.
//
// Execution model (what a cooperative launch guarantees, made literal):
//   - every block of the grid runs at once, each on its own OS thread (co-resident blocks);
//   - the threads of a block are fibers (Boost.Context) on that OS thread, switched only at
//     __syncthreads and __shfl_xor_sync, which are real rendezvous: a fiber that arrives waits until
//     every live thread of its block (or lane of its warp) has arrived;
//   - __shared__ variables are per OS thread (= per block); dynamic shared memory is one exactly
//     sized heap allocation per block (ASan sees overruns);
//   - atomics, ld.acquire and red.release are std::atomic_ref operations with those orders.
// Checks a GPU cannot give cheaply (enabled by the backend through MkEmuHooks):
//   - race check: every activation element carries a shadow stamp (writer instruction, epoch) and
//     its last reader; a read must see a write by an instruction that the reader's waits order before
//     it (in this step, or in an earlier step for the KV cache), a write must be ordered after the
//     element's last reader and writer of this step. The first violation is written to the error
//     record (kind 3 read, kind 4 write) and the launch is asked to stop.
//   - a thread block whose threads wait at different barriers (divergent __syncthreads) is reported
//     (kind 5) instead of hanging.
#if defined(MK_EMU_HEAD)
#define MK_EMU 1
#include <sched.h>

#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/fixedsize_stack.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MK_EMU_ASAN 1
#else
#define MK_EMU_ASAN 0
#endif

#define __device__
#define __global__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(n) alignas(n)

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct MkDim3 {
  unsigned x, y, z;
};

// Shared with the backend (src/backend/cuda/emu.cpp mirrors it).
struct MkEmuHooks {
  int race_check;               // 1: stamp and check every activation access
  unsigned epoch;               // the step being run
  unsigned n_instrs;
  unsigned hb_words;            // 64-bit words per row of hb
  const unsigned long long* hb;  // hb[r * hb_words + w / 64] bit w % 64: instruction w is ordered before r
  char* region_base[2];          // 0 = arena, 1 = KV cache
  unsigned long long region_elems[2];  // 4-byte elements
  unsigned long long* writer[2];  // per element: epoch << 32 | (instr + 1); 0 = never written; instr field ~0 = host
  unsigned long long* reader[2];  // per element: epoch << 32 | (instr + 1) of its last reader
  void* error;                   // MkError (host memory)
  volatile unsigned* abort_flag;
  unsigned long long spin_yield;  // yield the OS thread every this many counter polls
};

namespace mk_emu {

struct Lane {
  unsigned tid = 0;
  boost::context::fiber fiber;  // the lane, while suspended
  boost::context::fiber back;   // the scheduler, while the lane runs
  const unsigned long long* wait_gen = nullptr;  // resumable once *wait_gen != wait_value
  unsigned long long wait_value = 0;
  bool done = false;
#if MK_EMU_ASAN
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
  void* fake_stack = nullptr;
#endif
};
struct Warp {
  unsigned arrived = 0;
  unsigned long long gen = 0;
  alignas(8) unsigned char slots[2][32][8];
};
struct Block {
  unsigned idx = 0, grid = 0, threads = 0, live = 0;
  char* smem = nullptr;
  unsigned bar_arrived = 0;
  unsigned long long bar_gen = 0;
  std::vector<Warp> warps;
  std::vector<Lane> lanes;
  int instr = -1;  // the instruction this block runs (mk_begin_instr)
  unsigned long long polls = 0;
  boost::context::fiber sched;  // the block's OS thread, while a lane runs
  int from = -1;                // the lane that switched last (-1: the scheduler)
#if MK_EMU_ASAN
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
#endif
};

// initial-exec: plain %fs-relative loads (the general-dynamic model of a dlopen'ed object calls
// __tls_get_addr on every threadIdx); 16 bytes fit glibc's static TLS surplus.
inline thread_local Block* tls_block __attribute__((tls_model("initial-exec"))) = nullptr;
inline thread_local Lane* tls_lane __attribute__((tls_model("initial-exec"))) = nullptr;
inline MkEmuHooks* hooks = nullptr;  // set by mk_emu_run for the launch

inline MkDim3 thread_idx() { return MkDim3{tls_lane->tid, 0u, 0u}; }
inline MkDim3 block_idx() { return MkDim3{tls_block->idx, 0u, 0u}; }
inline MkDim3 grid_dim() { return MkDim3{tls_block->grid, 1u, 1u}; }

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "cuda-emu: %s\n", what);
  std::abort();
}

inline bool runnable(const Lane& l) { return !l.done && !(l.wait_gen && *l.wait_gen == l.wait_value); }

// Stores the continuation of whoever switched to the running lane (another lane, or the scheduler).
inline void arrived(Block* b, boost::context::fiber&& from) {
  if (b->from < 0) b->sched = std::move(from);
  else b->lanes[static_cast<unsigned>(b->from)].fiber = std::move(from);
}

// Passes the OS thread from the running lane `me` to the next runnable lane of the block (in thread
// order after it), or back to the scheduler when none can run (all done, or a divergent barrier).
// Returns when some lane switches back to `me`.
inline void switch_from(Lane* me) {
  Block* b = tls_block;
  const unsigned n = b->threads;
  Lane* next = nullptr;
  for (unsigned k = 1; k <= n; ++k) {
    Lane& l = b->lanes[(me->tid + k) % n];
    if (&l != me && runnable(l)) {
      next = &l;
      break;
    }
  }
  b->from = static_cast<int>(me->tid);
  tls_lane = next;
#if MK_EMU_ASAN
  __sanitizer_start_switch_fiber(&me->fake_stack, next ? next->stack_bottom : b->sched_bottom, next ? next->stack_size : b->sched_size);
#endif
  boost::context::fiber f = next ? std::move(next->fiber).resume() : std::move(b->sched).resume();
#if MK_EMU_ASAN
  __sanitizer_finish_switch_fiber(me->fake_stack, nullptr, nullptr);
#endif
  tls_lane = me;
  arrived(b, std::move(f));
}

// Suspends the running lane until *gen differs from `value`.
inline void suspend_until_changed(const unsigned long long* gen, unsigned long long value) {
  Lane* l = tls_lane;
  l->wait_gen = gen;
  l->wait_value = value;
  switch_from(l);
  l->wait_gen = nullptr;
}

inline void syncthreads() {
  Block* b = tls_block;
  const unsigned long long gen = b->bar_gen;
  if (++b->bar_arrived >= b->live) {
    b->bar_arrived = 0;
    ++b->bar_gen;
    return;
  }
  suspend_until_changed(&b->bar_gen, gen);
}

template <class T>
inline T shfl_xor(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
  if (mask != 0xffffffffu) die("__shfl_xor_sync with a partial mask is not emulated");
  Lane* l = tls_lane;
  Warp& w = tls_block->warps[l->tid >> 5];
  const unsigned lane = l->tid & 31u;
  const unsigned long long gen = w.gen;
  const int buf = static_cast<int>(gen & 1u);
  std::memcpy(w.slots[buf][lane], &v, sizeof(T));
  if (++w.arrived == 32u) {
    w.arrived = 0;
    ++w.gen;
  } else {
    suspend_until_changed(&w.gen, gen);
  }
  T r;
  std::memcpy(&r, w.slots[buf][lane ^ (static_cast<unsigned>(lane_mask) & 31u)], sizeof(T));
  return r;
}

// __syncwarp: a rendezvous of the 32 lanes of the running lane's warp.
inline void syncwarp() {
  Lane* l = tls_lane;
  Warp& w = tls_block->warps[l->tid >> 5];
  const unsigned long long gen = w.gen;
  if (++w.arrived == 32u) {
    w.arrived = 0;
    ++w.gen;
  } else {
    suspend_until_changed(&w.gen, gen);
  }
}

template <class T>
inline T atomic_add(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_acq_rel);
}
template <class T>
inline T atomic_cas(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired, std::memory_order_acq_rel);
  return expected;
}

// ---- race check ------------------------------------------------------------------------------------
constexpr unsigned kHostInstr = 0xffffffffu;
inline unsigned long long stamp(unsigned epoch, unsigned instr_plus_1) {
  return (static_cast<unsigned long long>(epoch) << 32) | instr_plus_1;
}
inline bool ordered_before(int w, int r) {  // w happens before r through the waits
  const MkEmuHooks* h = hooks;
  if (w < 0 || r < 0 || static_cast<unsigned>(w) >= h->n_instrs || static_cast<unsigned>(r) >= h->n_instrs) return false;
  return (h->hb[static_cast<unsigned long long>(r) * h->hb_words + static_cast<unsigned>(w) / 64u] >> (static_cast<unsigned>(w) % 64u)) & 1u;
}
struct EmuErrorRecord {  // the layout of MkError (abi.cuh)
  unsigned flag;
  int kind, instr, counter;
  unsigned value, target;
  int block;
  unsigned epoch;
};
// kind 3: instr read element `elem` of region `region` last written by `other` (epoch other_epoch);
// kind 4: instr wrote it while `other` (its last reader or writer in this step) is not ordered before.
inline void report_race(int kind, int instr, int other, unsigned long long elem, int region, unsigned other_epoch) {
  MkEmuHooks* h = hooks;
  if (std::atomic_ref<unsigned>(*const_cast<unsigned*>(h->abort_flag)).exchange(1u) != 0u) return;
  auto* e = static_cast<EmuErrorRecord*>(h->error);
  e->kind = kind;
  e->instr = instr;
  e->counter = other;
  e->value = static_cast<unsigned>(elem);
  e->target = other_epoch;
  e->block = static_cast<int>(tls_block->idx) | (region << 30);
  e->epoch = h->epoch;
  std::atomic_ref<unsigned>(e->flag).store(1u, std::memory_order_release);
}
inline bool locate(const void* p, int* region, unsigned long long* elem) {
  const MkEmuHooks* h = hooks;
  for (int r = 0; r < 2; ++r) {
    const char* base = h->region_base[r];
    if (!base) continue;
    const char* c = static_cast<const char*>(p);
    if (c >= base && c < base + h->region_elems[r] * 4) {
      *region = r;
      *elem = static_cast<unsigned long long>(c - base) / 4u;
      return true;
    }
  }
  return false;
}
inline void check_read(const void* p, int n) {
  const MkEmuHooks* h = hooks;
  if (!h || !h->race_check) return;
  int region;
  unsigned long long e0;
  if (!locate(p, &region, &e0)) return;
  const int me = tls_block->instr;
  for (int k = 0; k < n && e0 + k < h->region_elems[region]; ++k) {
    const unsigned long long e = e0 + static_cast<unsigned>(k);
    const unsigned long long s = std::atomic_ref<unsigned long long>(h->writer[region][e]).load(std::memory_order_relaxed);
    std::atomic_ref<unsigned long long>(h->reader[region][e]).store(stamp(h->epoch, static_cast<unsigned>(me + 1)), std::memory_order_relaxed);
    const unsigned w1 = static_cast<unsigned>(s), ew = static_cast<unsigned>(s >> 32);
    if (w1 == kHostInstr) continue;
    const int w = static_cast<int>(w1) - 1;
    bool ok;
    if (s == 0) ok = false;
    else if (ew == h->epoch) ok = w == me || ordered_before(w, me);
    else ok = ew < h->epoch && region == 1;  // the KV cache keeps earlier steps' rows
    if (!ok) {
      report_race(3, me, w, e, region, ew);
      return;
    }
  }
}
inline void check_write(const void* p) {
  const MkEmuHooks* h = hooks;
  if (!h || !h->race_check) return;
  int region;
  unsigned long long e;
  if (!locate(p, &region, &e)) return;
  const int me = tls_block->instr;
  const unsigned long long r = std::atomic_ref<unsigned long long>(h->reader[region][e]).load(std::memory_order_relaxed);
  const unsigned long long w = std::atomic_ref<unsigned long long>(h->writer[region][e]).load(std::memory_order_relaxed);
  for (unsigned long long s : {r, w}) {
    if (s == 0 || static_cast<unsigned>(s >> 32) != h->epoch || static_cast<unsigned>(s) == kHostInstr) continue;
    const int other = static_cast<int>(static_cast<unsigned>(s)) - 1;
    if (other != me && !ordered_before(other, me)) {
      report_race(4, me, other, e, region, h->epoch);
      return;
    }
  }
  std::atomic_ref<unsigned long long>(h->writer[region][e]).store(stamp(h->epoch, static_cast<unsigned>(me + 1)), std::memory_order_relaxed);
}

}  // namespace mk_emu

using std::isfinite;  // CUDA's math functions (the argmax op)
using std::isnan;
#define threadIdx (mk_emu::thread_idx())
#define blockIdx (mk_emu::block_idx())
#define gridDim (mk_emu::grid_dim())
#define __syncthreads() mk_emu::syncthreads()
#define __shfl_xor_sync(mask, v, o) mk_emu::shfl_xor((mask), (v), (o))
#define __syncwarp(...) mk_emu::syncwarp()
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
#define __threadfence_system() std::atomic_thread_fence(std::memory_order_seq_cst)
#define atomicAdd(p, v) mk_emu::atomic_add((p), (v))
#define atomicCAS(p, e, d) mk_emu::atomic_cas((p), (e), (d))
#define MK_DYNAMIC_SMEM(name) char* name = mk_emu::tls_block->smem

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// ---- the wrappers of ptx.cuh ------------------------------------------------------------------------
typedef unsigned int mk_u32;
typedef unsigned long long mk_u64;
inline float mk_ld(const float* p) {
  mk_emu::check_read(p, 1);
  return std::atomic_ref<float>(*const_cast<float*>(p)).load(std::memory_order_relaxed);
}
inline float4 mk_ld4(const float* p) {
  mk_emu::check_read(p, 4);
  float4 v;
  float* q = const_cast<float*>(p);
  v.x = std::atomic_ref<float>(q[0]).load(std::memory_order_relaxed);
  v.y = std::atomic_ref<float>(q[1]).load(std::memory_order_relaxed);
  v.z = std::atomic_ref<float>(q[2]).load(std::memory_order_relaxed);
  v.w = std::atomic_ref<float>(q[3]).load(std::memory_order_relaxed);
  return v;
}
inline int mk_ld_i32(const int* p) {
  mk_emu::check_read(p, 1);
  return std::atomic_ref<int>(*const_cast<int*>(p)).load(std::memory_order_relaxed);
}
inline void mk_st(float* p, float v) {
  mk_emu::check_write(p);
  std::atomic_ref<float>(*p).store(v, std::memory_order_relaxed);
}
// A GPU faults on a vector load from an address that is not a multiple of its size: so does the
// emulator (weight loads; the ones that matter for the vector widths codegen picks).
inline void mk_emu_check_align(const void* p, unsigned bytes) {
  if (reinterpret_cast<unsigned long long>(p) % bytes != 0) {
    std::fprintf(stderr, "cuda-emu: misaligned %u-byte weight load at %p\n", bytes, p);
    std::abort();
  }
}
inline uint4 mk_ldw16(const void* p) {
  mk_emu_check_align(p, 16);
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
}
inline uint2 mk_ldw8(const void* p) {
  mk_emu_check_align(p, 8);
  uint2 v;
  std::memcpy(&v, p, 8);
  return v;
}
inline mk_u32 mk_ldw32(const void* p) {
  mk_emu_check_align(p, 4);
  mk_u32 v;
  std::memcpy(&v, p, 4);
  return v;
}
inline unsigned short mk_ldw16bit(const void* p) {
  unsigned short v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void mk_prefetch_l2(const void*) {}
inline void mk_cp_async16(void* smem_dst, const void* src) { std::memcpy(smem_dst, src, 16); }  // completes at once
inline void mk_cp_async_wait() {}
inline mk_u32 mk_ld_acquire(const mk_u32* p) {
  const mk_u32 v = std::atomic_ref<mk_u32>(*const_cast<mk_u32*>(p)).load(std::memory_order_acquire);
  // Spinning waits share the host's cores with the blocks they wait for: let them run.
  if (mk_emu::hooks && ++mk_emu::tls_block->polls % mk_emu::hooks->spin_yield == 0) sched_yield();
  return v;
}
inline void mk_red_release(mk_u32* p, mk_u32 v) { std::atomic_ref<mk_u32>(*p).fetch_add(v, std::memory_order_release); }
inline mk_u64 mk_globaltimer() {
  return static_cast<mk_u64>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
inline float mk_f16(unsigned short h) {  // IEEE binary16 -> float, exact
  const unsigned sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) f = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) f = man ? NAN : INFINITY;
  else f = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -f : f;
}
inline mk_u32 mk_smid() { return mk_emu::tls_block->idx; }
inline void mk_begin_instr(int idx) { mk_emu::tls_block->instr = idx; }
#endif  // MK_EMU_HEAD

#if defined(MK_EMU_TAIL)
// The launch: every block on its own OS thread, its threads as fibers.
struct MkEmuLaunch {
  void (*megakernel)(const MkParams);     // one of the two
  void (*perop)(const MkParams, int);
  int first;
  const MkParams* params;
  unsigned grid, threads;
  unsigned long long smem_bytes, stack_bytes;
  MkEmuHooks* hooks;
};

namespace mk_emu {
// Fiber stacks, kept for the next launch (a step creates grid x threads fibers), and telling
// their lane where they lie (ASan's fiber-switch annotations need the bounds).
struct StackPool {
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> free;
  ~StackPool() {
    for (auto& s : free) std::free(s.first);
  }
};
inline StackPool stack_pool;
struct RecordingStack {
  Lane* lane;
  size_t bytes;
  boost::context::stack_context allocate() {
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(stack_pool.mu);
      for (size_t i = 0; i < stack_pool.free.size(); ++i)
        if (stack_pool.free[i].second == bytes) {
          p = stack_pool.free[i].first;
          stack_pool.free[i] = stack_pool.free.back();
          stack_pool.free.pop_back();
          break;
        }
    }
    if (!p) p = std::malloc(bytes);
    if (!p) die("out of memory for fiber stacks");
    boost::context::stack_context sc;
    sc.size = bytes;
    sc.sp = static_cast<char*>(p) + bytes;
#if MK_EMU_ASAN
    lane->stack_bottom = p;
    lane->stack_size = bytes;
#endif
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) noexcept {
    void* p = static_cast<char*>(sc.sp) - sc.size;
    std::lock_guard<std::mutex> lock(stack_pool.mu);
    stack_pool.free.emplace_back(p, sc.size);
  }
};
inline void run_block(const MkEmuLaunch& L, unsigned idx) {
  Block b;
  b.idx = idx;
  b.grid = L.grid;
  b.threads = L.threads;
  b.live = L.threads;
  b.warps.resize((L.threads + 31u) / 32u);
  b.lanes.resize(L.threads);
  char* smem = static_cast<char*>(std::aligned_alloc(16, (L.smem_bytes + 15u) / 16u * 16u + 16u));
  std::memset(smem, 0, (L.smem_bytes + 15u) / 16u * 16u);
  b.smem = smem;
  tls_block = &b;
  for (unsigned t = 0; t < L.threads; ++t) {
    Lane& l = b.lanes[t];
    l.tid = t;
    l.fiber = boost::context::fiber(std::allocator_arg, RecordingStack{&l, L.stack_bytes},
                                    [&L, &l, &b](boost::context::fiber&& from) {
#if MK_EMU_ASAN
                                      __sanitizer_finish_switch_fiber(nullptr, &b.sched_bottom, &b.sched_size);
#endif
                                      tls_lane = &l;
                                      arrived(&b, std::move(from));
                                      if (L.megakernel) L.megakernel(*L.params);
                                      else L.perop(*L.params, L.first);
                                      l.done = true;
                                      if (--b.live && b.bar_arrived >= b.live) {  // the others wait at a barrier this thread will not reach
                                        b.bar_arrived = 0;
                                        ++b.bar_gen;
                                      }
                                      // Hand over to the next runnable lane, or to the scheduler.
                                      Lane* next = nullptr;
                                      for (unsigned k = 1; k <= b.threads; ++k) {
                                        Lane& o = b.lanes[(l.tid + k) % b.threads];
                                        if (runnable(o)) {
                                          next = &o;
                                          break;
                                        }
                                      }
                                      b.from = static_cast<int>(l.tid);
                                      tls_lane = next;
#if MK_EMU_ASAN
                                      __sanitizer_start_switch_fiber(nullptr, next ? next->stack_bottom : b.sched_bottom,
                                                                     next ? next->stack_size : b.sched_size);
#endif
                                      return next ? std::move(next->fiber) : std::move(b.sched);
                                    });
  }
  // The scheduler: start lane 0; the lanes pass the thread among themselves and come back here only
  // when none can run. Then either all are done, or they wait at barriers that cannot complete.
  for (;;) {
    Lane* first = nullptr;
    for (Lane& l : b.lanes)
      if (runnable(l)) {
        first = &l;
        break;
      }
    if (!first) break;
    b.from = -1;
    tls_lane = first;
#if MK_EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, first->stack_bottom, first->stack_size);
#endif
    boost::context::fiber f = std::move(first->fiber).resume();
#if MK_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    if (b.from >= 0) b.lanes[static_cast<unsigned>(b.from)].fiber = std::move(f);
  }
  for (const Lane& l : b.lanes)
    if (!l.done) die("threads of one block wait at different barriers (divergent __syncthreads or shuffle)");
  tls_lane = nullptr;
  tls_block = nullptr;
  std::free(smem);
}
}  // namespace mk_emu

extern "C" __attribute__((visibility("default"))) void mk_emu_run(const MkEmuLaunch* L) {
  mk_emu::hooks = L->hooks;
  if (L->grid == 1) {
    mk_emu::run_block(*L, 0);
  } else {
    std::vector<std::thread> blocks;
    blocks.reserve(L->grid);
    for (unsigned b = 0; b < L->grid; ++b) blocks.emplace_back([L, b] { mk_emu::run_block(*L, b); });
    for (std::thread& t : blocks) t.join();
  }
  mk_emu::hooks = nullptr;
}
#endif  // MK_EMU_TAIL
