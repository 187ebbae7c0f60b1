// ---- quant.cuh: ggml block types of weights, dequantized in registers ---------------------------
// Block layouts as the ggml/GGUF type table defines them (ggml-common.h `block_*`, gguf-py
// GGML_QUANT_SIZES; the table in src/quant/quant.h). On the device a quantized tensor keeps its raw
// GGUF blocks; only each row starts at a multiple of 16 bytes (row stride WRS = row bytes rounded up
// to 16, codegen's device_row_bytes), and the allocation has 256 bytes of slack after it.
//
// A matmul lane reads a *unit* of UB whole blocks of one row (UQ = UB * QK elements) with NCH 16-byte
// loads (mk_ldw16) from the 16-byte boundary at or before the unit, all issued before any is used;
// UB is chosen so that UB * BYTES is a multiple of 16 where that stays small (q4_0, q4_1, q5_0, q5_1,
// q4_K, q5_K: units always 16-byte aligned), else the window is one chunk longer and mk_q_load
// realigns it in registers (q8_0, q2_K, q3_K, q6_K: the unit starts at byte s = offset & 15 of the
// window; shifting by 8 and 4 bytes is a select per word, by 2 bytes a funnel of two words).
// deq32(w, o, g, y): the 32 elements of group g (g < QK / 32) of the block at byte o of the unit's
// words w, computed as ggml's dequantize_row_* computes them (src/quant/*.cpp). With every index a
// compile-time constant after unrolling, w stays in registers.

// Byte j, the f16 at byte j (j even) and the little-endian u32 at byte j (j even) of words w.
__device__ __forceinline__ mk_u32 mk_qb(const mk_u32* w, int j) { return (w[j >> 2] >> ((j & 3) * 8)) & 0xffu; }
__device__ __forceinline__ float mk_qf16(const mk_u32* w, int j) {
  return mk_f16((unsigned short)((w[j >> 2] >> ((j & 2) * 8)) & 0xffffu));
}
__device__ __forceinline__ mk_u32 mk_qu32(const mk_u32* w, int j) {
  return (j & 3) == 0 ? w[j >> 2] : (w[j >> 2] >> 16) | (w[(j >> 2) + 1] << 16);
}

// (float)q - BIAS for 0 <= q < 2^23 without an int-to-float conversion (I2F issues at a quarter of
// the FP32 rate): q in the mantissa of 2^23, then one exact subtraction. Same value as the cast.
template <int BIAS>
__device__ __forceinline__ float mk_q2f(mk_u32 q) {
  return __uint_as_float(0x4B000000u | q) - (8388608.0f + (float)BIAS);
}

