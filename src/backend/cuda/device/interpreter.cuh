// ---- the persistent interpreter ------------------------------------------------------------------
// Deadlock freedom: every block of the grid is co-resident (cooperative launch); instructions are
// taken in one global topological order (queue) or per-block lists that follow it, so the earliest
// unfinished taken instruction always has its inputs done.
// Tracing (MK_TRACE 1): the control warp's lane 0 records (instruction, SM, wait start, start, end) per instruction
// with %globaltimer into the block's slice of p.trace (MK_NUM_INSTRS records per block after a
// header of per-block counts); the host turns them into a Chrome trace with one track per SM.
struct MkTraceRec {
  int instr;
  mk_u32 smid;
  mk_u64 wait_ns, start_ns, end_ns;
};
static_assert(sizeof(MkTraceRec) == 32, "MkTraceRec ABI");
// MK_PRELOAD 1 (the default): the control warp (the last one) claims the next instruction and
// copies its descriptor into shared memory (cp.async) while this one runs, so the top of
// the loop reads it from shared memory instead of a global round trip; and thread 0 (warp 0) releases, so the
// release's wait for the block's writes does not delay the next claim and wait. MK_PRELOAD 0: warp 0
// does all of it and each instruction's descriptor is loaded at the top (the first GPU run's loop).
#ifndef MK_PRELOAD
#define MK_PRELOAD 1
#endif
// Dynamic queue, MK_CLAIM_AHEAD 0 (the default): a block claims its next instruction when its
// current one's wait is over, so a block never holds a second instruction while it waits. With
// MK_CLAIM_AHEAD 1 (the first GPU run's loop) the claim came before the wait: blocks waiting for a
// slow op took the next op's tiles two at a time (one running, one claimed), while blocks that freed
// up later found none left: on the H200 trace of 2026-12-04 (1B, 1 tile per block per op) a third of
// the blocks ran two tiles of each matmul one after the other (bench/trace_sim.py replays the trace:
// ~2.3 ms under claim-ahead as measured, ~1.5 ms under claim-after-wait).
#ifndef MK_CLAIM_AHEAD
#define MK_CLAIM_AHEAD 0
#endif
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1) mk_megakernel(const MkParams p) {
  MK_DYNAMIC_SMEM(mk_smem);
  __shared__ int s_next, s_ok;
  __align__(16) __shared__ MkInstr s_in[2];  // MK_PRELOAD: this instruction's descriptor and the next's
  constexpr int kCtl = MK_PRELOAD ? MK_WARPS - 1 : 0;  // the control warp
  const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
  // Dynamic queue: every block makes exactly one failing claim per step, so step e's claims start
  // at (e - 1) * (MK_NUM_INSTRS + gridDim.x) and the counter is never reset.
  const mk_u64 base = (mk_u64)(p.epoch - 1u) * (mk_u64)(MK_NUM_INSTRS + gridDim.x);
  int pos = 0, end = 0, cur = MK_NUM_INSTRS, buf = 0;
#if MK_TRACE
  mk_u32* trace_count = (mk_u32*)p.trace;
  MkTraceRec* trace_rec = (MkTraceRec*)(p.trace + ((gridDim.x * 4u + 255u) & ~255u)) + (mk_u64)blockIdx.x * MK_NUM_INSTRS;
  mk_u32 n_rec = 0;
  mk_u64 t_wait = 0, t_start = 0;
#endif
  if (MK_STATIC) {
    pos = p.list_offsets[blockIdx.x];
    end = p.list_offsets[blockIdx.x + 1];
    cur = pos < end ? p.list_items[pos] : MK_NUM_INSTRS;
  } else {
    if (warp == kCtl && lane == 0) {
      const mk_u64 v = atomicAdd(p.queue, 1ull) - base;
      s_next = v < (mk_u64)MK_NUM_INSTRS ? (int)v : MK_NUM_INSTRS;
    }
    __syncthreads();
    cur = s_next;
    __syncthreads();
  }
  if (MK_PRELOAD) {
    if (warp == kCtl && lane == 0 && cur < MK_NUM_INSTRS) {
      mk_cp_async16(&s_in[0], p.instrs + cur);
      mk_cp_async16((char*)&s_in[0] + 16, (const char*)(p.instrs + cur) + 16);
      mk_cp_async_wait();
    }
    __syncthreads();
  }
  while (cur < MK_NUM_INSTRS) {
    const MkInstr in = MK_PRELOAD ? s_in[buf] : p.instrs[cur];
    const MkOpArgs& a = p.ops[in.op];
    mk_prefetch(in, a);  // weights are always ready: start pulling them into L2 now
    if (warp == kCtl) {
      // Lane 0 claims the next instruction (one atomic per block), then the warp waits on this one's
      // counters in parallel (mk_wait: lane l takes waits l, l+32, ...). Lane k's acquire of a
      // counter, then the block barrier below, order the producers' writes before every thread's
      // reads of the data (the argument is next to mk_wait).
      mk_u64 claimed = 0;
      int next = MK_NUM_INSTRS;
      if (lane == 0) {
#if MK_TRACE
        t_wait = mk_globaltimer();
#endif
        if (MK_STATIC) next = pos + 1 < end ? p.list_items[pos + 1] : MK_NUM_INSTRS;
        else if (MK_CLAIM_AHEAD) claimed = atomicAdd(p.queue, 1ull);  // used after the wait: the round trips overlap
      }
      const bool ok = mk_wait(p, in, cur);  // the same in every lane
      if (lane == 0) {
        // Also after a failed wait: every block makes exactly one failing claim per step.
        if (!MK_STATIC && !MK_CLAIM_AHEAD) claimed = atomicAdd(p.queue, 1ull);
        if (!MK_STATIC) {
          const mk_u64 v = claimed - base;
          next = v < (mk_u64)MK_NUM_INSTRS ? (int)v : MK_NUM_INSTRS;
        }
        s_next = next;
        s_ok = ok ? 1 : 0;
#if MK_TRACE
        t_start = mk_globaltimer();
#endif
        // s_in[buf ^ 1] held the previous instruction, which every thread read before the barriers
        // since; mk_cp_async_wait after this one's dispatch completes the copy.
        if (MK_PRELOAD && ok && next < MK_NUM_INSTRS) {
          mk_cp_async16(&s_in[buf ^ 1], p.instrs + next);
          mk_cp_async16((char*)&s_in[buf ^ 1] + 16, (const char*)(p.instrs + next) + 16);
        }
      }
    }
    __syncthreads();
    if (!s_ok) return;
    const int next = s_next;
    mk_begin_instr(cur);
    mk_dispatch(in, a, p.sym, mk_smem, p, cur);
    if (MK_PRELOAD && warp == kCtl && lane == 0) mk_cp_async_wait();  // the next descriptor is in s_in[buf ^ 1]
    __syncthreads();
#if MK_TRACE
    // The control warp's lane 0 takes every timestamp of the record (wait start, start, end), so a
    // block's records never overlap: the next wait starts after this end in the same thread.
    if (warp == kCtl && lane == 0) {
      MkTraceRec r;
      r.instr = cur;
      r.smid = mk_smid();
      r.wait_ns = t_wait;
      r.start_ns = t_start;
      r.end_ns = mk_globaltimer();
      trace_rec[n_rec++] = r;
    }
#endif
    if (threadIdx.x == 0) {
      // The block barrier above orders every thread's writes before thread 0's release, which is
      // cumulative at gpu scope: no separate fence (the pattern of CUTLASS's generic barrier).
      if (in.signal >= 0) mk_red_release(p.counters + in.signal, 1u);
    }
    cur = next;
    buf ^= 1;
    ++pos;
  }
#if MK_TRACE
  if (warp == kCtl && lane == 0) trace_count[blockIdx.x] = n_rec;
#endif
}
