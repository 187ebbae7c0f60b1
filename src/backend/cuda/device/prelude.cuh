// ---- prelude.cuh: helpers and one template per opcode ------------------------------------------
// Memory rules (see docs/cuda.md):
//   - weights never change during a kernel: 16-byte ld.global.nc.L1::no_allocate loads (mk_ldw*);
//   - activations and KV rows are written by other blocks of the same kernel: ld.global.cg (L2,
//     never a stale L1 line; mk_ld*), after warp 0's ld.acquire.gpu of the counters and a block
//     barrier; tiles store them with mk_st;
//   - a producer's block barrier, then thread 0's red.release.gpu (cumulative) publishes its writes.
// Wrap-safe "a 32-bit counter that only grows has reached target".
__device__ __forceinline__ bool mk_reached(mk_u32 value, mk_u32 target) { return (int)(value - target) >= 0; }

// Records the first error of the launch and asks every block to stop.
__device__ void mk_report(const MkParams& p, int kind, int instr, int a, mk_u32 b, mk_u32 c) {
  // The CAS is on device memory (atomics on host-mapped memory are not portable); the winner fills
  // the host-mapped record and sets its flag last.
  if (atomicCAS((mk_u32*)p.abort_flag, 0u, 1u) == 0u) {
    p.error->kind = kind;
    p.error->instr = instr;
    p.error->counter = a;
    p.error->value = b;
    p.error->target = c;
    p.error->block = (int)blockIdx.x;
    p.error->epoch = p.epoch;
    __threadfence_system();
    *(volatile mk_u32*)&p.error->flag = 1u;
    __threadfence_system();
  }
}

// ---- element types of weights ------------------------------------------------------------------
__device__ __forceinline__ float mk_bf16(mk_u32 bits16) { return __uint_as_float(bits16 << 16); }
// load8: elements [i, i+8) of a row starting at `row` (16-byte aligned when the row is); load1: one;
// loadv<N>: N elements with one vector load (rows of K % 8 != 0 elements: mk_matmul_cols).
struct MkF32 {
  static constexpr int kBytes = 4;
  static constexpr bool kQuant = false;
  __device__ static __forceinline__ void load8(const void* row, int i, float* o) {
    const char* p = (const char*)row + (mk_i64)i * 4;
    uint4 a = mk_ldw16(p), b = mk_ldw16(p + 16);
    o[0] = __uint_as_float(a.x); o[1] = __uint_as_float(a.y); o[2] = __uint_as_float(a.z); o[3] = __uint_as_float(a.w);
    o[4] = __uint_as_float(b.x); o[5] = __uint_as_float(b.y); o[6] = __uint_as_float(b.z); o[7] = __uint_as_float(b.w);
  }
  __device__ static __forceinline__ float load1(const void* row, mk_i64 i) {
    return __uint_as_float(mk_ldw32((const char*)row + i * 4));
  }
  // loadv<N>: elements [i, i+N) with one N * 4-byte load (N = 4 or 2; rows K % N == 0 elements).
  template <int N>
  __device__ static __forceinline__ void loadv(const void* row, int i, float* o) {
    const char* p = (const char*)row + (mk_i64)i * 4;
    if constexpr (N == 4) {
      const uint4 a = mk_ldw16(p);
      o[0] = __uint_as_float(a.x); o[1] = __uint_as_float(a.y); o[2] = __uint_as_float(a.z); o[3] = __uint_as_float(a.w);
    } else {
      static_assert(N == 2, "f32 vector loads are 4 or 2 elements");
      const uint2 a = mk_ldw8(p);
      o[0] = __uint_as_float(a.x); o[1] = __uint_as_float(a.y);
    }
  }
};
struct MkBF16 {
  static constexpr int kBytes = 2;
  static constexpr bool kQuant = false;
  __device__ static __forceinline__ void load8(const void* row, int i, float* o) {
    uint4 a = mk_ldw16((const char*)row + (mk_i64)i * 2);
    o[0] = __uint_as_float(a.x << 16); o[1] = __uint_as_float(a.x & 0xffff0000u);
    o[2] = __uint_as_float(a.y << 16); o[3] = __uint_as_float(a.y & 0xffff0000u);
    o[4] = __uint_as_float(a.z << 16); o[5] = __uint_as_float(a.z & 0xffff0000u);
    o[6] = __uint_as_float(a.w << 16); o[7] = __uint_as_float(a.w & 0xffff0000u);
  }
  __device__ static __forceinline__ float load1(const void* row, mk_i64 i) {
    return mk_bf16(mk_ldw16bit((const char*)row + i * 2));
  }
  template <int N>  // N = 4 (8 bytes) or 2 (4 bytes)
  __device__ static __forceinline__ void loadv(const void* row, int i, float* o) {
    const char* p = (const char*)row + (mk_i64)i * 2;
    if constexpr (N == 4) {
      const uint2 a = mk_ldw8(p);
      o[0] = __uint_as_float(a.x << 16); o[1] = __uint_as_float(a.x & 0xffff0000u);
      o[2] = __uint_as_float(a.y << 16); o[3] = __uint_as_float(a.y & 0xffff0000u);
    } else {
      static_assert(N == 2, "bf16 vector loads are 4 or 2 elements");
      const mk_u32 a = mk_ldw32(p);
      o[0] = __uint_as_float(a << 16); o[1] = __uint_as_float(a & 0xffff0000u);
    }
  }
};
struct MkF16 {
  static constexpr int kBytes = 2;
  static constexpr bool kQuant = false;
  __device__ static __forceinline__ void load8(const void* row, int i, float* o) {
    uint4 a = mk_ldw16((const char*)row + (mk_i64)i * 2);
    mk_u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      o[2 * e] = mk_f16((unsigned short)(v[e] & 0xffffu));
      o[2 * e + 1] = mk_f16((unsigned short)(v[e] >> 16));
    }
  }
  __device__ static __forceinline__ float load1(const void* row, mk_i64 i) {
    return mk_f16(mk_ldw16bit((const char*)row + i * 2));
  }
  template <int N>  // N = 4 (8 bytes) or 2 (4 bytes)
  __device__ static __forceinline__ void loadv(const void* row, int i, float* o) {
    const char* p = (const char*)row + (mk_i64)i * 2;
    mk_u32 v[2];
    if constexpr (N == 4) {
      const uint2 a = mk_ldw8(p);
      v[0] = a.x;
      v[1] = a.y;
    } else {
      static_assert(N == 2, "f16 vector loads are 4 or 2 elements");
      v[0] = mk_ldw32(p);
    }
#pragma unroll
    for (int e = 0; e < N / 2; ++e) {
      o[2 * e] = mk_f16((unsigned short)(v[e] & 0xffffu));
      o[2 * e + 1] = mk_f16((unsigned short)(v[e] >> 16));
    }
  }
};