// q4_0: { f16 d; u8 qs[16] }, 18 bytes; element j < 16 low nibble of qs[j], j + 16 high; d * (q - 8).
struct MkQ4_0 {
  static constexpr bool kQuant = true;
  static constexpr int QK = 32, BYTES = 18, UB = 8;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const mk_u32 q = mk_qb(w, o + 2 + j);
      y[j] = d * mk_q2f<8>(q & 15u);
      y[j + 16] = d * mk_q2f<8>(q >> 4);
    }
  }
};
// q4_1: { f16 d; f16 m; u8 qs[16] }, 20 bytes; nibbles as q4_0; d * q + m.
struct MkQ4_1 {
  static constexpr bool kQuant = true;
  static constexpr int QK = 32, BYTES = 20, UB = 4;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o), m = mk_qf16(w, o + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const mk_u32 q = mk_qb(w, o + 4 + j);
      y[j] = d * mk_q2f<0>(q & 15u) + m;
      y[j + 16] = d * mk_q2f<0>(q >> 4) + m;
    }
  }
};
// q5_0: { f16 d; u8 qh[4]; u8 qs[16] }, 22 bytes; bit j of qh is element j's 5th bit; d * (q - 16).
struct MkQ5_0 {
  static constexpr bool kQuant = true;
  static constexpr int QK = 32, BYTES = 22, UB = 8;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o);
    const mk_u32 qh = mk_qu32(w, o + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const mk_u32 q = mk_qb(w, o + 6 + j);
      y[j] = d * mk_q2f<16>((q & 15u) | (((qh >> j) & 1u) << 4));
      y[j + 16] = d * mk_q2f<16>((q >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
  }
};
// q5_1: { f16 d; f16 m; u8 qh[4]; u8 qs[16] }, 24 bytes; bits as q5_0; d * q + m.
struct MkQ5_1 {
  static constexpr bool kQuant = true;
  static constexpr int QK = 32, BYTES = 24, UB = 4;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o), m = mk_qf16(w, o + 2);
    const mk_u32 qh = mk_qu32(w, o + 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const mk_u32 q = mk_qb(w, o + 8 + j);
      y[j] = d * mk_q2f<0>((q & 15u) | (((qh >> j) & 1u) << 4)) + m;
      y[j + 16] = d * mk_q2f<0>((q >> 4) | (((qh >> (j + 16)) & 1u) << 4)) + m;
    }
  }
};
// q8_0: { f16 d; i8 qs[32] }, 34 bytes; q * d.
struct MkQ8_0 {
  static constexpr bool kQuant = true;
  static constexpr int QK = 32, BYTES = 34, UB = 4;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o);
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = mk_q2f<128>(mk_qb(w, o + 2 + j) ^ 0x80u) * d;  // (i8) q
  }
};
// iq4_nl: { f16 d; u8 qs[16] }, 18 bytes; nibbles as q4_0, each an index into ggml's
// kvalues_iq4nl; d * kvalues_iq4nl[q].
__constant__ float mk_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
struct MkIQ4_NL {
  static constexpr bool kQuant = true;
  static constexpr int QK = 32, BYTES = 18, UB = 8;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const mk_u32 q = mk_qb(w, o + 2 + j);
      y[j] = d * mk_kvalues_iq4nl[q & 15u];
      y[j + 16] = d * mk_kvalues_iq4nl[q >> 4];
    }
  }
};
// iq4_xs: { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }, 136 bytes, 256 elements. Sub-block g:
// 6-bit scale ls = nibble g % 2 of scales_l[g / 2] | (bits 2g..2g+1 of scales_h) << 4; element l < 16
// the low nibble of qs[16 g + l], l + 16 its high nibble; (d * (ls - 32)) * kvalues_iq4nl[q].
struct MkIQ4_XS {
  static constexpr bool kQuant = true;
  static constexpr int QK = 256, BYTES = 136, UB = 1;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const mk_u32 ls = ((mk_qb(w, o + 4 + (g >> 1)) >> (4 * (g & 1))) & 15u) |
                      ((((mk_qb(w, o + 2) | (mk_qb(w, o + 3) << 8)) >> (2 * g)) & 3u) << 4);
    const float dl = mk_qf16(w, o) * static_cast<float>(static_cast<int>(ls) - 32);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const mk_u32 q = mk_qb(w, o + 8 + 16 * g + j);
      y[j] = dl * mk_kvalues_iq4nl[q & 15u];
      y[j + 16] = dl * mk_kvalues_iq4nl[q >> 4];
    }
  }
};
// q2_K: { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }, 84 bytes, 256 elements. Group g: nb = g / 4,
// j = g % 4; element 16 h + l is bits 2j..2j+1 of qs[32 nb + 16 h + l], sub-block 8 nb + 2 j + h
// (scale: low nibble, min: high nibble); (d * sc) * q - (dmin * m).
struct MkQ2_K {
  static constexpr bool kQuant = true;
  static constexpr int QK = 256, BYTES = 84, UB = 1;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o + 80), dmin = mk_qf16(w, o + 82);
    const int nb = g >> 2, j = g & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const mk_u32 sc = mk_qb(w, o + 8 * nb + 2 * j + h);
      const float dl = d * (float)(sc & 15u), ml = dmin * (float)(sc >> 4);
