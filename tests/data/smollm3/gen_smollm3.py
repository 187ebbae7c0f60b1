#!/usr/bin/env python3
"""Writes a tiny SmolLM3 in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/smollm3/gen_smollm3.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  smollm3-tiny.f32.gguf  GGUF arch `smollm3` as llama.cpp's convert_hf_to_gguf.py (SmolLM3Model, a
                         LlamaModel) writes it: q/k rows permuted for RoPE on adjacent pairs, tied
                         classifier (no output.weight); llama.cpp skips RoPE in layers 3 and 7
                         ((il + 1) % 4 == 0); f32.
  hf/config.json, hf/model.safetensors
                         the same weights as a transformers SmolLM3ForCausalLM directory (no_rope_layers
                         not written: the default no_rope_layer_interval 4 gives the same layers).
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
PROMPT = [int(x) for x in np.random.default_rng(13).integers(3, N_VOCAB, size=24)]

rng = np.random.default_rng(3131)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": 1 + rand(N_EMBD, std=0.1)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    hf[p + "input_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "post_attention_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "self_attn.q_proj.weight"] = rand(N_HEAD * HEAD_DIM, N_EMBD, std=0.3)
    hf[p + "self_attn.k_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.3)
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
    w = gguf.GGUFWriter(path, "smollm3")
    w.add_uint32("smollm3.context_length", N_CTX_TRAIN)
    w.add_uint32("smollm3.embedding_length", N_EMBD)
    w.add_uint32("smollm3.block_count", N_LAYER)
    w.add_uint32("smollm3.feed_forward_length", N_FF)
    w.add_uint32("smollm3.attention.head_count", N_HEAD)
    w.add_uint32("smollm3.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32("smollm3.rope.dimension_count", HEAD_DIM)
    w.add_float32("smollm3.rope.freq_base", THETA)
    w.add_float32("smollm3.attention.layer_norm_rms_epsilon", EPS)
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
        "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "hidden_act": "silu",
        "max_position_embeddings": N_CTX_TRAIN, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
        "attention_bias": False, "mlp_bias": False, "use_sliding_window": False, "sliding_window": None,
        "no_rope_layer_interval": 4, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "smollm3-tiny.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    write_expected(HERE, path, PROMPT, N_CTX_TRAIN, nope_layers=[il for il in range(N_LAYER) if (il + 1) % 4 == 0])

if __name__ == "__main__":
    main()