// ---- reductions (fixed trees: the result does not depend on timing) ------------------------------
__device__ __forceinline__ float mk_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double mk_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float mk_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sums NV values per lane (NV a power of two <= 32) over the warp with a transposing butterfly:
// at each of the first log2(NV) steps a lane keeps one half of its values and trades the other half
// with its partner, so NV values take NV - 1 + 5 - log2(NV) shuffles instead of 5 NV. Afterwards
// v[0] of every lane holds the total of value mk_sum_n_index<NV>(lane).
template <int NV>
__device__ __forceinline__ void mk_warp_sum_n(float (&v)[NV], int lane) {
#pragma unroll
  for (int h = NV / 2, o = 16; h >= 1; h >>= 1, o >>= 1) {
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < h; ++i) {
      const float send = upper ? v[i] : v[i + h];
      const float keep = upper ? v[i + h] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
#pragma unroll
  for (int o = 16 / NV; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
}
template <int NV>
__device__ __forceinline__ int mk_sum_n_index(int lane) {
  int idx = 0;
#pragma unroll
  for (int h = NV / 2, o = 16; h >= 1; h >>= 1, o >>= 1)
    if (lane & o) idx += h;
  return idx;
}
__host__ __device__ constexpr int mk_pow2_floor(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

// Sum over the block; `red` holds MK_WARPS + 1 doubles of shared memory. All threads must call.
__device__ double mk_block_sum(double v, double* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = mk_warp_sum_d(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = lane < MK_WARPS ? red[lane] : 0.0;
    t = mk_warp_sum_d(t);
    if (lane == 0) red[MK_WARPS] = t;
  }
  __syncthreads();
  double t = red[MK_WARPS];
  __syncthreads();
  return t;
}

// ---- activations (same formulas as ir/ops.h) --------------------------------------------------
__device__ __forceinline__ float mk_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float mk_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float mk_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
template <int ACT>
__device__ __forceinline__ float mk_act(float v) {
  if (ACT == 1) return mk_silu(v);
  if (ACT == 2) return mk_gelu(v);
  if (ACT == 3) return mk_gelu_tanh(v);
  return v;
}

// Rotates the pair (*p0, *p1) by pos * inv_freq(i), in double like the CPU interpreter.
template <class C>
__device__ __forceinline__ void mk_rope_rotate(float* p0, float* p1, int i, int pos) {
  const double ang = (double)pos * C::inv_freq(i);
  double s, c;
  sincos(ang, &s, &c);
  const double x0 = *p0, x1 = *p1;
  *p0 = (float)(x0 * c - x1 * s);
  *p1 = (float)(x0 * s + x1 * c);
}

// Rotates the pairs of one head of `v` (head_dim C::HD, n_rot C::NROT) for position pos. Pair i of
// the head, 0 <= i < NROT / 2, is handled by the caller's thread.
template <class C>
__device__ __forceinline__ void mk_rope_pair(float* head, int i, int pos) {
  constexpr int half = C::NROT / 2;
  const int i0 = C::HALVES ? i : 2 * i, i1 = C::HALVES ? i + half : 2 * i + 1;
  mk_rope_rotate<C>(head + i0, head + i1, i, pos);
}

// ---- opcode templates ----------------------------------------------------------------------------
// Each takes its config C (generated: constexpr shapes, strides, tile width, dtypes, constants),
// the instruction, the op's operand pointers, the step's symbols and the block's dynamic shared
// memory. All threads of the block call it; it may use __syncthreads.

// The column loop of mk_matmul for RB rows staged in xs (nr of them valid): tile[rb][j] for the tile's
// columns. Called with RB = 1 for one-row steps (decode), so those get the widest column groups.
template <class C, int RB>
__device__ __forceinline__ void mk_matmul_cols(const float* xs, float* tile, const MkOpArgs& a, int c0, int nc, int nr) {
  constexpr int K = C::K, T = C::T;
  constexpr int KV = C::VEC ? K / 8 * 8 : 0;  // elements covered by 8-wide chunks
  // K % 8 != 0: the widest vector (in elements, <= 16 bytes) that divides K, 1 = scalar loads.
  constexpr int VW = C::VEC ? 1 : K % 4 == 0 ? 4 : K % 2 == 0 ? 2 : 1;
  constexpr int KT = VW > 1 ? K : KV;  // elements the vector loops cover
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Warp w computes NW columns at once (NW = T / MK_WARPS, at most 8 / RB, a power of two): each
  // lane keeps NW (x2 with GLU) independent 16-byte weight loads in flight per step of K, and the
  // NW sums of a row are reduced together (mk_warp_sum_n). Columns past the tile repeat its last
  // column and are not stored.
  constexpr int NW = mk_pow2_floor(C::T / MK_WARPS < 1 ? 1 : C::T / MK_WARPS < 8 / RB ? C::T / MK_WARPS : 8 / RB);
  for (int j0 = warp * NW; j0 < nc; j0 += MK_WARPS * NW) {
    const char* wrow[NW];
    const char* urow[NW];
#pragma unroll
    for (int c = 0; c < NW; ++c) {
      const mk_i64 col = c0 + min(j0 + c, nc - 1);
      wrow[c] = (const char*)a.w + col * (mk_i64)K * C::W::kBytes;
      urow[c] = C::GLU ? (const char*)a.w_up + col * (mk_i64)K * C::W::kBytes : nullptr;
    }
    float acc[RB][NW], accu[RB][NW];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int c = 0; c < NW; ++c) acc[rb][c] = accu[rb][c] = 0.0f;
    if constexpr (RB == 1) {  // decode: nvcc issues the loads of the unrolled steps back to back
#pragma unroll (NW >= 4 ? 1 : 4 / NW)
      for (int q = lane * 8; q < KV; q += 256) {
        float w8[NW][8], u8[NW][8];
#pragma unroll
        for (int c = 0; c < NW; ++c) {
          C::W::load8(wrow[c], q, w8[c]);
          if constexpr (C::GLU) C::W::load8(urow[c], q, u8[c]);
        }
        const float4 xa = *(const float4*)(xs + q), xb = *(const float4*)(xs + q + 4);
#pragma unroll
        for (int c = 0; c < NW; ++c) {
          acc[0][c] += w8[c][0] * xa.x + w8[c][1] * xa.y + w8[c][2] * xa.z + w8[c][3] * xa.w + w8[c][4] * xb.x +
                       w8[c][5] * xb.y + w8[c][6] * xb.z + w8[c][7] * xb.w;
          if constexpr (C::GLU)
            accu[0][c] += u8[c][0] * xa.x + u8[c][1] * xa.y + u8[c][2] * xa.z + u8[c][3] * xa.w + u8[c][4] * xb.x +
                          u8[c][5] * xb.y + u8[c][6] * xb.z + u8[c][7] * xb.w;
        }
      }
    } else {
      // Several rows: U steps of K per pass, all U x NW (x2 with GLU) 16-byte loads of a lane issued
      // before any is used. The row guards (rb < nr) are branches the compiler does not move loads
      // across, so with the loads inside the step loop a multi-row tile kept one load in flight per
      // lane (SASS, issue 8). A step past the end reloads the pass's first chunk (valid, unused): no
      // branch among the loads. Per lane the steps still add in ascending q: the same sums as before.
      constexpr int U = NW >= 4 ? 1 : 4 / NW;
      for (int q0 = lane * 8; q0 < KV; q0 += 256 * U) {
        float w8[U][NW][8], u8[U][NW][8];
#pragma unroll
        for (int st = 0; st < U; ++st) {
          const int q = q0 + 256 * st < KV ? q0 + 256 * st : q0;
#pragma unroll
          for (int c = 0; c < NW; ++c) {
            C::W::load8(wrow[c], q, w8[st][c]);
            if constexpr (C::GLU) C::W::load8(urow[c], q, u8[st][c]);
          }
        }
#pragma unroll
        for (int st = 0; st < U; ++st) {
          const int q = q0 + 256 * st;
          if (q >= KV) break;
#pragma unroll
          for (int rb = 0; rb < RB; ++rb) {
            if (rb < nr) {
              const float4 xa = *(const float4*)(xs + rb * K + q), xb = *(const float4*)(xs + rb * K + q + 4);
#pragma unroll
              for (int c = 0; c < NW; ++c) {
                acc[rb][c] += w8[st][c][0] * xa.x + w8[st][c][1] * xa.y + w8[st][c][2] * xa.z + w8[st][c][3] * xa.w +
                              w8[st][c][4] * xb.x + w8[st][c][5] * xb.y + w8[st][c][6] * xb.z + w8[st][c][7] * xb.w;
                if constexpr (C::GLU)
                  accu[rb][c] += u8[st][c][0] * xa.x + u8[st][c][1] * xa.y + u8[st][c][2] * xa.z + u8[st][c][3] * xa.w +
                                 u8[st][c][4] * xb.x + u8[st][c][5] * xb.y + u8[st][c][6] * xb.z + u8[st][c][7] * xb.w;
              }
            }
          }
        }
      }
    }
    if constexpr (VW > 1) {
      // Rows of K % 8 != 0 elements: every row starts at a multiple of VW elements (K % VW == 0), so
      // lanes take VW-element chunks with one VW * kBytes-byte load each (f32: 16 or 8 bytes, 16-bit
      // types: 8 or 4), U x NW (x2 with GLU) >= 4 loads per lane issued before any is used. The tail
      // loop below is then empty.
      constexpr int U = NW >= 4 ? 1 : 4 / NW;
      for (int q0 = lane * VW; q0 < K; q0 += 32 * VW * U) {
        float wv[U][NW][VW], uv[U][NW][VW];
#pragma unroll
        for (int st = 0; st < U; ++st) {
          const int q = q0 + 32 * VW * st < K ? q0 + 32 * VW * st : q0;  // past the end: reload (unused)
#pragma unroll
          for (int c = 0; c < NW; ++c) {
            C::W::template loadv<VW>(wrow[c], q, wv[st][c]);
            if constexpr (C::GLU) C::W::template loadv<VW>(urow[c], q, uv[st][c]);
          }
        }
#pragma unroll
        for (int st = 0; st < U; ++st) {
          const int q = q0 + 32 * VW * st;
          if (q >= K) break;
#pragma unroll
          for (int rb = 0; rb < RB; ++rb) {
            if (rb < nr) {
#pragma unroll
              for (int c = 0; c < NW; ++c) {
                float t = 0.0f, tu = 0.0f;
#pragma unroll
                for (int e = 0; e < VW; ++e) {
                  t += wv[st][c][e] * xs[rb * K + q + e];
                  if constexpr (C::GLU) tu += uv[st][c][e] * xs[rb * K + q + e];
                }
                acc[rb][c] += t;
                if constexpr (C::GLU) accu[rb][c] += tu;
              }
            }
          }
        }
      }
    }
    for (int k = KT + lane; k < K; k += 32) {  // tail (or everything when rows are 2-byte aligned only)
#pragma unroll
      for (int c = 0; c < NW; ++c) {
        const float wv = C::W::load1(wrow[c], k);
        const float uv = C::GLU ? C::W::load1(urow[c], k) : 0.0f;
#pragma unroll
        for (int rb = 0; rb < RB; ++rb)
          if (rb < nr) {
            acc[rb][c] += wv * xs[rb * K + k];
            if constexpr (C::GLU) accu[rb][c] += uv * xs[rb * K + k];
          }
      }
    }
    const int jc = j0 + mk_sum_n_index<NW>(lane);
    const bool owner = (lane & (32 / NW - 1)) == 0 && jc < nc;
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      mk_warp_sum_n<NW>(acc[rb], lane);
      if constexpr (C::GLU) mk_warp_sum_n<NW>(accu[rb], lane);
      if (owner && rb < nr) tile[rb * T + jc] = C::GLU ? mk_act<C::GLU>(acc[rb][0]) * accu[rb][0] : acc[rb][0];
    }
  }
}

// Staged activation rows of a matmul: element k of a row sits at mk_xi<XU, PAD>(k): PAD == 0 (float
// weights) keeps k; quantized weights put 4 floats of padding after every unit of XU elements.
template <class W>
__host__ __device__ constexpr int mk_x_unit(int k) {
  if constexpr (W::kQuant) return MkQUnit<W>::UQ;
  else return k;
}
template <int XU, int PAD>
__device__ __forceinline__ int mk_xi(int k) {
  if constexpr (PAD == 0) return k;
  else return k + k / XU * 4;
}

// acc[rb] += unit u of the quantized weight row `row` . staged row rb (unit start xu, nvb valid blocks):
// the unit's NCH 16-byte loads first (mk_q_load), then 32 elements at a time dequantized in registers.
template <class C, int RB>
__device__ __forceinline__ void mk_q_unit_dot(const char* row, int u, const float* xu, int nvb, int nr, float (&acc)[RB]) {
  using W = typename C::W;
  mk_u32 w[MkQUnit<W>::NWORDS];
  mk_q_load<W>(row, u, w);
#pragma unroll
  for (int b = 0; b < W::UB; ++b) {
    if (b < nvb) {
#pragma unroll
      for (int g = 0; g < W::QK / 32; ++g) {
        float y[32];
        W::deq32(w, b * W::BYTES, g, y);
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          if (rb < nr) {
            const float* xr = xu + rb * C::XK + b * W::QK + g * 32;
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < 32; e += 4) {
              const float4 x4 = *(const float4*)(xr + e);
              s += y[e] * x4.x + y[e + 1] * x4.y + y[e + 2] * x4.z + y[e + 3] * x4.w;
            }
            acc[rb] += s;
          }
        }
      }
    }
  }
}