#pragma unroll
      for (int l = 0; l < 16; ++l) y[16 * h + l] = dl * mk_q2f<0>((mk_qb(w, o + 16 + 32 * nb + 16 * h + l) >> (2 * j)) & 3u) - ml;
    }
  }
};
// q3_K: { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }, 110 bytes. Group g (nb, j as q2_K):
// element 16 h + l has low bits 2j..2j+1 of qs[32 nb + 16 h + l], high bit 4 nb + j of hmask[16 h + l]
// (clear: subtract 4); 6-bit scale k = 8 nb + 2 j + h stored minus 32; (d * (sc - 32)) * q.
struct MkQ3_K {
  static constexpr bool kQuant = true;
  static constexpr int QK = 256, BYTES = 110, UB = 1;
  __device__ static __forceinline__ int scale6(const mk_u32* w, int o, int k) {
    const int lo = (int)(k < 8 ? (mk_qb(w, o + 96 + k) & 15u) : (mk_qb(w, o + 96 + k - 8) >> 4));
    const int hi = (int)((mk_qb(w, o + 104 + (k & 3)) >> (2 * (k >> 2))) & 3u);
    return (lo | (hi << 4)) - 32;
  }
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o + 108);
    const int nb = g >> 2, j = g & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float dl = d * (float)scale6(w, o, 8 * nb + 2 * j + h);
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        const mk_u32 lo = (mk_qb(w, o + 32 + 32 * nb + 16 * h + l) >> (2 * j)) & 3u;
        const mk_u32 hb = (mk_qb(w, o + 16 * h + l) >> (4 * nb + j)) & 1u;
        y[16 * h + l] = dl * mk_q2f<4>(lo | (hb << 2));  // lo - 4 when the high bit is clear
      }
    }
  }
};
// The 6-bit scale and min j of q4_K / q5_K (ggml get_scale_min_k4) from the 12 bytes at s.
__device__ __forceinline__ void mk_scale_min_k4(const mk_u32* w, int s, int j, float* sc, float* m) {
  if (j < 4) {
    *sc = (float)(mk_qb(w, s + j) & 63u);
    *m = (float)(mk_qb(w, s + j + 4) & 63u);
  } else {
    *sc = (float)((mk_qb(w, s + j + 4) & 15u) | ((mk_qb(w, s + j - 4) >> 6) << 4));
    *m = (float)((mk_qb(w, s + j + 4) >> 4) | ((mk_qb(w, s + j) >> 6) << 4));
  }
}
// q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }, 144 bytes. Group g = 2 c + h: element l is
// nibble h of qs[32 c + l]; (d * sc) * q - (dmin * m).
struct MkQ4_K {
  static constexpr bool kQuant = true;
  static constexpr int QK = 256, BYTES = 144, UB = 1;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    float sc, m;
    mk_scale_min_k4(w, o + 4, g, &sc, &m);
    const float d1 = mk_qf16(w, o) * sc, m1 = mk_qf16(w, o + 2) * m;
    const int c = g >> 1, h = g & 1;
#pragma unroll
    for (int l = 0; l < 32; ++l) y[l] = d1 * mk_q2f<0>((mk_qb(w, o + 16 + 32 * c + l) >> (4 * h)) & 15u) - m1;
  }
};
// q5_K: as q4_K plus qh[32] at byte 16 (bit g of qh[l] is the 5th bit), qs at byte 48; 176 bytes.
struct MkQ5_K {
  static constexpr bool kQuant = true;
  static constexpr int QK = 256, BYTES = 176, UB = 1;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    float sc, m;
    mk_scale_min_k4(w, o + 4, g, &sc, &m);
    const float d1 = mk_qf16(w, o) * sc, m1 = mk_qf16(w, o + 2) * m;
    const int c = g >> 1, h = g & 1;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const mk_u32 q = ((mk_qb(w, o + 48 + 32 * c + l) >> (4 * h)) & 15u) | (((mk_qb(w, o + 16 + l) >> g) & 1u) << 4);
      y[l] = d1 * mk_q2f<0>(q) - m1;
    }
  }
};
// q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }, 210 bytes. Group g: nb = g / 4, t = g % 4;
// element l: low 4 bits = nibble t / 2 of ql[64 nb + 32 (t % 2) + l], top 2 bits = bits 2t..2t+1 of
// qh[32 nb + l], sub-block 8 nb + 2 t + l / 16; (d * sc) * (q - 32).
struct MkQ6_K {
  static constexpr bool kQuant = true;
  static constexpr int QK = 256, BYTES = 210, UB = 1;
  __device__ static __forceinline__ void deq32(const mk_u32* w, int o, int g, float* y) {
    const float d = mk_qf16(w, o + 208);
    const int nb = g >> 2, t = g & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float s = d * (float)(signed char)mk_qb(w, o + 192 + 8 * nb + 2 * t + half);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * half + i;
        const mk_u32 lo = (mk_qb(w, o + 64 * nb + 32 * (t & 1) + l) >> (4 * (t >> 1))) & 15u;
        const mk_u32 hi = (mk_qb(w, o + 128 + 32 * nb + l) >> (2 * t)) & 3u;
        y[l] = s * mk_q2f<32>(lo | (hi << 4));
      }
    }
  }
};

