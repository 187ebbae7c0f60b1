#!/usr/bin/env python3
"""Writes a tiny Phi-2 in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/phi2/gen_phi2.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  phi2-tiny.f32.gguf        GGUF arch `phi2` as llama.cpp's convert_hf_to_gguf.py (Phi2Model) writes
                            it: separate attn_q/attn_k/attn_v with biases, attn_output (self_attn.dense),
                            ffn_up / ffn_down (mlp.fc1 / fc2), output.weight and output.bias,
                            rope.dimension_count = partial_rotary_factor x head_dim; f32.
  phi2-fused-qkv.f32.gguf   the same model with q/k/v fused as blk.N.attn_qkv.{weight,bias} (older Phi-2
                            conversions; llama.cpp reads both).
  hf/config.json, hf/model.safetensors
                            the same weights as a transformers PhiForCausalLM directory.
  expected.json             llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt
                            (the two files' logits are checked equal here).
"""
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, gguf_tensor_name, llama_cpp_logits, write_expected, write_hf as write_hf_dir  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_CTX_TRAIN, EPS, THETA, PARTIAL = 128, 64, 3, 4, 64, 1e-5, 10000.0, 0.5
HEAD_DIM, N_FF = N_EMBD // N_HEAD, 4 * N_EMBD
PROMPT = [int(x) for x in np.random.default_rng(14).integers(3, N_VOCAB, size=24)]

rng = np.random.default_rng(777)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5),
      "model.final_layernorm.weight": 1 + rand(N_EMBD, std=0.1), "model.final_layernorm.bias": rand(N_EMBD, std=0.1),
      "lm_head.weight": rand(N_VOCAB, N_EMBD, std=0.2), "lm_head.bias": rand(N_VOCAB, std=0.3)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    hf[p + "input_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "input_layernorm.bias"] = rand(N_EMBD, std=0.1)
    for n in ("q_proj", "k_proj", "v_proj"):
        hf[p + f"self_attn.{n}.weight"] = rand(N_EMBD, N_EMBD, std=0.3)
        hf[p + f"self_attn.{n}.bias"] = rand(N_EMBD, std=0.1)
    hf[p + "self_attn.dense.weight"] = rand(N_EMBD, N_EMBD, std=0.15)
    hf[p + "self_attn.dense.bias"] = rand(N_EMBD, std=0.1)
    hf[p + "mlp.fc1.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.fc1.bias"] = rand(N_FF, std=0.1)
    hf[p + "mlp.fc2.weight"] = rand(N_EMBD, N_FF, std=0.1)
    hf[p + "mlp.fc2.bias"] = rand(N_EMBD, std=0.1)

GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.final_layernorm.weight": "output_norm.weight",
            "model.final_layernorm.bias": "output_norm.bias", "lm_head.weight": "output.weight", "lm_head.bias": "output.bias"}
GGUF_PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.dense": "attn_output", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}


def gguf_name(name):
    return gguf_tensor_name(name, GGUF_TOP, GGUF_PARTS)


def write_gguf(path, fused):
    w = gguf.GGUFWriter(path, "phi2")
    w.add_uint32("phi2.context_length", N_CTX_TRAIN)
    w.add_uint32("phi2.embedding_length", N_EMBD)
    w.add_uint32("phi2.feed_forward_length", N_FF)
    w.add_uint32("phi2.block_count", N_LAYER)
    w.add_uint32("phi2.attention.head_count", N_HEAD)
    w.add_uint32("phi2.attention.head_count_kv", N_HEAD)
    w.add_float32("phi2.attention.layer_norm_epsilon", EPS)
    w.add_uint32("phi2.rope.dimension_count", int(PARTIAL * N_EMBD) // N_HEAD)
    add_placeholder_vocab(w, N_VOCAB)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    for name, t in hf.items():
        if fused and ("self_attn.k_proj" in name or "self_attn.v_proj" in name):
            continue
        if fused and "self_attn.q_proj" in name:
            kind = name.rsplit(".", 1)[1]
            p = name.rsplit("self_attn.", 1)[0]
            t = np.concatenate([hf[p + f"self_attn.{n}.{kind}"] for n in ("q_proj", "k_proj", "v_proj")], axis=0)
            w.add_tensor(f"blk.{name.split('.')[2]}.attn_qkv.{kind}", np.ascontiguousarray(t, dtype=np.float32))
            continue
        w.add_tensor(gguf_name(name), np.ascontiguousarray(t, dtype=np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["PhiForCausalLM"], "model_type": "phi", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD, "hidden_act": "gelu_new",
        "max_position_embeddings": N_CTX_TRAIN, "layer_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
        "partial_rotary_factor": PARTIAL, "qk_layernorm": False, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2,
    }
    write_hf_dir(folder, config, hf)


def main():
    path, fused = os.path.join(HERE, "phi2-tiny.f32.gguf"), os.path.join(HERE, "phi2-fused-qkv.f32.gguf")
    write_gguf(path, False)
    write_gguf(fused, True)
    write_hf(os.path.join(HERE, "hf"))
    logits = write_expected(HERE, path, PROMPT, N_CTX_TRAIN)
    assert np.array_equal(logits, llama_cpp_logits(fused, PROMPT, N_CTX_TRAIN))

if __name__ == "__main__":
    main()