// The column loop of mk_matmul for a quantized W (quant.cuh): rows of K / QK blocks, WRS bytes apart.
// A weight row is split into NU units of UB blocks; LPC lanes (NU rounded up to a power of two, at
// most 32, at most 16 with GLU) share a row and each streams whole units (mk_q_unit_dot), so a warp
// covers 32 / LPC rows at once. With GLU, lane group 2k takes column k's gate row and group 2k + 1
// its up row (each lane holds one unit's words, not two), and the two sums meet by one shuffle.
// The staged rows carry 4 floats of padding after every unit (XK floats per row), so lanes reading
// different units hit different shared-memory banks.
template <class C, int RB>
__device__ __forceinline__ void mk_matmul_cols_q(const float* xs, float* tile, const MkOpArgs& a, int c0, int nc, int nr) {
  using W = typename C::W;
  using U = MkQUnit<W>;
  constexpr int K = C::K, T = C::T;
  constexpr int NB = K / W::QK, NU = (NB + W::UB - 1) / W::UB;
  constexpr int LPC0 = NU >= 32 ? 32 : mk_pow2_floor(NU) == NU ? NU : 2 * mk_pow2_floor(NU);
  constexpr int LPC = C::GLU && LPC0 > 16 ? 16 : LPC0;
  constexpr int CPW = (32 / LPC) / (C::GLU ? 2 : 1);  // output columns per warp step
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int li = lane & (LPC - 1), grp = lane / LPC;
  const bool up = C::GLU && (grp & 1) != 0;
  for (int j0 = warp * CPW; j0 < nc; j0 += MK_WARPS * CPW) {
    const int jc = j0 + (C::GLU ? grp >> 1 : grp);
    const mk_i64 col = c0 + min(jc, nc - 1);
    const char* row = (const char*)(up ? a.w_up : a.w) + col * (mk_i64)C::WRS;
    float acc[RB];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) acc[rb] = 0.0f;
    for (int u = li; u < NU; u += LPC)
      mk_q_unit_dot<C, RB>(row, u, xs + u * (U::UQ + 4), min(W::UB, NB - u * W::UB), nr, acc);
    const bool owner = li == 0 && !up && jc < nc;
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
#pragma unroll
      for (int o = LPC / 2; o > 0; o >>= 1) acc[rb] += __shfl_xor_sync(0xffffffffu, acc[rb], o);
      float v = acc[rb];
      if constexpr (C::GLU) v = mk_act<C::GLU>(v) * __shfl_xor_sync(0xffffffffu, v, LPC);  // gate lanes get the up sum
      if (owner && rb < nr) tile[rb * T + jc] = v;
    }
  }
}

