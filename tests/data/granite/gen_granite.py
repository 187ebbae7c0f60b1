#!/usr/bin/env python3
"""Writes a tiny Granite in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/granite/gen_granite.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  granite-tiny.f32.gguf  GGUF arch `granite` as llama.cpp's convert_hf_to_gguf.py (GraniteModel, a
                         LlamaModel) writes it: q/k rows permuted for RoPE on adjacent pairs, tied
                         classifier (no output.weight), the multipliers as granite.embedding_scale,
                         attention.scale, residual_scale, logit_scale (Granite 3's values); f32.
  hf/config.json, hf/model.safetensors
                         the same weights as a transformers GraniteForCausalLM directory.
  expected.json          llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt.
"""
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, gguf_tensor_name, write_expected, write_hf as write_hf_dir  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 128, 64, 8, 4, 2, 16, 128
N_CTX_TRAIN, EPS, THETA = 64, 1e-6, 10000.0
EMBEDDING, ATTENTION, RESIDUAL, LOGITS = 12.0, 0.0078125, 0.22, 8.0  # Granite 3.x's multipliers
PROMPT = [int(x) for x in np.random.default_rng(13).integers(3, N_VOCAB, size=24)]

rng = np.random.default_rng(3131)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.05), "model.norm.weight": 1 + rand(N_EMBD, std=0.1)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    hf[p + "input_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "post_attention_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "self_attn.q_proj.weight"] = rand(N_HEAD * HEAD_DIM, N_EMBD, std=1.0)
    hf[p + "self_attn.k_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=1.0)
    hf[p + "self_attn.v_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.o_proj.weight"] = rand(N_EMBD, N_HEAD * HEAD_DIM, std=0.15)
    hf[p + "mlp.gate_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.up_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.down_proj.weight"] = rand(N_EMBD, N_FF, std=0.15)

GGUF_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(name):
    return gguf_tensor_name(name, {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}, GGUF_PARTS)


def permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute: each head's rotate_half pairs made adjacent."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path):
    w = gguf.GGUFWriter(path, "granite")
    w.add_uint32("granite.context_length", N_CTX_TRAIN)
    w.add_uint32("granite.embedding_length", N_EMBD)
    w.add_uint32("granite.block_count", N_LAYER)
    w.add_uint32("granite.feed_forward_length", N_FF)
    w.add_uint32("granite.attention.head_count", N_HEAD)
    w.add_uint32("granite.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32("granite.rope.dimension_count", HEAD_DIM)
    w.add_float32("granite.rope.freq_base", THETA)
    w.add_float32("granite.attention.layer_norm_rms_epsilon", EPS)
    w.add_float32("granite.attention.scale", ATTENTION)
    w.add_float32("granite.embedding_scale", EMBEDDING)
    w.add_float32("granite.residual_scale", RESIDUAL)
    w.add_float32("granite.logit_scale", LOGITS)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        if name.endswith("q_proj.weight"):
            t = permute(t, N_HEAD)
        elif name.endswith("k_proj.weight"):
            t = permute(t, N_HEAD_KV)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(t, dtype=np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["GraniteForCausalLM"], "model_type": "granite", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "hidden_act": "silu",
        "max_position_embeddings": N_CTX_TRAIN, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        "embedding_multiplier": EMBEDDING, "attention_multiplier": ATTENTION, "residual_multiplier": RESIDUAL,
        "logits_scaling": LOGITS,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "granite-tiny.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    write_expected(HERE, path, PROMPT, N_CTX_TRAIN, multipliers={"embedding": EMBEDDING, "attention": ATTENTION, "residual": RESIDUAL, "logits": LOGITS})

if __name__ == "__main__":
    main()