// Unit geometry of block type W: UQ elements and UBYTES bytes per unit; GRAN = the alignment of unit
// offsets within a row (1, 2, 4, 8 or 16 bytes); NCH = 16-byte loads per unit (one more than the
// unit's own size when it may start inside a chunk), NWORDS = 4 NCH.
template <class W>
struct MkQUnit {
  static constexpr int UQ = W::UB * W::QK, UBYTES = W::UB * W::BYTES;
  static constexpr int GRAN = (UBYTES & -UBYTES) >= 16 ? 16 : (UBYTES & -UBYTES);
  static constexpr int NCH = (16 - GRAN + UBYTES + 15) / 16, NWORDS = 4 * NCH;
  static_assert(GRAN >= 2, "block sizes are even");
};

// Loads unit u of the row at `row` (16-byte aligned) into w: NCH independent 16-byte loads, then the
// realignment so that w[0] holds the unit's first 4 bytes. Words past the loaded window are zero.
template <class W>
__device__ __forceinline__ void mk_q_load(const char* row, int u, mk_u32 (&w)[MkQUnit<W>::NWORDS]) {
  using U = MkQUnit<W>;
  const int o = u * U::UBYTES, s = o & 15;
  const char* p = row + (o - s);
#pragma unroll
  for (int i = 0; i < U::NCH; ++i) {
    const uint4 v = mk_ldw16(p + 16 * i);
    w[4 * i] = v.x;
    w[4 * i + 1] = v.y;
    w[4 * i + 2] = v.z;
    w[4 * i + 3] = v.w;
  }
  // All NCH loads in flight before any arithmetic: ptxas otherwise issued a few, started
  // dequantizing the first block and loaded the rest into the registers that freed (SASS, issue 8:
  // q4_1's 5 loads as 3 + 2, q4_K's 9 as 3 + 2 + 2 + 2). Chunk 0's words (the block scales come
  // first) take a dependency on a word of every other chunk, masked by a zero the compiler cannot
  // prove (the row address's top bit): 2-5 logic ops per unit, no change to any value.
  if constexpr (U::NCH > 1) {
    mk_u32 dep = 0u;
#pragma unroll
    for (int i = 1; i < U::NCH; ++i) dep ^= w[4 * i];
    dep &= (mk_u32)((unsigned long long)row >> 63);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] ^= dep;
  }
  if constexpr (U::GRAN <= 8) {
    const bool by8 = (s & 8) != 0;
#pragma unroll
    for (int i = 0; i < U::NWORDS; ++i) w[i] = by8 ? (i + 2 < U::NWORDS ? w[i + 2] : 0u) : w[i];
  }
  if constexpr (U::GRAN <= 4) {
    const bool by4 = (s & 4) != 0;
#pragma unroll
    for (int i = 0; i < U::NWORDS; ++i) w[i] = by4 ? (i + 1 < U::NWORDS ? w[i + 1] : 0u) : w[i];
  }
  if constexpr (U::GRAN <= 2) {
    const bool by2 = (s & 2) != 0;
#pragma unroll
    for (int i = 0; i < U::NWORDS; ++i) w[i] = by2 ? (w[i] >> 16) | (i + 1 < U::NWORDS ? w[i + 1] << 16 : 0u) : w[i];
  }
}

// The 32 elements [32 g, 32 g + 32) of row `row` (16-byte aligned) of block type W, for lookups
// (embed): the block is read with 2-byte loads (its offset in the row is only 2-byte aligned).
template <class W>
__device__ __forceinline__ void mk_q_group(const char* row, int g, float* y) {
  constexpr int NW = (W::BYTES + 3) / 4, GPB = W::QK / 32;
  const char* blk = row + (mk_i64)(g / GPB) * W::BYTES;
  mk_u32 w[NW];
#pragma unroll
  for (int i = 0; i < NW; ++i) w[i] = 0u;
#pragma unroll
  for (int t = 0; t < W::BYTES / 2; ++t) w[t >> 1] |= (mk_u32)mk_ldw16bit(blk + 2 * t) << (16 * (t & 1));
  W::deq32(w, 0, g % GPB, y);
}