// matmul: out[:, c0:c1] = epi(glu(pro(x) @ w[c0:c1]^T)), f32 accumulation.
// x rows are staged in shared memory RB at a time (rms-normalised there when PRO_RMS); each warp
// computes groups of columns (mk_matmul_cols: lanes read 16-byte chunks of the weight rows,
// coalesced, multiply with the staged rows and reduce with shuffles; one-row steps take the RB = 1
// path). Results go to a shared tile, where the epilogue (RoPE needs column pairs) runs before the
// store.
template <class C>
__device__ void mk_matmul(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  constexpr int K = C::K, RB = C::RB, T = C::T;
  // Staged row stride: K floats, plus 4 after every unit of UQ elements for quantized weights.
  constexpr int XU = mk_x_unit<typename C::W>(K), XK = K + (K + XU - 1) / XU * (C::W::kQuant ? 4 : 0);
  static_assert(XK == C::XK, "codegen and prelude disagree on the staged row stride");
  float* xs = (float*)smem;                    // [RB][XK]
  float* tile = xs + RB * XK;                  // [RB][T]
  double* red = (double*)(tile + RB * T + 2);  // [MK_WARPS + 1]
  red = (double*)(((unsigned long long)red + 7) & ~7ull);
  const int R = C::rows(s);
  const int c0 = in.c0, nc = in.c1 - in.c0;
  for (int r0 = 0; r0 < R; r0 += RB) {
    const int nr = min(RB, R - r0);
    if constexpr (C::XVEC) {
      for (int i = threadIdx.x; i < nr * (K / 4); i += MK_THREADS) {
        const int rb = i / (K / 4), k4 = i - rb * (K / 4);
        *(float4*)(xs + rb * XK + mk_xi<XU, XK - K>(k4 * 4)) = mk_ld4(a.x + (mk_i64)(r0 + rb) * C::XS + k4 * 4);
      }
    } else {
      for (int i = threadIdx.x; i < nr * K; i += MK_THREADS) {
        const int rb = i / K, k = i - rb * K;
        xs[rb * XK + mk_xi<XU, XK - K>(k)] = mk_ld(a.x + (mk_i64)(r0 + rb) * C::XS + k);
      }
    }
    if constexpr (C::PRO_RMS && C::NSS > 0) {
      // The row statistics from the partials x's writer left (mk_rms_partials): warp w sums row
      // w's NSS (hi, lo) pairs, lane-strided then a fixed shuffle tree (the same bits in every tile
      // of the op). tile[rb] holds 1 / rms until the column loop; the staging barrier publishes it.
      const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
      for (int rb = warp; rb < nr; rb += MK_WARPS) {
        const float* sp = a.ss + (mk_i64)(r0 + rb) * C::SSS;
        double ss = 0;
        for (int i = lane; i < C::NSS; i += 32) ss += (double)mk_ld(sp + 2 * i) + (double)mk_ld(sp + 2 * i + 1);
        ss = mk_warp_sum_d(ss);
        if (lane == 0) tile[rb] = (float)(1.0 / sqrt(ss / (double)K + C::EPS));
      }
    }
    __syncthreads();
    if constexpr (C::PRO_RMS) {
      for (int rb = 0; rb < nr; ++rb) {
        float* xr = xs + rb * XK;
        float inv;
        if constexpr (C::NSS > 0) {
          inv = tile[rb];
        } else {  // no partials (x's writer cannot make them): the statistic of the staged row
          double ss = 0;
          for (int k = threadIdx.x; k < K; k += MK_THREADS) ss += (double)xr[mk_xi<XU, XK - K>(k)] * xr[mk_xi<XU, XK - K>(k)];
          ss = mk_block_sum(ss, red);
          inv = (float)(1.0 / sqrt(ss / (double)K + C::EPS));
        }
        for (int k = threadIdx.x; k < K; k += MK_THREADS)
          xr[mk_xi<XU, XK - K>(k)] = xr[mk_xi<XU, XK - K>(k)] * inv * (C::NormW::load1(a.norm_w, k) + (float)C::WOFF);
      }
      __syncthreads();
    }
    if constexpr (C::W::kQuant) {
      if (nr == 1) mk_matmul_cols_q<C, 1>(xs, tile, a, c0, nc, 1);
      else mk_matmul_cols_q<C, RB>(xs, tile, a, c0, nc, nr);
    } else {
      if (nr == 1) mk_matmul_cols<C, 1>(xs, tile, a, c0, nc, 1);
      else mk_matmul_cols<C, RB>(xs, tile, a, c0, nc, nr);
    }
    __syncthreads();
    if constexpr (C::ROPE) {
      if constexpr (C::HALVES) {  // rotated halves: whole heads per tile (c0 and nc multiples of HD)
        constexpr int half = C::NROT / 2;
        const int heads = nc / C::HD;
        for (int i = threadIdx.x; i < nr * heads * half; i += MK_THREADS) {
          const int rb = i / (heads * half), rem = i - rb * heads * half, h = rem / half, pi = rem - h * half;
          mk_rope_pair<C>(tile + rb * T + h * C::HD, pi, mk_ld_i32(a.pos + r0 + rb));
        }
      } else {  // adjacent pairs: c0 and nc even; column c is dimension c % HD of its head
        const int pairs = nc / 2;
        for (int i = threadIdx.x; i < nr * pairs; i += MK_THREADS) {
          const int rb = i / pairs, p = i - rb * pairs, d = (c0 + 2 * p) % C::HD;
          if (d < C::NROT)
            mk_rope_rotate<C>(tile + rb * T + 2 * p, tile + rb * T + 2 * p + 1, d / 2, mk_ld_i32(a.pos + r0 + rb));
        }
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < nr * nc; i += MK_THREADS) {
      const int rb = i / nc, j = i - rb * nc;
      float v = tile[rb * T + j];
      if constexpr (C::ADD) v += mk_ld(a.res + (mk_i64)(r0 + rb) * C::RS + c0 + j);
      const int orow = C::STORE ? mk_ld_i32(a.ids + r0 + rb) : r0 + rb;  // store: the row's KV slot
      mk_st(a.out + (mk_i64)orow * C::OS + c0 + j, v);
    }
    __syncthreads();  // xs and tile are reused by the next row block
  }
}

// moe_matmul (isa/instr.def): mixture of experts. Per row, per slot j of the tile (expand: the one
// slot its columns lie in; reduce: every slot in order), the row's x (its slot's K columns when
// reducing) is staged in shared memory and mk_matmul's one-row column loop runs over the slot's
// expert (the weight base, and a GLU's up weight base, moved e * N rows on); reduce adds p_j * v into a shared accumulator in slot
// order (llama.cpp: ggml_mul by the weights, then the slots added one after another).
template <class C>
__device__ void mk_moe_matmul(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  constexpr int K = C::K, T = C::T;
  constexpr int XU = mk_x_unit<typename C::W>(K), XK = K + (K + XU - 1) / XU * (C::W::kQuant ? 4 : 0);
  static_assert(XK == C::XK, "codegen and prelude disagree on the staged row stride");
  float* xs = (float*)smem;  // [XK]
  float* tile = xs + XK;     // [T]
  float* acc = tile + T;     // [T] (reduce)
  const int R = C::rows(s), nc = in.c1 - in.c0;
  const int jf = C::REDUCE ? 0 : in.c0 / C::N, lc0 = C::REDUCE ? in.c0 : in.c0 - jf * C::N;
  for (int r = 0; r < R; ++r) {
    const float* rt = a.y + (mk_i64)r * C::YS;
    for (int j = jf; j < (C::REDUCE ? C::KU : jf + 1); ++j) {
      const float ev = mk_ld(rt + j);
      const int e = ev >= 0.0f && ev < (float)C::NE ? (int)ev : 0;
      const float* xr = a.x + (mk_i64)r * C::XS + (C::REDUCE ? j * K : 0);
      for (int k = threadIdx.x; k < K; k += MK_THREADS) xs[mk_xi<XU, XK - K>(k)] = mk_ld(xr + k);
      __syncthreads();
      MkOpArgs b = a;
      b.w = (const char*)a.w + (mk_i64)e * C::N * C::WRS;
      if constexpr (C::GLU) b.w_up = (const char*)a.w_up + (mk_i64)e * C::N * C::WRS;  // act(gate) * up per column
      if constexpr (C::W::kQuant) mk_matmul_cols_q<C, 1>(xs, tile, b, lc0, nc, 1);
      else mk_matmul_cols<C, 1>(xs, tile, b, lc0, nc, 1);
      __syncthreads();
      if constexpr (C::REDUCE) {
        const float p = mk_ld(rt + C::KU + j);
        for (int t = threadIdx.x; t < nc; t += MK_THREADS) acc[t] = (j == 0 ? 0.0f : acc[t]) + tile[t] * p;
      } else {
        for (int t = threadIdx.x; t < nc; t += MK_THREADS) mk_st(a.out + (mk_i64)r * C::OS + in.c0 + t, tile[t]);
      }
      __syncthreads();  // xs and tile are reused by the next slot
    }
    if constexpr (C::REDUCE) {
      for (int t = threadIdx.x; t < nc; t += MK_THREADS) mk_st(a.out + (mk_i64)r * C::OS + in.c0 + t, acc[t]);
      __syncthreads();
    }
  }
}

// moe_route: per row the KU experts of highest softmax probability and their weights (ir/ops.h
// moe_route_row: softmax with a double sum, selection descending with ties to the lower index, NaN
// never wins, the k weights divided by their double sum when NORM). One tile; warp w takes rows w,
// w + MK_WARPS, ...: its lanes compute the probabilities into shared memory (NE per warp), then each
// of the KU picks is a warp argmax over the lanes' strided slices (value desc, index asc: a total
// order, so the shuffle tree gives the serial loop's pick) with the picked ones marked -1 (taken).
__device__ __forceinline__ bool mk_route_better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  if (isnan(bv) != isnan(v)) return isnan(bv);  // a number beats NaN
  return v > bv || (!(v < bv) && i < bi);          // equal (or both NaN): the lower index
}
template <class C>
__device__ void mk_moe_route(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* e = (float*)smem + warp * 2 * C::NE;  // [NE] probabilities, [NE] taken flags
  float* taken = e + C::NE;
  const int R = C::rows(s);
  for (int r = warp; r < R; r += MK_WARPS) {
    const float* x = a.x + (mk_i64)r * C::XS;
    float mx = MK_NEG_INF;
    for (int i = lane; i < C::NE; i += 32) mx = fmaxf(mx, mk_ld(x + i));
    mx = mk_warp_max(mx);
    double sum = 0;
    for (int i = lane; i < C::NE; i += 32) {
      const float v = expf(mk_ld(x + i) - mx);
      e[i] = v;
      taken[i] = 0.0f;
      sum += v;
    }
    sum = mk_warp_sum_d(sum);
    const float inv = (float)(1.0 / sum);
    for (int i = lane; i < C::NE; i += 32) e[i] *= inv;
    __syncwarp();
    float* out = a.out + (mk_i64)r * C::OS;
    double wsum = 0;
    float picked[C::KU];
    for (int j = 0; j < C::KU; ++j) {
      float bv = 0.0f;
      int bi = -1;
      for (int i = lane; i < C::NE; i += 32)
        if (taken[i] == 0.0f && mk_route_better(e[i], i, bv, bi)) bv = e[i], bi = i;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (mk_route_better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      picked[j] = bv;
      wsum += bv;
      if (lane == 0) {
        taken[bi] = 1.0f;
        mk_st(out + j, (float)bi);
        mk_st(out + C::KU + j, bv);
      }
      __syncwarp();
    }
    if constexpr (C::NORM)
      if (lane == 0)
        for (int j = 0; j < C::KU; ++j) mk_st(out + C::KU + j, picked[j] / (float)wsum);
    __syncwarp();
  }
}

// Bytes of weights an instruction of a matmul reads: prefetched into L2 before its wait.
template <class C>
__device__ __forceinline__ void mk_matmul_prefetch(const MkInstr& in, const MkOpArgs& a) {
  const mk_i64 row_bytes = C::WRS;
  const char* base = (const char*)a.w + (mk_i64)in.c0 * row_bytes;
  const mk_i64 bytes = (mk_i64)(in.c1 - in.c0) * row_bytes;
  for (mk_i64 o = (mk_i64)threadIdx.x * 128; o < bytes; o += (mk_i64)MK_THREADS * 128) mk_prefetch_l2(base + o);
  if constexpr (C::GLU) {
    const char* ubase = (const char*)a.w_up + (mk_i64)in.c0 * row_bytes;
    for (mk_i64 o = (mk_i64)threadIdx.x * 128; o < bytes; o += (mk_i64)MK_THREADS * 128) mk_prefetch_l2(ubase + o);
  }
}

// attention: heads [c0/HD, c1/HD) of every row r, causal over positions [0, pos[r]] of the row's
// sequence; position j lives in pool row tab[row_seq[r] * MB + j / KVB] * KVB + j % KVB.
// Warps take chunks of 32 cache rows; lane l scores row j0 + l against q (staged in shared memory)
// and keeps its row's pool index, the warp updates its online softmax (running max m, sum l) once
// per chunk, writes the chunk's probabilities and pool rows to shared memory, and every lane
// accumulates its head elements of p @ V over the chunk's rows (coalesced V loads, independent of
// each other: several rows in flight). The warps' partial results are combined in shared memory.
// attention_partial (flash-decoding) runs the same loop over one split of the row's positions and
// stores the block's unnormalised o, m and l; attention_combine merges the splits.
template <class C>
__device__ __forceinline__ int mk_kv_row(const int* bt, int j) {
  return mk_ld_i32(bt + j / C::KVB) * C::KVB + j % C::KVB;
}
// Positions row r attends to: [*begin, *end) of its sequence (causal: [0, pos[r]]; under a sliding
// window C::WIN > 0 only the last WIN of them). The one place the device takes a row's range from.
template <class C>
__device__ __forceinline__ void mk_kv_range(const MkOpArgs& a, int r, int* begin, int* end) {
  *end = mk_ld_i32(a.pos + r) + 1;
  *begin = C::WIN > 0 && *end > C::WIN ? *end - C::WIN : 0;
}
// One score from its dot product q.k: scaled, then soft-capped when C::SOFTCAP > 0 (Gemma 2; the
// CPU's attn_score: ir/ops.h softcap).
template <class C>
__device__ __forceinline__ float mk_attn_score(float t) {
  const float d = t * (float)C::SCALE;
  if constexpr (C::SOFTCAP > 0) return (float)C::SOFTCAP * tanhf(d * (1.0f / (float)C::SOFTCAP));
  return d;
}
// Shared memory of mk_attend_head, in floats (codegen.cpp sizes it from the same formula).
#define MK_ATTN_SMEM(HD) ((HD) + MK_WARPS * ((HD) + 2) + 2 * MK_WARPS * 32)
// One head h of row r over positions [lo, hi) (pool rows through the block table bt). PARTIAL:
// dst[0:HD) = o (unnormalised, relative to the block max m), dst[HD] = m, dst[HD + 1] = l (an empty
// range gives o = 0, m = -inf, l = 0); otherwise dst[0:HD) = o / l. All threads must call.
template <class C, bool PARTIAL>
__device__ void mk_attend_head(const MkOpArgs& a, int r, int h, const int* bt, int lo, int hi, float* dst, char* smem) {
  constexpr int HD = C::HD, PL = (HD + 31) / 32;  // head elements per lane
  float* qs = (float*)smem;                         // [HD]
  float* part = qs + HD;                            // [MK_WARPS][HD + 2]
  float* probs = part + MK_WARPS * (HD + 2);        // [MK_WARPS][32]
  int* rows = (int*)(probs + MK_WARPS * 32);        // [MK_WARPS][32] pool rows of the chunk
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* wp = probs + warp * 32;
  int* wr = rows + warp * 32;
  const int g = h / C::HPG;
  for (int i = threadIdx.x; i < HD; i += MK_THREADS) qs[i] = mk_ld(a.x + (mk_i64)r * C::QS + h * HD + i);
  __syncthreads();
  float m = MK_NEG_INF, l = 0.0f, acc[PL];
#pragma unroll
  for (int e = 0; e < PL; ++e) acc[e] = 0.0f;
  for (int j0 = lo + warp * 32; j0 < hi; j0 += MK_WARPS * 32) {
    const int j = j0 + lane;
    float d = MK_NEG_INF;
    int kvr = 0;
    if (j < hi) {
      kvr = mk_kv_row<C>(bt, j);
      const float* kr = a.y + (mk_i64)kvr * C::KS + g * HD;
      float t = 0.0f;
      if constexpr (C::KVEC) {
#pragma unroll 4
        for (int i = 0; i < HD; i += 4) {
          const float4 k4 = mk_ld4(kr + i);
          t += qs[i] * k4.x + qs[i + 1] * k4.y + qs[i + 2] * k4.z + qs[i + 3] * k4.w;
        }
      } else {
        for (int i = 0; i < HD; ++i) t += qs[i] * mk_ld(kr + i);
      }
      d = mk_attn_score<C>(t);
    }
    const float mn = fmaxf(m, mk_warp_max(d));  // finite: row j0 exists
    const float corr = expf(m - mn);            // 0 when m = -inf
    const float p = j < hi ? expf(d - mn) : 0.0f;
    l = l * corr + mk_warp_sum(p);
    m = mn;
    wp[lane] = p;
    wr[lane] = kvr;
    __syncwarp();
#pragma unroll
    for (int e = 0; e < PL; ++e) acc[e] *= corr;
    const int nj = min(32, hi - j0);
#pragma unroll 4
    for (int jj = 0; jj < nj; ++jj) {
      const float pj = wp[jj];
      const float* vr = a.z + (mk_i64)wr[jj] * C::VS + g * HD;
#pragma unroll
      for (int e = 0; e < PL; ++e) {
        const int i = lane + 32 * e;
        if (i < HD) acc[e] += pj * mk_ld(vr + i);
      }
    }
    __syncwarp();  // wp and wr are rewritten by the next chunk
  }
  float* mine = part + warp * (HD + 2);
#pragma unroll
  for (int e = 0; e < PL; ++e) {
    const int i = lane + 32 * e;
    if (i < HD) mine[i] = acc[e];
  }
  if (lane == 0) {
    mine[HD] = m;
    mine[HD + 1] = l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < HD; i += MK_THREADS) {
    float M = MK_NEG_INF;
    for (int w = 0; w < MK_WARPS; ++w) M = fmaxf(M, part[w * (HD + 2) + HD]);
    float L = 0.0f, O = 0.0f;
    for (int w = 0; w < MK_WARPS; ++w) {
      const float* pw = part + w * (HD + 2);
      if (pw[HD + 1] > 0.0f) {
        const float f = expf(pw[HD] - M);
        L += pw[HD + 1] * f;
        O += pw[i] * f;
      }
    }
    if constexpr (PARTIAL) {
      mk_st(dst + i, O);
      if (i == 0) {
        mk_st(dst + HD, M);
        mk_st(dst + HD + 1, L);
      }
    } else {
      mk_st(dst + i, O / L);
    }
  }
  __syncthreads();
}
// All HPG heads of KV group g of row r over positions [lo, hi) in one pass (GROUPED partials): each
// K and V row is loaded once for the group instead of once per head; per head the arithmetic is
// mk_attend_head's (same order, same bits). dst + hh * (HD + 2): head hh's o, m, l.
// Shared memory: HPG * HD + MK_WARPS * HPG * (HD + 2) + MK_WARPS * HPG * 32 + MK_WARPS * 32 floats.
template <class C>
__device__ void mk_attend_group(const MkOpArgs& a, int r, int g, const int* bt, int lo, int hi, float* dst,
                                char* smem) {
  constexpr int HD = C::HD, PL = (HD + 31) / 32, G = C::HPG, ST = HD + 2;
  float* qs = (float*)smem;                       // [G][HD]
  float* part = qs + G * HD;                      // [MK_WARPS][G][ST]
  float* probs = part + MK_WARPS * G * ST;        // [MK_WARPS][G][32]
  int* rows = (int*)(probs + MK_WARPS * G * 32);  // [MK_WARPS][32] pool rows of the chunk
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* wp = probs + warp * G * 32;
  int* wr = rows + warp * 32;
  for (int i = threadIdx.x; i < G * HD; i += MK_THREADS) qs[i] = mk_ld(a.x + (mk_i64)r * C::QS + g * G * HD + i);
  __syncthreads();
  float m[G], l[G], acc[G][PL];
#pragma unroll
  for (int hh = 0; hh < G; ++hh) {
    m[hh] = MK_NEG_INF;
    l[hh] = 0.0f;
#pragma unroll
    for (int e = 0; e < PL; ++e) acc[hh][e] = 0.0f;
  }
  for (int j0 = lo + warp * 32; j0 < hi; j0 += MK_WARPS * 32) {
    const int j = j0 + lane;
    float t[G];
#pragma unroll
    for (int hh = 0; hh < G; ++hh) t[hh] = 0.0f;
    int kvr = 0;
    if (j < hi) {
      kvr = mk_kv_row<C>(bt, j);
      const float* kr = a.y + (mk_i64)kvr * C::KS + g * HD;
      if constexpr (C::KVEC) {
#pragma unroll 4
        for (int i = 0; i < HD; i += 4) {
          const float4 k4 = mk_ld4(kr + i);
#pragma unroll
          for (int hh = 0; hh < G; ++hh) {
            const float* q = qs + hh * HD;
            t[hh] += q[i] * k4.x + q[i + 1] * k4.y + q[i + 2] * k4.z + q[i + 3] * k4.w;
          }
        }
      } else {
        for (int i = 0; i < HD; ++i) {
          const float k = mk_ld(kr + i);
#pragma unroll
          for (int hh = 0; hh < G; ++hh) t[hh] += qs[hh * HD + i] * k;
        }
      }
    }
    float corr[G];
#pragma unroll
    for (int hh = 0; hh < G; ++hh) {
      const float d = j < hi ? mk_attn_score<C>(t[hh]) : MK_NEG_INF;
      const float mn = fmaxf(m[hh], mk_warp_max(d));  // finite: row j0 exists
      corr[hh] = expf(m[hh] - mn);                    // 0 when m = -inf
      const float p = j < hi ? expf(d - mn) : 0.0f;
      l[hh] = l[hh] * corr[hh] + mk_warp_sum(p);
      m[hh] = mn;
      wp[hh * 32 + lane] = p;
    }
    wr[lane] = kvr;
    __syncwarp();
#pragma unroll
    for (int hh = 0; hh < G; ++hh)
#pragma unroll
      for (int e = 0; e < PL; ++e) acc[hh][e] *= corr[hh];
    const int nj = min(32, hi - j0);
#pragma unroll 2
    for (int jj = 0; jj < nj; ++jj) {
      const float* vr = a.z + (mk_i64)wr[jj] * C::VS + g * HD;
#pragma unroll
      for (int e = 0; e < PL; ++e) {
        const int i = lane + 32 * e;
        if (i < HD) {
          const float v = mk_ld(vr + i);
#pragma unroll
          for (int hh = 0; hh < G; ++hh) acc[hh][e] += wp[hh * 32 + jj] * v;
        }
      }
    }
    __syncwarp();  // wp and wr are rewritten by the next chunk
  }
  float* mine = part + warp * G * ST;
#pragma unroll
  for (int hh = 0; hh < G; ++hh) {
#pragma unroll
    for (int e = 0; e < PL; ++e) {
      const int i = lane + 32 * e;
      if (i < HD) mine[hh * ST + i] = acc[hh][e];
    }
    if (lane == 0) {
      mine[hh * ST + HD] = m[hh];
      mine[hh * ST + HD + 1] = l[hh];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += MK_THREADS) {
    const int hh = idx / HD, i = idx - hh * HD;
    float M = MK_NEG_INF;
    for (int w = 0; w < MK_WARPS; ++w) M = fmaxf(M, part[(w * G + hh) * ST + HD]);
    float L = 0.0f, O = 0.0f;
    for (int w = 0; w < MK_WARPS; ++w) {
      const float* pw = part + (w * G + hh) * ST;
      if (pw[HD + 1] > 0.0f) {
        const float f = expf(pw[HD] - M);
        L += pw[HD + 1] * f;
        O += pw[i] * f;
      }
    }
    mk_st(dst + hh * ST + i, O);
    if (i == 0) {
      mk_st(dst + hh * ST + HD, M);
      mk_st(dst + hh * ST + HD + 1, L);
    }
  }
  __syncthreads();
}
template <class C>
__device__ void mk_attention(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  // rows: part in.rows & 0xffff of in.rows >> 16 (instr_rows in isa/program.h)
  const mk_i64 R = C::rows(s), part = in.rows & 0xffff, parts = in.rows >> 16;
  for (int r = (int)(R * part / parts); r < (int)(R * (part + 1) / parts); ++r) {
    int lo, hi;
    mk_kv_range<C>(a, r, &lo, &hi);
    const int* bt = a.tab + (mk_i64)mk_ld_i32(a.ids + r) * C::MB;  // the row's block table
    for (int h = in.c0 / C::HD; h < in.c1 / C::HD; ++h)
      mk_attend_head<C, false>(a, r, h, bt, lo, hi, a.out + (mk_i64)r * C::OS + h * C::HD, smem);
  }
}
// attention_partial: one block per (KV group g, split sp) = tile index c0 / TILE; scratch layout in
// isa/program.h ([rows][n_head_kv][S][HPG][HD + 2]). Split ranges as attn_split_range there.
// GROUPED (codegen: HPG * ceil(HD / 32) <= 16 accumulators per lane): the group's heads in one pass.
template <class C>
__device__ void mk_attention_partial(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  constexpr int ST = C::HD + 2, TILE = C::HPG * ST;
  const int t = in.c0 / TILE, g = t / C::S, sp = t - g * C::S;
  const int R = C::rows(s);
  for (int r = 0; r < R; ++r) {
    int begin, end;
    mk_kv_range<C>(a, r, &begin, &end);
    const mk_i64 n = end - begin;
    const int lo = begin + (int)(n * sp / C::S), hi = begin + (int)(n * (sp + 1) / C::S);
    const int* bt = a.tab + (mk_i64)mk_ld_i32(a.ids + r) * C::MB;
    if constexpr (C::GROUPED) {
      mk_attend_group<C>(a, r, g, bt, lo, hi, a.out + (mk_i64)r * C::OS + in.c0, smem);
    } else {
      for (int hh = 0; hh < C::HPG; ++hh)
        mk_attend_head<C, true>(a, r, g * C::HPG + hh, bt, lo, hi, a.out + (mk_i64)r * C::OS + in.c0 + hh * ST, smem);
    }
  }
}
// attention_combine: heads [c0/HD, c1/HD), one row at a time: a thread per head loads the S
// partials' m and l once into shared memory and turns them into each split's weight
// f = exp(m - M) (M the largest m of the non-empty splits; empty ones, l = 0, are skipped) and the
// merged L = sum l f; then a thread per (head, element) sums o f over the splits and stores O / L.
// The same operations in the same order as one thread per element reading m and l itself (the
// same bits), with 2 S loads of m and l per head instead of about 4 S per element.
template <class C>
__device__ void mk_attention_combine(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  constexpr int HD = C::HD, ST = HD + 2, TILE = C::HPG * ST;
  float* fs = (float*)smem;           // [NH][S][2]: (m, l) of each split, then (weight f, l)
  float* ls = fs + C::NH * C::S * 2;  // [NH] merged l
  const int R = C::rows(s), h0 = in.c0 / HD, nh = (in.c1 - in.c0) / HD;
  for (int r = 0; r < R; ++r) {
    const float* row = a.x + (mk_i64)r * C::XS;
    for (int hi = threadIdx.x; hi < nh; hi += MK_THREADS) {
      const int h = h0 + hi;
      const float* base = row + (h / C::HPG) * C::S * TILE + (h % C::HPG) * ST;
      float* f = fs + hi * C::S * 2;
      float M = MK_NEG_INF;
      for (int sp = 0; sp < C::S; ++sp) {  // m and l of every split, loaded once
        f[2 * sp] = mk_ld(base + sp * TILE + HD);
        f[2 * sp + 1] = mk_ld(base + sp * TILE + HD + 1);
      }
      for (int sp = 0; sp < C::S; ++sp)
        if (f[2 * sp + 1] > 0.0f) M = fmaxf(M, f[2 * sp]);
      float L = 0.0f;
      for (int sp = 0; sp < C::S; ++sp) {
        const float l = f[2 * sp + 1];
        if (l > 0.0f) {
          f[2 * sp] = expf(f[2 * sp] - M);
          L += l * f[2 * sp];
        }
      }
      ls[hi] = L;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nh * HD; idx += MK_THREADS) {
      const int hi = idx / HD, h = h0 + hi, i = idx - hi * HD;
      const float* base = row + (h / C::HPG) * C::S * TILE + (h % C::HPG) * ST;
      const float* f = fs + hi * C::S * 2;
      float O = 0.0f;
      for (int sp = 0; sp < C::S; ++sp)
        if (f[2 * sp + 1] > 0.0f) O += mk_ld(base + sp * TILE + i) * f[2 * sp];
      mk_st(a.out + (mk_i64)r * C::OS + h * HD + i, O / ls[hi]);
    }
    __syncthreads();  // fs and ls are rewritten for the next row
  }
}

// embed: out[r, c0:c1] = table[ids[r], c0:c1]. Quantized tables (rows WRS bytes apart): one thread per
// 32-element group of the row, dequantized from its block (mk_q_group).
template <class C>
__device__ void mk_embed(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem, const MkParams& p, int idx) {
  const int R = C::rows(s), nc = in.c1 - in.c0;
  if constexpr (C::W::kQuant) {
    const int g0 = in.c0 / 32, ng = (in.c1 + 31) / 32 - g0;
    for (int i = threadIdx.x; i < R * ng; i += MK_THREADS) {
      const int r = i / ng, g = g0 + (i - r * ng);
      int id = mk_ld_i32(a.ids + r);
      if (id < 0 || id >= C::NROWS) {
        mk_report(p, 2, idx, id, (mk_u32)C::NROWS, 0u);
        id = 0;
      }
      float y[32];
      mk_q_group<typename C::W>((const char*)a.w + (mk_i64)id * C::WRS, g, y);
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int col = 32 * g + e;
        if (col >= in.c0 && col < in.c1) mk_st(a.out + (mk_i64)r * C::OS + col, y[e]);
      }
    }
  } else {
    for (int i = threadIdx.x; i < R * nc; i += MK_THREADS) {
      const int r = i / nc, j = i - r * nc;
      int id = mk_ld_i32(a.ids + r);
      if (id < 0 || id >= C::NROWS) {
        mk_report(p, 2, idx, id, (mk_u32)C::NROWS, 0u);
        id = 0;
      }
      mk_st(a.out + (mk_i64)r * C::OS + in.c0 + j, C::W::load1(a.w, (mk_i64)id * C::K + in.c0 + j));
    }
  }
}

// rms_norm: GROUP == K: statistics over the full row, write columns [c0, c1); GROUP < K: each group
// of the tile on its own (the tile holds whole groups).
template <class C>
__device__ void mk_rms_norm(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  double* red = (double*)smem;
  const int R = C::rows(s);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if constexpr (C::GROUP == C::K) {
    for (int r = 0; r < R; ++r) {
      const float* xr = a.x + (mk_i64)r * C::XS;
      double ss = 0;
      for (int k = threadIdx.x; k < C::K; k += MK_THREADS) {
        const float v = mk_ld(xr + k);
        ss += (double)v * v;
      }
      ss = mk_block_sum(ss, red);
      const float inv = (float)(1.0 / sqrt(ss / (double)C::K + C::EPS));
      for (int k = in.c0 + threadIdx.x; k < in.c1; k += MK_THREADS) {
        const float wv = C::HAS_W ? C::NormW::load1(a.norm_w, k) + (float)C::WOFF : 1.0f;
        mk_st(a.out + (mk_i64)r * C::OS + k, mk_ld(xr + k) * inv * wv);
      }
    }
  } else {
    const int groups = (in.c1 - in.c0) / C::GROUP;
    for (int gi = warp; gi < R * groups; gi += MK_WARPS) {
      const int r = gi / groups, g0 = in.c0 + (gi - r * groups) * C::GROUP;
      const float* xr = a.x + (mk_i64)r * C::XS + g0;
      double ss = 0;
      for (int k = lane; k < C::GROUP; k += 32) {
        const float v = mk_ld(xr + k);
        ss += (double)v * v;
      }
      ss = mk_warp_sum_d(ss);
      const float inv = (float)(1.0 / sqrt(ss / (double)C::GROUP + C::EPS));
      for (int k = lane; k < C::GROUP; k += 32) {
        const float wv = C::HAS_W ? C::NormW::load1(a.norm_w, k) + (float)C::WOFF : 1.0f;
        mk_st(a.out + (mk_i64)r * C::OS + g0 + k, mk_ld(xr + k) * inv * wv);
      }
    }
  }
}

// RMS statistic partials (isa/program.h OpDesc::ss_out), after a tile of an op whose output is a
// pro_rms matmul's x: per row, the double sum of squares of the tile's stored columns [c0, c1)
// (read back from global memory, lane-strided then a fixed shuffle tree: deterministic), stored as
// (hi, lo) = ((float)s, (float)(s - hi)) in columns [2t, 2t + 2) of row r, t = c0 / SS_TC. One barrier
// and a warp per row here, instead of a K-long sum with three barriers in every consumer tile.
template <class C>
__device__ void mk_rms_partials(const MkInstr& in, const MkOpArgs& a, const MkSym& s) {
  __syncthreads();  // every thread's stores of the tile, before any warp reads them back
  const int R = C::rows(s), warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = in.c0 / C::SS_TC;
  for (int r = warp; r < R; r += MK_WARPS) {
    const float* o = a.out + (mk_i64)r * C::SS_OS;
    double ss = 0;
    for (int k = in.c0 + lane; k < in.c1; k += 32) {
      const float v = mk_ld(o + k);
      ss += (double)v * v;
    }
    ss = mk_warp_sum_d(ss);
    if (lane == 0) {
      const float hi = (float)ss;
      mk_st(a.ss_out + (mk_i64)r * C::SS_S + 2 * t, hi);
      mk_st(a.ss_out + (mk_i64)r * C::SS_S + 2 * t + 1, (float)(ss - (double)hi));
    }
  }
}

// layer_norm: statistics (double) over the full row, write columns [c0, c1).
template <class C>
__device__ void mk_layer_norm(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  double* red = (double*)smem;
  const int R = C::rows(s);
  for (int r = 0; r < R; ++r) {
    const float* xr = a.x + (mk_i64)r * C::XS;
    double sum = 0;
    for (int k = threadIdx.x; k < C::K; k += MK_THREADS) sum += mk_ld(xr + k);
    const double mean = mk_block_sum(sum, red) / (double)C::K;
    double var = 0;
    for (int k = threadIdx.x; k < C::K; k += MK_THREADS) {
      const double d = mk_ld(xr + k) - mean;
      var += d * d;
    }
    var = mk_block_sum(var, red) / (double)C::K;
    const double inv = 1.0 / sqrt(var + C::EPS);
    for (int k = in.c0 + threadIdx.x; k < in.c1; k += MK_THREADS) {
      const double wv = C::HAS_W ? (double)C::NormW::load1(a.norm_w, k) : 1.0;
      const double bv = C::HAS_B ? (double)C::BiasW::load1(a.bias, k) : 0.0;
      mk_st(a.out + (mk_i64)r * C::OS + k, (float)((mk_ld(xr + k) - mean) * inv * wv + bv));
    }
  }
}

// Elementwise ops: OPC 0 add, 1 mul, 2 scale, 3 silu, 4 gelu, 5 gelu_tanh, 6 softcap. y is a second activation
// or (HAS_BIAS) a weight row broadcast over rows.
template <class C>
__device__ void mk_eltwise(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  const int R = C::rows(s), nc = in.c1 - in.c0;
  for (int i = threadIdx.x; i < R * nc; i += MK_THREADS) {
    const int r = i / nc, j = in.c0 + (i - r * nc);
    const float v = mk_ld(a.x + (mk_i64)r * C::XS + j);
    float o;
    if constexpr (C::OPC == 0 || C::OPC == 1) {
      const float y = C::HAS_BIAS ? C::BiasW::load1(a.bias, j) : mk_ld(a.y + (mk_i64)r * C::YS + j);
      o = C::OPC == 0 ? v + y : v * y;
    } else if constexpr (C::OPC == 2) {
      o = v * (float)C::SCALE;
    } else if constexpr (C::OPC == 6) {
      o = (float)C::SOFTCAP * tanhf(v * (1.0f / (float)C::SOFTCAP));
    } else {
      o = mk_act<C::OPC - 2>(v);
    }
    mk_st(a.out + (mk_i64)r * C::OS + j, o);
  }
}

// rope (standalone): out[r, c0:c1] = RoPE(x[r, c0:c1]) for whole heads.
template <class C>
__device__ void mk_rope(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  float* t = (float*)smem;  // [T]
  const int R = C::rows(s), nc = in.c1 - in.c0;
  constexpr int half = C::NROT / 2;
  for (int r = 0; r < R; ++r) {
    for (int j = threadIdx.x; j < nc; j += MK_THREADS) t[j] = mk_ld(a.x + (mk_i64)r * C::XS + in.c0 + j);
    __syncthreads();
    const int pos = mk_ld_i32(a.pos + r);
    const int heads = nc / C::HD;
    for (int i = threadIdx.x; i < heads * half; i += MK_THREADS) mk_rope_pair<C>(t + (i / half) * C::HD, i % half, pos);
    __syncthreads();
    for (int j = threadIdx.x; j < nc; j += MK_THREADS) mk_st(a.out + (mk_i64)r * C::OS + in.c0 + j, t[j]);
    __syncthreads();
  }
}

// kv_store: pool[kv_slot[r], c0:c1] = x[r, c0:c1] (kv_slot rides in a.ids)
template <class C>
__device__ void mk_kv_store(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  const int R = C::rows(s), nc = in.c1 - in.c0;
  for (int i = threadIdx.x; i < R * nc; i += MK_THREADS) {
    const int r = i / nc, j = in.c0 + (i - r * nc);
    mk_st(a.out + (mk_i64)mk_ld_i32(a.ids + r) * C::OS + j, mk_ld(a.x + (mk_i64)r * C::XS + j));
  }
}

// last_row: out[i, c0:c1] = x[logit_rows[i], c0:c1] for i < n_out (logit_rows rides in a.ids)
template <class C>
__device__ void mk_last_row(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  const int R = C::rows(s), nc = in.c1 - in.c0;
  for (int i = threadIdx.x; i < R * nc; i += MK_THREADS) {
    const int r = i / nc, j = in.c0 + (i - r * nc);
    mk_st(a.out + (mk_i64)r * C::OS + j, mk_ld(a.x + (mk_i64)mk_ld_i32(a.ids + r) * C::XS + j));
  }
}

// argmax (greedy decoding on the device): out[r, 0:4] = (index of the largest x[r, 0:K], ties to
// the lowest index, NaN never wins, -1 when all are NaN; count of non-finite values; first
// non-finite index or -1; its float bits or 0), as the host's argmax and check_finite_logits
// (backend/step_batch.h GreedyRow). One tile (c0 = 0, c1 = 4);
// rows one after another; each thread scans a strided slice, then warp shuffles and one shared-memory
// round combine the records. The order of (value desc, index asc) is total on non-NaN values, so
// the result does not depend on how the slices are combined.
__device__ __forceinline__ bool mk_argmax_better(float v, int i, float bv, int bi) {
  return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}
__device__ __forceinline__ void mk_argmax_merge(float& bv, int& bi, int& nb, int& fb, float v, int i, int n, int f) {
  if (mk_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
  nb += n;
  if (f >= 0 && (fb < 0 || f < fb)) fb = f;
}
template <class C>
__device__ void mk_argmax(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  float* sv = (float*)smem;            // [MK_WARPS] best value per warp
  int* si = (int*)smem + MK_WARPS;     // [MK_WARPS] best index
  int* sn = si + MK_WARPS;             // [MK_WARPS] non-finite count
  int* sf = sn + MK_WARPS;             // [MK_WARPS] first non-finite
  const int R = C::rows(s), lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
  for (int r = 0; r < R; ++r) {
    const float* x = a.x + (mk_i64)r * C::XS;
    float bv = 0.0f;
    int bi = -1, nb = 0, fb = -1;
    for (int j = threadIdx.x; j < C::K; j += MK_THREADS) {  // ascending j: the first hit is the lowest
      const float v = mk_ld(x + j);
      if (!isfinite(v)) {
        if (fb < 0) fb = j;
        ++nb;
      }
      if (!isnan(v) && (bi < 0 || v > bv)) { bv = v; bi = j; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, bv, o);
      const int i = __shfl_xor_sync(0xffffffffu, bi, o), n = __shfl_xor_sync(0xffffffffu, nb, o),
                f = __shfl_xor_sync(0xffffffffu, fb, o);
      mk_argmax_merge(bv, bi, nb, fb, v, i, n, f);
    }
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; sn[warp] = nb; sf[warp] = fb; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < MK_WARPS; ++w) mk_argmax_merge(bv, bi, nb, fb, sv[w], si[w], sn[w], sf[w]);
      const float res[4] = {__int_as_float(bi), __int_as_float(nb), __int_as_float(fb), fb >= 0 ? mk_ld(x + fb) : 0.0f};
      for (int c = in.c0; c < in.c1; ++c) mk_st(a.out + (mk_i64)r * C::OS + c, res[c]);
    }
    __syncthreads();
  }
}

