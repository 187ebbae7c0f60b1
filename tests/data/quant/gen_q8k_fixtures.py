#!/usr/bin/env python3
"""Writes the q8_K fixtures read by tests/unit/test_quant.cpp (committed; CI needs no Python).

Oracle: llama.cpp's own CPU code, called through ctypes from the libggml-cpu.so that
llama-cpp-python 0.3.16 builds (bench/llamacpp_compare.sh makes that venv; x86 build with AVX2):
`ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float` (quantize_row_q8_K) and, per K-quant type,
`ggml_get_type_traits_cpu(T)->vec_dot` (ggml_vec_dot_T_q8_K, arch/x86/quants.c AVX2 path).
  q8_K.in.bin     float32 activations [4 rows, 1536]: normal values; a zero block, a tie block
                  (max -127: scale 1, halves round to even) and a huge block; uniform; tiny values
  q8_K.out.bin    ggml's q8_K blocks of those rows (292 bytes per 256: d f32, qs i8[256], bsums
                  i16[16]); the output buffer is zeroed first (ggml leaves bsums of a zero block unset)
  T.wrand.bin     6 random T blocks with realistic f16 scales (the committed T.blocks.bin, 6 blocks
                  with extreme scales, is the other weight row)
  T.dot_q8K.bin   float32 [2 weight rows (blocks.bin, wrand.bin), 4 activation rows]: vec_dot
Run: ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/quant/gen_q8k_fixtures.py
"""
import ctypes
import glob
import os

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
# (name, ggml id, bytes per block, offsets of the f16 scale fields)
TYPES = [("q2_K", 10, 84, [80, 82]), ("q3_K", 11, 110, [108]), ("q4_K", 12, 144, [0, 2]),
         ("q5_K", 13, 176, [0, 2]), ("q6_K", 14, 210, [208]), ("iq4_xs", 23, 136, [0])]
Q8_K, N, ROWS = 15, 1536, 4


class Traits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


def main():
    ctypes.CDLL(os.path.join(LIB, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(glob.glob(os.path.join(LIB, "libggml-cpu.so"))[0])
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        cpu.ggml_get_type_traits_cpu(Q8_K).contents.from_float)
    vec_dot_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    rng = np.random.default_rng(20261201)
    x = np.zeros((ROWS, N), dtype=np.float32)
    x[0] = rng.normal(0, 1, N)
    x[1] = rng.normal(0, 1, N)
    x[1, 256:512] = 0  # a zero block
    x[1, 512:768] = np.round(rng.uniform(-120, 120, 256)) + 0.5  # ties at scale 1
    x[1, 512 + 7] = -127.0
    x[1, 768:1024] *= 3e4  # a huge block
    x[2] = rng.uniform(-3, 3, N)
    x[3] = rng.normal(0, 1e-3, N)
    x[3, 5] = 0.5  # one outlier: most values round to 0 or +-1
    xq = np.zeros((ROWS, N // 256 * 292), dtype=np.uint8)
    for r in range(ROWS):
        from_float(x[r].ctypes.data, xq[r].ctypes.data, N)
    x.astype("<f4").tofile(os.path.join(HERE, "q8_K.in.bin"))
    xq.tofile(os.path.join(HERE, "q8_K.out.bin"))

    for name, gid, nbytes, offsets in TYPES:
        extreme = np.fromfile(os.path.join(HERE, f"{name}.blocks.bin"), dtype=np.uint8)
        assert extreme.size == 6 * nbytes
        wr = rng.integers(0, 256, size=(6, nbytes), dtype=np.uint8)
        for b in range(6):
            for off in offsets:
                h = int(np.float16(rng.uniform(-0.05, 0.05) if off in (0, 80, 108, 208) else rng.uniform(0, 0.05))
                        .view(np.uint16))
                wr[b, off], wr[b, off + 1] = h & 0xFF, h >> 8
        wr = wr.reshape(-1)
        wr.tofile(os.path.join(HERE, f"{name}.wrand.bin"))
        vec_dot = vec_dot_t(cpu.ggml_get_type_traits_cpu(gid).contents.vec_dot)
        out = np.zeros((2, ROWS), dtype=np.float32)
        for w, row in enumerate((extreme, wr)):
            for r in range(ROWS):
                s = ctypes.c_float()
                vec_dot(N, ctypes.byref(s), 0, row.ctypes.data, 0, xq[r].ctypes.data, 0, 1)
                out[w, r] = s.value
        out.astype("<f4").tofile(os.path.join(HERE, f"{name}.dot_q8K.bin"))
        print(name, out.tolist())


if __name__ == "__main__":
    main()
