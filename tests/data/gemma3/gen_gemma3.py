#!/usr/bin/env python3
"""Writes the tiny Gemma 3 fixtures in this folder and llama.cpp's logits for them (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/gemma3/gen_gemma3.py

(the venv has llama-cpp-python 0.3.16, gguf and numpy; see docs/architectures.md). Outputs, next to
this script:
  gemma3-tiny.f32.gguf   GGUF arch `gemma3` as llama.cpp's convert_hf_to_gguf.py writes it: GGUF tensor
                         names, every norm weight stored as 1 + w, keys gemma3.attention.sliding_window
                         etc.; f32 weights; a placeholder SentencePiece vocabulary
                         (llama.cpp needs one for n_vocab).
  hf/config.json, hf/model.safetensors
                         the same weights in the transformers Gemma3ForCausalLM layout
                         (model_type gemma3_text, HF tensor names, norm weights w).
  expected.json          {"prompt_ids", "logits": [n_tokens][n_vocab]}: llama.cpp's logits at every
                         position (f32 KV cache, no flash attention), the oracle of tests/e2e/test_gemma3.cpp.

Shape: 6 layers (pattern 6: layers 0-4 local with a window of 8 positions, layer 5 global), n_embd 32,
2 query heads / 1 KV head of 16, n_ff 64, vocab 128, a 24-token prompt: the window matters for 16 of
the 24 rows, and the local/global RoPE bases (10000 / 1e6) differ.
"""
import json
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, llama_cpp_logits, rounded, write_hf as write_hf_dir  # noqa: E402
N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 128, 32, 6, 2, 1, 16, 64
WINDOW, N_CTX_TRAIN, EPS = 8, 128, 1e-6
THETA_GLOBAL, THETA_LOCAL = 1_000_000.0, 10_000.0
PROMPT = [int(x) for x in np.random.default_rng(7).integers(1, N_VOCAB, size=24)]

rng = np.random.default_rng(1234)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


# HF-layout weights (PyTorch shapes [n_out, n_in]); Gemma3RMSNorm weights w (applied as 1 + w).
hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": rand(N_EMBD, std=0.1)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        hf[p + n + ".weight"] = rand(N_EMBD, std=0.1)
    hf[p + "self_attn.q_proj.weight"] = rand(N_HEAD * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.k_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.v_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.o_proj.weight"] = rand(N_EMBD, N_HEAD * HEAD_DIM, std=0.2)
    hf[p + "self_attn.q_norm.weight"] = rand(HEAD_DIM, std=0.1)
    hf[p + "self_attn.k_norm.weight"] = rand(HEAD_DIM, std=0.1)
    hf[p + "mlp.gate_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.up_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.down_proj.weight"] = rand(N_EMBD, N_FF, std=0.2)

GGUF_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(name):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    _, _, il, rest = name.split(".", 3)
    part = rest.rsplit(".", 1)[0]
    return f"blk.{il}.{GGUF_PARTS[part]}.weight"


def write_gguf(path):
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_uint32("gemma3.context_length", N_CTX_TRAIN)
    w.add_uint32("gemma3.embedding_length", N_EMBD)
    w.add_uint32("gemma3.block_count", N_LAYER)
    w.add_uint32("gemma3.feed_forward_length", N_FF)
    w.add_uint32("gemma3.attention.head_count", N_HEAD)
    w.add_uint32("gemma3.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32("gemma3.attention.key_length", HEAD_DIM)
    w.add_uint32("gemma3.attention.value_length", HEAD_DIM)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", EPS)
    w.add_float32("gemma3.rope.freq_base", THETA_GLOBAL)
    w.add_uint32("gemma3.attention.sliding_window", WINDOW)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        if name.endswith("norm.weight"):
            t = t + np.float32(1.0)  # convert_hf_to_gguf.py Gemma3Model: norm_shift
        w.add_tensor(gguf_name(name), t.astype(np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "head_dim": HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": N_CTX_TRAIN, "rms_norm_eps": EPS,
        "rope_theta": THETA_GLOBAL, "rope_local_base_freq": THETA_LOCAL, "rope_scaling": None,
        "sliding_window": WINDOW, "sliding_window_pattern": 6, "query_pre_attn_scalar": HEAD_DIM,
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "tie_word_embeddings": True,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "gemma3-tiny.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    logits = llama_cpp_logits(path, PROMPT, 64)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": PROMPT,
                   "window": WINDOW, "logits": rounded(logits)}, f)
    print("wrote", path, "logits", logits.shape, "argmax", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