// topk (top-k sampling on the device): out[r, :] = (n_cand = min(NC, non-NaN values), count of
// non-finite values, first non-finite index or -1, its float bits or 0, then NC (index, float
// bits) pairs: the n_cand largest non-NaN x[r, 0:K] in the host sampler's order (value descending,
// ties to the lower index, -0 == +0), the rest (-1, 0)), as backend/step_batch.h topk_row. One tile
// (c0 = 0, c1 = 4 + 2 NC); rows one after another. Per row:
//  1. one pass: the non-finite counts and each thread's best value of its strided slice;
//  2. the cut L = the thread best of rank NC - 1 (each thread counts the better thread bests): at
//     least NC values are not worse than L, so the row's NC best are among them;
//  3. one pass appends the values not worse than L to shared memory (for logits about NC plus a
//     few); with fewer than NC thread bests (tiny or mostly-NaN rows) every non-NaN value;
//  4. when more than CAP qualify (many equal values), an exact radix select instead: 8 bits of an
//     order-preserving key a pass from the top, then over the indices when equal values straddle
//     the cut; one more pass appends exactly n_cand values;
//  5. each candidate's rank = the candidates better than it; ranks < NC are written. The order is
//     total on non-NaN values, so the result does not depend on the order of the appends.
#define MK_TOPK_CAP 1024
__device__ __forceinline__ bool mk_topk_better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}
__device__ __forceinline__ mk_u32 mk_topk_key(float v) {  // monotone in v; -0 and +0 share a key
  const mk_u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ void mk_topk_put(const MkInstr& in, float* row, int c, float v) {
  if (c >= in.c0 && c < in.c1) mk_st(row + c, v);
}
// Step 4: leaves exactly n_cand candidates in cv/ci and their count in sc[3]. sc[2] holds the NaN
// count; sc[6..12] the select's state (prefix, mask, still wanted, done, index prefix, index mask,
// index phase).
template <class C>
__device__ void mk_topk_radix(const float* x, int* hist, float* cv, int* ci, int* sc) {
  constexpr int NC = C::NC;
  const int t = (int)threadIdx.x;
  __syncthreads();
  if (t == 0) {
    const int nv = C::K - sc[2];
    sc[6] = 0; sc[7] = 0; sc[8] = nv < NC ? nv : NC; sc[9] = 0; sc[10] = 0; sc[11] = 0; sc[12] = 0;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {  // the value's key, from the top byte
    for (int b = t; b < 256; b += MK_THREADS) hist[b] = 0;
    __syncthreads();
    const mk_u32 prefix = (mk_u32)sc[6], mask = (mk_u32)sc[7];
    for (int j = t; j < C::K; j += MK_THREADS) {
      const float v = mk_ld(x + j);
      if (isnan(v)) continue;
      const mk_u32 key = mk_topk_key(v);
      if ((key & mask) == prefix) atomicAdd(hist + ((key >> shift) & 255u), 1);
    }
    __syncthreads();
    if (t == 0) {
      int want = sc[8], b = 255;
      for (; b > 0 && hist[b] < want; --b) want -= hist[b];
      sc[6] = (int)(prefix | ((mk_u32)b << shift)); sc[7] = (int)(mask | (255u << shift));
      sc[8] = want; sc[9] = hist[b] == want;
    }
    __syncthreads();
    if (sc[9]) break;
  }
  if (!sc[9]) {  // equal values straddle the cut: the lowest indices among them, from the top digit
    const mk_u32 key_cut = (mk_u32)sc[6];
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (shift > 0 && ((C::K - 1) >> shift) == 0) continue;  // a digit that is 0 in every index
      for (int b = t; b < 256; b += MK_THREADS) hist[b] = 0;
      __syncthreads();
      const int ip = sc[10], im = sc[11];
      for (int j = t; j < C::K; j += MK_THREADS) {
        const float v = mk_ld(x + j);
        if (!isnan(v) && mk_topk_key(v) == key_cut && (j & im) == ip) atomicAdd(hist + ((j >> shift) & 255), 1);
      }
      __syncthreads();
      if (t == 0) {
        int want = sc[8], b = 0;
        for (; b < 255 && hist[b] < want; ++b) want -= hist[b];
        sc[10] = ip | (b << shift); sc[11] = im | (255 << shift); sc[8] = want; sc[9] = hist[b] == want; sc[12] = 1;
      }
      __syncthreads();
      if (sc[9]) break;
    }
  }
  if (t == 0) sc[3] = 0;
  __syncthreads();
  const mk_u32 prefix = (mk_u32)sc[6], mask = (mk_u32)sc[7];
  const int ip = sc[10], im = sc[11], by_index = sc[12];
  for (int j = t; j < C::K; j += MK_THREADS) {
    const float v = mk_ld(x + j);
    if (isnan(v)) continue;
    const mk_u32 km = mk_topk_key(v) & mask;
    if (km > prefix || (km == prefix && (!by_index || (j & im) <= ip))) {
      const int slot = atomicAdd(sc + 3, 1);
      if (slot < MK_TOPK_CAP) { cv[slot] = v; ci[slot] = j; }
    }
  }
  __syncthreads();
}
template <class C>
__device__ void mk_topk(const MkInstr& in, const MkOpArgs& a, const MkSym& s, char* smem) {
  constexpr int NC = C::NC, CAP = MK_TOPK_CAP;
  int* hist = (int*)smem;                 // [256] the radix select's histogram
  float* tv = (float*)(hist + 256);       // [MK_THREADS] each thread's best value
  int* ti = (int*)(tv + MK_THREADS);      // [MK_THREADS] its index, -1 when none
  float* cv = (float*)(ti + MK_THREADS);  // [CAP] candidate values
  int* ci = (int*)(cv + CAP);             // [CAP] their indices
  int* sc = ci + CAP;                     // [16] non-finite count, first non-finite, NaN count, appended,
                                          // cut value bits, cut index, radix state
  if (!s.want_topk) return;  // greedy or logits step: nobody reads the candidates (uniform per block)
  const int R = C::rows(s), t = (int)threadIdx.x;
  for (int r = 0; r < R; ++r) {
    const float* x = a.x + (mk_i64)r * C::XS;
    float* o = a.out + (mk_i64)r * C::OS;
    if (t == 0) { sc[0] = 0; sc[1] = 0x7fffffff; sc[2] = 0; sc[3] = 0; sc[4] = 0; sc[5] = -1; }
    __syncthreads();
    float bv = 0.0f;
    int bi = -1, nb = 0, fb = -1, nn = 0;
    for (int j = t; j < C::K; j += MK_THREADS) {  // 1.
      const float v = mk_ld(x + j);
      if (!isfinite(v)) {
        if (fb < 0) fb = j;
        ++nb;
        if (isnan(v)) { ++nn; continue; }
      }
      if (bi < 0 || v > bv) { bv = v; bi = j; }
    }
    tv[t] = bv;
    ti[t] = bi;
    if (nb > 0) {
      atomicAdd(sc + 0, nb);
      atomicAdd(sc + 2, nn);
      for (int old = sc[1]; fb < old;) {
        const int seen = atomicCAS(sc + 1, old, fb);
        if (seen == old) break;
        old = seen;
      }
    }
    __syncthreads();
    if (bi >= 0) {  // 2.
      int rank = 0;
      for (int u = 0; u < MK_THREADS; ++u) rank += ti[u] >= 0 && mk_topk_better(tv[u], ti[u], bv, bi);
      if (rank == NC - 1) { sc[4] = (int)__float_as_uint(bv); sc[5] = bi; }
    }
    __syncthreads();
    const float cut_v = __int_as_float(sc[4]);
    const int cut_i = sc[5];
    for (int j = t; j < C::K; j += MK_THREADS) {  // 3.
      const float v = mk_ld(x + j);
      if (isnan(v) || (cut_i >= 0 && j != cut_i && !mk_topk_better(v, j, cut_v, cut_i))) continue;
      const int slot = atomicAdd(sc + 3, 1);
      if (slot < CAP) { cv[slot] = v; ci[slot] = j; }
    }
    __syncthreads();
    if (sc[3] > CAP) mk_topk_radix<C>(x, hist, cv, ci, sc);  // 4. (uniform: read after the barrier)
    const int n = sc[3], nv = C::K - sc[2], nout = nv < NC ? nv : NC;
    for (int u = t; u < n; u += MK_THREADS) {  // 5.
      int rank = 0;
      for (int w = 0; w < n; ++w) rank += mk_topk_better(cv[w], ci[w], cv[u], ci[u]);
      if (rank < NC) {
        mk_topk_put(in, o, 4 + 2 * rank, __int_as_float(ci[u]));
        mk_topk_put(in, o, 5 + 2 * rank, cv[u]);
      }
    }
    for (int q = nout + t; q < NC; q += MK_THREADS) {
      mk_topk_put(in, o, 4 + 2 * q, __int_as_float(-1));
      mk_topk_put(in, o, 5 + 2 * q, 0.0f);
    }
    if (t == 0) {
      const int first = sc[0] > 0 ? sc[1] : -1;
      mk_topk_put(in, o, 0, __int_as_float(nout));
      mk_topk_put(in, o, 1, __int_as_float(sc[0]));
      mk_topk_put(in, o, 2, __int_as_float(first));
      mk_topk_put(in, o, 3, first >= 0 ? mk_ld(x + first) : 0.0f);
    }
    __syncthreads();
  }
}

// ---- the interpreter's counter wait --------------------------------------------------------------
// Warp 0, all 32 lanes (called convergently). Lane l waits on waits l, l+32, ... of the instruction
// in order, so the last layer's q/k/v (~128 counters each) cost about 4 L2 round trips, not 128.
// Returns the same value in every lane: false (after recording the error) on timeout or when another
// block failed. Watchdog: every lane gives up once p.timeout_ns have passed since the warp started
// waiting (a deadline for the whole wait; the lanes wait at the same time). The error names the
// first stuck wait in the instruction's order, as a serial wait would: each lane stops at its first
// unreached wait, the warp takes the lowest such index, and only the lane that owns it reports
// (every lower wait was reached by its lane).
// Memory model: lane k's ld.acquire.gpu of a counter synchronizes with the producers' red.release.gpu;
// the caller's block barrier (bar.sync, after this warp's shuffles) then orders lane k before every
// thread of the block, so the producers' writes happen before any thread's later ld.global.cg of the
// data (causality order is transitive across the two scopes, the same argument as with thread 0).
__device__ bool mk_wait(const MkParams& p, const MkInstr& in, int idx) {
  if (in.n_waits == 0) return true;  // uniform across the warp
  const int lane = (int)(threadIdx.x & 31u);
  // Every lane reads the start before any lane spins (the __syncwarp; on cuda-emu the lanes run one
  // at a time, so without it a late lane would start its clock after an earlier lane's timeout).
  const mk_u64 t0 = mk_globaltimer();
  __syncwarp();
  int fail = 0x7fffffff;  // index of this lane's first unreached wait
  bool timed_out = false;
  mk_u32 v = 0, target = 0;
  int counter = 0;
  for (int w = lane; w < in.n_waits; w += 32) {
    const MkWait wt = p.waits[in.wait_begin + w];
    // Exactly the CPU interpreter's target: the counter has had `count` signals in each of the
    // steps 1..epoch (the validator guarantees count == per_step; a broken count never completes
    // and ends in the watchdog error, as on the CPU).
    target = p.epoch * wt.count;
    counter = wt.counter;
    const mk_u32* ctr = p.counters + wt.counter;
    v = mk_ld_acquire(ctr);
    for (mk_u32 spin = 1; !mk_reached(v, target); ++spin) {
      if ((spin & 63u) == 0u) {
        if (*p.abort_flag) break;
        if (mk_globaltimer() - t0 > p.timeout_ns) {
          timed_out = true;
          break;
        }
      }
      v = mk_ld_acquire(ctr);
    }
    if (!mk_reached(v, target)) {
      fail = w;
      break;
    }
  }
  int first = fail;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  if (first == 0x7fffffff) return true;
  // An aborted lane owning `first` means another block already reported: nothing to add.
  if (fail == first && timed_out) mk_report(p, 1, idx, counter, v, target);
  return false;
}
