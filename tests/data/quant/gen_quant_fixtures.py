#!/usr/bin/env python3
"""Writes the quantization fixtures read by tests/unit/test_quant.cpp (committed; CI needs no Python).

Oracle: gguf-py (`pip install gguf numpy`, e.g. into /work/venvs/gguf), whose gguf.quants
dequantizes every ggml block type in numpy. For each type T:
  T.blocks.bin  random blocks: random quant bytes, f16 scales drawn from every finite f16 bit
                pattern plus the extremes (+-65504, +-2^-24 subnormal, +-0, 1); never NaN/inf
  T.f32.bin     gguf.quants.dequantize of those blocks (little-endian float32)
and for the types gguf-py can quantize (q4_0, q4_1, q5_0, q5_1, q8_0):
  T.qin.bin     float32 inputs (normal values, a zero block, a block of one repeated value, a huge block)
  T.qout.bin    gguf.quants.quantize of those inputs
Run: /work/venvs/gguf/bin/python tests/data/quant/gen_quant_fixtures.py
"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
# (type, offsets of the f16 scale fields in a block, number of blocks)
TYPES = [
    (T.Q4_0, [0], 24), (T.Q4_1, [0, 2], 24), (T.Q5_0, [0], 24), (T.Q5_1, [0, 2], 24), (T.Q8_0, [0], 24),
    (T.Q2_K, [80, 82], 6), (T.Q3_K, [108], 6), (T.Q4_K, [0, 2], 6), (T.Q5_K, [0, 2], 6), (T.Q6_K, [208], 6),
    (T.IQ4_NL, [0], 24), (T.IQ4_XS, [0], 6),  # appended: the types above keep their bytes (one random stream)
]
EXTREMES = [0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x8000, 0x3C00, 0x0400]


def random_f16(rng, n):
    out = []
    while len(out) < n:
        h = int(rng.integers(0, 1 << 16))
        if (h & 0x7C00) != 0x7C00:  # finite only
            out.append(h)
    return out


def main():
    rng = np.random.default_rng(20261130)
    for qt, offsets, n_blocks in TYPES:
        block_size, type_size = GGML_QUANT_SIZES[qt]
        name = qt.name.lower().replace("_k", "_K")  # iq4_nl, iq4_xs stay lower case
        blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        for b in range(n_blocks):
            for k, off in enumerate(offsets):
                # Blocks 0..7 take the extremes in turn; the rest random finite halves, mostly in a
                # realistic range so values are not all huge or tiny.
                if b < len(EXTREMES):
                    h = EXTREMES[(b + k) % len(EXTREMES)]
                elif b % 2 == 0:
                    h = random_f16(rng, 1)[0]
                else:
                    h = int(np.float16(rng.uniform(-0.05, 0.05)).view(np.uint16))
                blocks[b, off] = h & 0xFF
                blocks[b, off + 1] = h >> 8
        expected = quants.dequantize(blocks.reshape(-1), qt).astype("<f4")
        assert expected.size == n_blocks * block_size
        blocks.tofile(os.path.join(HERE, f"{name}.blocks.bin"))
        expected.tofile(os.path.join(HERE, f"{name}.f32.bin"))
        if qt in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
            x = rng.normal(0, 1, size=(8, block_size)).astype(np.float32)
            x[1] = 0
            x[2] = 0.37
            x[3] *= 1e4
            x[4] = np.round(x[4] * 4) / 4  # ties on the quantization grid
            q = quants.quantize(x.reshape(1, -1), qt).reshape(-1)
            x.astype("<f4").tofile(os.path.join(HERE, f"{name}.qin.bin"))
            q.tofile(os.path.join(HERE, f"{name}.qout.bin"))
        print(name, n_blocks, "blocks")


if __name__ == "__main__":
    main()
