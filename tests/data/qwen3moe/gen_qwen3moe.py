#!/usr/bin/env python3
"""Writes tiny mixture-of-experts models in this folder and llama.cpp's logits for them (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/qwen3moe/gen_qwen3moe.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  qwen3moe-tiny.f32.gguf   GGUF arch `qwen3moe` as llama.cpp's convert_hf_to_gguf.py (Qwen3MoeModel)
                           writes it: qwen3 attention (per-head q/k RMSNorm, NEOX RoPE), every layer's FFN
                           8 experts, 2 used per token (expert_count, expert_used_count,
                           expert_feed_forward_length), ffn_gate_inp [n_expert, n_embd], ffn_{gate,up}_exps
                           [n_expert, n_ff_exp, n_embd], ffn_down_exps [n_expert, n_embd, n_ff_exp]; f32.
  mixtral-tiny.f32.gguf    GGUF arch `llama` with experts (Mixtral's layout: adjacent-pair RoPE, no q/k
                           norms), 4 experts, 2 used, the same FFN tensors; f32.
  qwen3moe-tiny.q8_0.gguf  qwen3moe-tiny quantized by llama.cpp (Q8_0: the expert matrices q8_0).
  expected.json            llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt for
                           qwen3moe-tiny, and under "mixtral" / "q8_0" for the other two.
"""
import json
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import (add_placeholder_vocab, finish_gguf, llama_cpp_logits, llama_cpp_quantize, rounded,  # noqa: E402
                        write_expected)

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_FF_EXP = 128, 64, 3, 4, 2, 16, 96, 32
N_CTX_TRAIN, EPS, THETA = 64, 1e-6, 10000.0
PROMPT = [int(x) for x in np.random.default_rng(21).integers(3, N_VOCAB, size=24)]


def rand(rng, *shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


def write_moe(path, arch, n_expert, n_used, qk_norm, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.context_length", N_CTX_TRAIN)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.block_count", N_LAYER)
    w.add_uint32(f"{arch}.feed_forward_length", N_FF if qk_norm else N_FF_EXP)
    w.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    w.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{arch}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{arch}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{arch}.rope.freq_base", THETA)
    w.add_uint32(f"{arch}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{arch}.expert_count", n_expert)
    w.add_uint32(f"{arch}.expert_used_count", n_used)
    if qk_norm:
        w.add_uint32(f"{arch}.expert_feed_forward_length", N_FF_EXP)
    add_placeholder_vocab(w, N_VOCAB)
    t = {"token_embd.weight": rand(rng, N_VOCAB, N_EMBD, std=0.5), "output_norm.weight": 1 + rand(rng, N_EMBD, std=0.1),
         "output.weight": rand(rng, N_VOCAB, N_EMBD, std=0.2)}
    for il in range(N_LAYER):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = 1 + rand(rng, N_EMBD, std=0.1)
        t[p + "attn_q.weight"] = rand(rng, N_HEAD * HEAD_DIM, N_EMBD, std=0.3)
        t[p + "attn_k.weight"] = rand(rng, N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.3)
        t[p + "attn_v.weight"] = rand(rng, N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
        t[p + "attn_output.weight"] = rand(rng, N_EMBD, N_HEAD * HEAD_DIM, std=0.15)
        if qk_norm:
            t[p + "attn_q_norm.weight"] = 1 + rand(rng, HEAD_DIM, std=0.2)
            t[p + "attn_k_norm.weight"] = 1 + rand(rng, HEAD_DIM, std=0.2)
        t[p + "ffn_norm.weight"] = 1 + rand(rng, N_EMBD, std=0.1)
        # a router with some spread, so that every row's choice is clear of ties
        t[p + "ffn_gate_inp.weight"] = rand(rng, n_expert, N_EMBD, std=0.4)
        t[p + "ffn_gate_exps.weight"] = rand(rng, n_expert, N_FF_EXP, N_EMBD, std=0.25)
        t[p + "ffn_up_exps.weight"] = rand(rng, n_expert, N_FF_EXP, N_EMBD, std=0.25)
        t[p + "ffn_down_exps.weight"] = rand(rng, n_expert, N_EMBD, N_FF_EXP, std=0.25)
    for name, v in t.items():
        w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))
    finish_gguf(w)


def main():
    import llama_cpp

    qwen = os.path.join(HERE, "qwen3moe-tiny.f32.gguf")
    mixtral = os.path.join(HERE, "mixtral-tiny.f32.gguf")
    q8 = os.path.join(HERE, "qwen3moe-tiny.q8_0.gguf")
    write_moe(qwen, "qwen3moe", 8, 2, True, 4343)
    write_moe(mixtral, "llama", 4, 2, False, 4444)
    types = llama_cpp_quantize(qwen, q8, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0)
    extra = {"mixtral": {"logits": rounded(llama_cpp_logits(mixtral, PROMPT, N_CTX_TRAIN))},
             "q8_0": {"types": types, "logits": rounded(llama_cpp_logits(q8, PROMPT, N_CTX_TRAIN))}}
    write_expected(HERE, qwen, PROMPT, N_CTX_TRAIN, **extra)


if __name__ == "__main__":
    main()
