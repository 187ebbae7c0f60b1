#!/usr/bin/env python3
"""Writes a tiny StarCoder2 in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/starcoder2/gen_starcoder2.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  starcoder2-tiny.f32.gguf  GGUF arch `starcoder2` as llama.cpp's convert_hf_to_gguf.py (StarCoder2Model, a
                       TextModel) writes it: LayerNorms with biases, q/k/v/o biases, ffn_up / ffn_down
                       (mlp.c_fc / c_proj) with biases, q/k not permuted, tied classifier; f32.
  hf/config.json, hf/model.safetensors
                       the same weights as a transformers Starcoder2ForCausalLM directory.
  expected.json        llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt.
"""
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, gguf_tensor_name, write_expected, write_hf as write_hf_dir  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 128, 64, 4, 4, 2, 16, 128
N_CTX_TRAIN, EPS, THETA = 64, 1e-5, 10000.0
PROMPT = [int(x) for x in np.random.default_rng(16).integers(3, N_VOCAB, size=24)]

rng = np.random.default_rng(5151)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": 1 + rand(N_EMBD, std=0.1),
      "model.norm.bias": rand(N_EMBD, std=0.1)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    for n in ("input_layernorm", "post_attention_layernorm"):
        hf[p + n + ".weight"] = 1 + rand(N_EMBD, std=0.1)
        hf[p + n + ".bias"] = rand(N_EMBD, std=0.1)
    for n, rows in (("q_proj", N_HEAD * HEAD_DIM), ("k_proj", N_HEAD_KV * HEAD_DIM), ("v_proj", N_HEAD_KV * HEAD_DIM)):
        hf[p + f"self_attn.{n}.weight"] = rand(rows, N_EMBD, std=0.3)
        hf[p + f"self_attn.{n}.bias"] = rand(rows, std=0.1)
    hf[p + "self_attn.o_proj.weight"] = rand(N_EMBD, N_HEAD * HEAD_DIM, std=0.15)
    hf[p + "self_attn.o_proj.bias"] = rand(N_EMBD, std=0.1)
    hf[p + "mlp.c_fc.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.c_fc.bias"] = rand(N_FF, std=0.1)
    hf[p + "mlp.c_proj.weight"] = rand(N_EMBD, N_FF, std=0.15)
    hf[p + "mlp.c_proj.bias"] = rand(N_EMBD, std=0.1)

GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "model.norm.bias": "output_norm.bias"}
GGUF_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down",
}


def gguf_name(name):
    return gguf_tensor_name(name, GGUF_TOP, GGUF_PARTS)


def write_gguf(path):
    w = gguf.GGUFWriter(path, "starcoder2")
    w.add_uint32("starcoder2.context_length", N_CTX_TRAIN)
    w.add_uint32("starcoder2.embedding_length", N_EMBD)
    w.add_uint32("starcoder2.block_count", N_LAYER)
    w.add_uint32("starcoder2.feed_forward_length", N_FF)
    w.add_uint32("starcoder2.attention.head_count", N_HEAD)
    w.add_uint32("starcoder2.attention.head_count_kv", N_HEAD_KV)
    w.add_float32("starcoder2.rope.freq_base", THETA)
    w.add_float32("starcoder2.attention.layer_norm_epsilon", EPS)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        w.add_tensor(gguf_name(name), np.ascontiguousarray(t, dtype=np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "hidden_act": "gelu_pytorch_tanh",
        "max_position_embeddings": N_CTX_TRAIN, "norm_epsilon": EPS, "rope_theta": THETA, "use_bias": True,
        "sliding_window": None, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "starcoder2-tiny.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    write_expected(HERE, path, PROMPT, N_CTX_TRAIN)

if __name__ == "__main__":
    main()
