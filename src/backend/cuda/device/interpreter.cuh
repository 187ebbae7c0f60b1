// ---- the persistent interpreter ------------------------------------------------------------------
// Deadlock freedom: every block of the grid is co-resident (cooperative launch); instructions are
// taken in one global topological order (queue) or per-block lists that follow it, so the earliest
// unfinished taken instruction always has its inputs done.
// Tracing (MK_TRACE 1): thread 0 records (instruction, SM, wait start, start, end) per instruction
// with %globaltimer into the block's slice of p.trace (MK_NUM_INSTRS records per block after a
// header of per-block counts); the host turns them into a Chrome trace with one track per SM.
struct MkTraceRec {
  int instr;
  mk_u32 smid;
  mk_u64 wait_ns, start_ns, end_ns;
};
static_assert(sizeof(MkTraceRec) == 32, "MkTraceRec ABI");
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1) mk_megakernel(const MkParams p) {
  MK_DYNAMIC_SMEM(mk_smem);
  __shared__ int s_next, s_ok;
  // Dynamic queue: every block makes exactly one failing claim per step, so step e's claims start
  // at (e - 1) * (MK_NUM_INSTRS + gridDim.x) and the counter is never reset.
  const mk_u64 base = (mk_u64)(p.epoch - 1u) * (mk_u64)(MK_NUM_INSTRS + gridDim.x);
  int pos = 0, end = 0, cur = MK_NUM_INSTRS;
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
    if (threadIdx.x == 0) {
      const mk_u64 v = atomicAdd(p.queue, 1ull) - base;
      s_next = v < (mk_u64)MK_NUM_INSTRS ? (int)v : MK_NUM_INSTRS;
    }
    __syncthreads();
    cur = s_next;
    __syncthreads();
  }
  while (cur < MK_NUM_INSTRS) {
    const MkInstr in = p.instrs[cur];
    const MkOpArgs& a = p.ops[in.op];
    mk_prefetch(in, a);  // weights are always ready: start pulling them into L2 now
    if (threadIdx.x < 32) {
      // Thread 0 claims the next instruction (one atomic per block), then warp 0 waits on this one's
      // counters in parallel (mk_wait: lane l takes waits l, l+32, ...). Lane k's acquire of a
      // counter, then the block barrier below, order the producers' writes before every thread's
      // reads of the data (the argument is next to mk_wait).
      if (threadIdx.x == 0) {
#if MK_TRACE
        t_wait = mk_globaltimer();
#endif
        int next;
        if (MK_STATIC) {
          next = pos + 1 < end ? p.list_items[pos + 1] : MK_NUM_INSTRS;
        } else {
          const mk_u64 v = atomicAdd(p.queue, 1ull) - base;  // claim the next while this one waits and runs
          next = v < (mk_u64)MK_NUM_INSTRS ? (int)v : MK_NUM_INSTRS;
        }
        s_next = next;
      }
      const bool ok = mk_wait(p, in, cur);  // the same in every lane
      if (threadIdx.x == 0) {
        s_ok = ok ? 1 : 0;
#if MK_TRACE
        t_start = mk_globaltimer();
#endif
      }
    }
    __syncthreads();
    if (!s_ok) return;
    const int next = s_next;
    mk_begin_instr(cur);
    mk_dispatch(in, a, p.sym, mk_smem, p, cur);
    __syncthreads();
    if (threadIdx.x == 0) {
#if MK_TRACE
      MkTraceRec r;
      r.instr = cur;
      r.smid = mk_smid();
      r.wait_ns = t_wait;
      r.start_ns = t_start;
      r.end_ns = mk_globaltimer();
      trace_rec[n_rec++] = r;
#endif
      // The block barrier above orders every thread's writes before thread 0's release, which is
      // cumulative at gpu scope: no separate fence (the pattern of CUTLASS's generic barrier).
      if (in.signal >= 0) mk_red_release(p.counters + in.signal, 1u);
    }
    cur = next;
    ++pos;
  }
#if MK_TRACE
  if (threadIdx.x == 0) trace_count[blockIdx.x] = n_rec;
#endif
}

