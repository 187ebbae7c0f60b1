#!/usr/bin/env python3
"""Writes a tiny StableLM 2 in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/stablelm/gen_stablelm.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  stablelm-tiny.f32.gguf      GGUF arch `stablelm` as llama.cpp's convert_hf_to_gguf.py (StableLMModel)
                              writes it: LayerNorms with biases, q/k/v biases (use_qkv_bias), RoPE over a
                              quarter of each head (rope.dimension_count 4 of 16), q/k not permuted,
                              use_parallel_residual false, its own classifier; f32.
  stablelm-parallel.f32.gguf  the same weights without ffn_norm and use_parallel_residual true: attention
                              and MLP in parallel on one norm (StableLM 2 12B's layout).
  hf/config.json, hf/model.safetensors
                              the first model as a transformers StableLmForCausalLM directory.
  expected.json               llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt:
                              "logits" of the first file, "logits_parallel" of the second.
"""
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, gguf_tensor_name, llama_cpp_logits, rounded, write_expected, write_hf as write_hf_dir  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 128, 64, 4, 4, 2, 16, 128
N_CTX_TRAIN, EPS, THETA, PARTIAL = 64, 1e-5, 10000.0, 0.25
PROMPT = [int(x) for x in np.random.default_rng(17).integers(3, N_VOCAB, size=24)]

rng = np.random.default_rng(6161)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": 1 + rand(N_EMBD, std=0.1),
      "model.norm.bias": rand(N_EMBD, std=0.1), "lm_head.weight": rand(N_VOCAB, N_EMBD, std=0.2)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    for n in ("input_layernorm", "post_attention_layernorm"):
        hf[p + n + ".weight"] = 1 + rand(N_EMBD, std=0.1)
        hf[p + n + ".bias"] = rand(N_EMBD, std=0.1)
    for n, rows in (("q_proj", N_HEAD * HEAD_DIM), ("k_proj", N_HEAD_KV * HEAD_DIM), ("v_proj", N_HEAD_KV * HEAD_DIM)):
        hf[p + f"self_attn.{n}.weight"] = rand(rows, N_EMBD, std=0.3)
        hf[p + f"self_attn.{n}.bias"] = rand(rows, std=0.1)
    hf[p + "self_attn.o_proj.weight"] = rand(N_EMBD, N_HEAD * HEAD_DIM, std=0.15)
    hf[p + "mlp.gate_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.up_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.down_proj.weight"] = rand(N_EMBD, N_FF, std=0.15)

GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "model.norm.bias": "output_norm.bias", "lm_head.weight": "output.weight"}
GGUF_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(name):
    return gguf_tensor_name(name, GGUF_TOP, GGUF_PARTS)


def write_gguf(path, parallel):
    w = gguf.GGUFWriter(path, "stablelm")
    w.add_uint32("stablelm.context_length", N_CTX_TRAIN)
    w.add_uint32("stablelm.embedding_length", N_EMBD)
    w.add_uint32("stablelm.block_count", N_LAYER)
    w.add_uint32("stablelm.feed_forward_length", N_FF)
    w.add_uint32("stablelm.rope.dimension_count", int(PARTIAL * HEAD_DIM))
    w.add_uint32("stablelm.attention.head_count", N_HEAD)
    w.add_uint32("stablelm.attention.head_count_kv", N_HEAD_KV)
    w.add_bool("stablelm.use_parallel_residual", parallel)
    w.add_float32("stablelm.attention.layer_norm_epsilon", EPS)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        if parallel and "post_attention_layernorm" in name:
            continue
        w.add_tensor(gguf_name(name), np.ascontiguousarray(t, dtype=np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "hidden_act": "silu",
        "max_position_embeddings": N_CTX_TRAIN, "layer_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
        "partial_rotary_factor": PARTIAL, "use_qkv_bias": True, "qk_layernorm": False, "use_parallel_residual": False,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    }
    write_hf_dir(folder, config, hf)


def main():
    path, parallel = os.path.join(HERE, "stablelm-tiny.f32.gguf"), os.path.join(HERE, "stablelm-parallel.f32.gguf")
    write_gguf(path, False)
    write_gguf(parallel, True)
    write_hf(os.path.join(HERE, "hf"))
    write_expected(HERE, path, PROMPT, N_CTX_TRAIN, logits_parallel=rounded(llama_cpp_logits(parallel, PROMPT, N_CTX_TRAIN)))


if __name__ == "__main__":
    main()
