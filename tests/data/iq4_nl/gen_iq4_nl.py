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
                     tests/e2e/test_iq4_nl.cpp.
"""
import ctypes
import json
import os
import sys

import numpy as np
import gguf
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, llama_cpp_logits, rounded  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 128, 96, 2, 4, 2, 160, 64
HEAD_DIM = N_EMBD // N_HEAD
PROMPT = [int(x) for x in np.random.default_rng(5).integers(3, N_VOCAB, size=20)]
rng = np.random.default_rng(97)


def mat(n_out, n_in, gain=1.5):
    return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)


def norm_w(n):
    return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def write_f32(path):
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.context_length", N_CTX)
    w.add_uint32("llama.embedding_length", N_EMBD)
    w.add_uint32("llama.block_count", N_LAYER)
    w.add_uint32("llama.feed_forward_length", N_FF)
    w.add_uint32("llama.attention.head_count", N_HEAD)
    w.add_uint32("llama.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32("llama.rope.dimension_count", HEAD_DIM)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    add_placeholder_vocab(w, N_VOCAB)
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    w.add_tensor("output_norm.weight", norm_w(N_EMBD))
    w.add_tensor("output.weight", mat(N_VOCAB, N_EMBD, 4.0))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm_w(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_EMBD, 1.0))
        w.add_tensor(p + "ffn_norm.weight", norm_w(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF, 1.0))
    finish_gguf(w)


def main():
    src = os.path.join(HERE, "tiny.f32.gguf")
    out = os.path.join(HERE, "tiny-q3_k_m.gguf")
    write_f32(src)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params))
    os.remove(src)
    assert rc == 0, rc
    types = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(out).tensors}
    logits = llama_cpp_logits(out, PROMPT, N_CTX)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": PROMPT,
                   "types": types, "logits": rounded(logits)}, f)
    print("wrote", out, sorted(set(types.values())), "argmax", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
