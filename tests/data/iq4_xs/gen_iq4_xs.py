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
                     tests/e2e/test_iq4.cpp.
"""
import os
import sys

import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import quantized_llama_fixture  # noqa: E402

# n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx
DIMS = (128, 256, 1, 4, 2, 256, 64)

if __name__ == "__main__":
    quantized_llama_fixture(HERE, "tiny-iq4_xs.gguf", DIMS, weight_seed=98, prompt_seed=6, ftype=llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS)
