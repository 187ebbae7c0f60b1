#!/usr/bin/env python3
"""Writes the iq4_xs fixture in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/iq4_xs/gen_iq4_xs.py

(the venv has llama-cpp-python 0.3.16, gguf and numpy). A tiny random one-layer llama whose rows are
256 wide (whole 256-element super-blocks) as f32, quantized by llama.cpp to IQ4_XS (no importance
matrix), and stored:
  tiny-iq4_xs.gguf   the quantized file as llama.cpp wrote it (its matrices iq4_xs, the rest as
                     llama.cpp chose); the f32 source is not kept
  expected.json      {"prompt_ids", "types": {tensor: type}, "logits": [n_tokens][n_vocab]}: llama.cpp's
                     logits at every position (f32 KV cache, no flash attention), the oracle of
                     tests/e2e/test_iq4_xs.cpp.
"""
import json
import os
import sys

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import llama_cpp_logits, llama_cpp_quantize, rounded, write_tiny_llama  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 128, 256, 1, 4, 2, 256, 64
PROMPT = [int(x) for x in np.random.default_rng(6).integers(3, N_VOCAB, size=20)]
rng = np.random.default_rng(98)


def main():
    src = os.path.join(HERE, "tiny.f32.gguf")
    out = os.path.join(HERE, "tiny-iq4_xs.gguf")
    write_tiny_llama(src, rng, N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX)
    types = llama_cpp_quantize(src, out, llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS)
    os.remove(src)
    logits = llama_cpp_logits(out, PROMPT, N_CTX)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": PROMPT,
                   "types": types, "logits": rounded(logits)}, f)
    print("wrote", out, sorted(set(types.values())), "argmax", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
