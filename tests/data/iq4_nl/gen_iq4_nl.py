#!/usr/bin/env python3
"""Writes the iq4_nl fixture in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/iq4_nl/gen_iq4_nl.py

(the venv has llama-cpp-python 0.3.16, gguf and numpy). llama.cpp's quantizer writes iq4_nl for the
rows of a Q2_K, Q3_K_* or IQ4_XS file that are not whole 256-element super-blocks (SmolLM2-135M's
576-wide rows, for one). This builds a tiny random llama whose rows are 96 and 160 wide (multiples
of 32, not of 256) as f32, has llama.cpp quantize it to Q3_K_M, and stores:
  tiny-q3_k_m.gguf   the quantized file as llama.cpp wrote it (its matrices iq4_nl, the rest as llama.cpp
                     chose); the f32 source is not kept
  expected.json      {"prompt_ids", "types": {tensor: type}, "logits": [n_tokens][n_vocab]}: llama.cpp's
                     logits at every position (f32 KV cache, no flash attention), the oracle of
                     tests/e2e/test_iq4.cpp.
"""
import os
import sys

import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import quantized_llama_fixture  # noqa: E402

# n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx
DIMS = (128, 96, 2, 4, 2, 160, 64)

if __name__ == "__main__":
    quantized_llama_fixture(HERE, "tiny-q3_k_m.gguf", DIMS, weight_seed=97, prompt_seed=5, ftype=llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M)
