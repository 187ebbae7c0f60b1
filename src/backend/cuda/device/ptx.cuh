// ---- hardware wrappers ------------------------------------------------------------------------
// Every piece of inline PTX and every CUDA-only construct the templates use sits behind one of these
// names. `cuda-emu` compiles the same source for the host with MK_EMU defined; its header
// (emu_host.h) gives each name a host version (fibers for threads, std::atomic_ref for atomics,
// shadow stamps for the race check).
#ifndef MK_EMU
#define MK_DYNAMIC_SMEM(name) extern __shared__ __align__(16) char name[]
// memory access
// Activations (written inside this kernel by other blocks): L2 only. volatile keeps them after the
// barrier that follows the counter acquire.
__device__ __forceinline__ float mk_ld(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 mk_ld4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ int mk_ld_i32(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
// Weights (read-only for the whole kernel): non-coherent path, no L1 allocation (streamed once).
// MK_WEIGHT_EVICT_FIRST 1: the 16- and 8-byte weight loads also carry an L2 evict-first policy, so
// the weights streaming through L2 (GBs per token) are what L2 drops first, not the instruction tables,
// counters and activations.
#if MK_WEIGHT_EVICT_FIRST
__device__ __forceinline__ mk_u64 mk_wpolicy() {
  mk_u64 pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint4 mk_ldw16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(mk_wpolicy()));
  return v;
}
__device__ __forceinline__ uint2 mk_ldw8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(mk_wpolicy()));
  return v;
}
#else
__device__ __forceinline__ uint4 mk_ldw16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 mk_ldw8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
#endif
__device__ __forceinline__ mk_u32 mk_ldw32(const void* p) {
  mk_u32 v;
  asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned short mk_ldw16bit(const void* p) {
  unsigned short v;
  asm("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void mk_prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// 16 bytes of a table that never changes during the kernel (an instruction descriptor) copied to
// shared memory asynchronously (sm_80 cp.async); mk_cp_async_wait() in the same thread completes
// its copies, and a block barrier after it publishes them.
__device__ __forceinline__ void mk_cp_async16(void* smem_dst, const void* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void mk_cp_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// synchronisation
__device__ __forceinline__ mk_u32 mk_ld_acquire(const mk_u32* p) {
  mk_u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void mk_red_release(mk_u32* p, mk_u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ mk_u64 mk_globaltimer() {
  mk_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float mk_f16(unsigned short h) {
  float f;
  asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
  return f;
}
// Activations written by a tile (plain store; the block barrier and the release publish it).
__device__ __forceinline__ void mk_st(float* p, float v) { *p = v; }
__device__ __forceinline__ mk_u32 mk_smid() {
  mk_u32 r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
// Marks the start of instruction `idx` in this block (the emulator's race check; nothing on a GPU).
__device__ __forceinline__ void mk_begin_instr(int idx) {}
#endif  // !MK_EMU
