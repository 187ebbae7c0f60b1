#!/usr/bin/env python3
"""Writes a tiny Phi-3 with LongRoPE in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/phi3_longrope/gen_phi3_longrope.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  phi3-longrope.f32.gguf  GGUF arch `phi3` as llama.cpp's convert_hf_to_gguf.py (Phi3MiniModel) writes
                          it: fused attn_qkv and ffn_up ([gate; up]), rope_factors_long/short.weight,
                          phi3.rope.scaling.attn_factor = sqrt(1 + ln(s) / ln(original)) with
                          s = context_length / original_context_length = 4; f32 weights.
  hf/config.json, hf/model.safetensors
                          the same weights as a transformers Phi3ForCausalLM directory (rope_scaling
                          {type: longrope, short_factor, long_factor}, original_max_position_embeddings).
  expected.json           llama.cpp's logits at every position (f32 KV cache) for two contexts:
                          "long": n_ctx 64 > original 32, the long factors; "short": n_ctx 32, the short ones.
"""
import json
import math
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, llama_cpp_logits, rounded, write_hf as write_hf_dir  # noqa: E402
N_VOCAB, N_EMBD, N_LAYER, N_HEAD, HEAD_DIM, N_FF = 128, 32, 2, 2, 16, 64
N_CTX_TRAIN, N_CTX_ORIG, EPS, THETA = 128, 32, 1e-5, 10000.0
ATTN_FACTOR = math.sqrt(1 + math.log(N_CTX_TRAIN / N_CTX_ORIG) / math.log(N_CTX_ORIG))
PROMPT = [int(x) for x in np.random.default_rng(11).integers(1, N_VOCAB, size=24)]

rng = np.random.default_rng(4321)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


SHORT = [float(f"{x:.4f}") for x in 1.0 + rng.uniform(0.0, 0.5, HEAD_DIM // 2)]
LONG = [float(f"{x:.4f}") for x in np.geomspace(1.0, 40.0, HEAD_DIM // 2)]

hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": 1 + rand(N_EMBD, std=0.1),
      "lm_head.weight": rand(N_VOCAB, N_EMBD, std=0.2)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    hf[p + "input_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "post_attention_layernorm.weight"] = 1 + rand(N_EMBD, std=0.1)
    hf[p + "self_attn.qkv_proj.weight"] = rand(3 * N_HEAD * HEAD_DIM, N_EMBD, std=0.25)
    hf[p + "self_attn.o_proj.weight"] = rand(N_EMBD, N_HEAD * HEAD_DIM, std=0.2)
    hf[p + "mlp.gate_up_proj.weight"] = rand(2 * N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.down_proj.weight"] = rand(N_EMBD, N_FF, std=0.2)

NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.qkv_proj": "attn_qkv",
         "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, il, rest = name.split(".", 3)
    return f"blk.{il}.{NAMES[rest.rsplit('.', 1)[0]]}.weight"


def write_gguf(path):
    w = gguf.GGUFWriter(path, "phi3")
    w.add_uint32("phi3.context_length", N_CTX_TRAIN)
    w.add_uint32("phi3.rope.scaling.original_context_length", N_CTX_ORIG)
    w.add_uint32("phi3.embedding_length", N_EMBD)
    w.add_uint32("phi3.feed_forward_length", N_FF)
    w.add_uint32("phi3.block_count", N_LAYER)
    w.add_uint32("phi3.attention.head_count", N_HEAD)
    w.add_uint32("phi3.attention.head_count_kv", N_HEAD)
    w.add_float32("phi3.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32("phi3.rope.dimension_count", HEAD_DIM)
    w.add_float32("phi3.rope.freq_base", THETA)
    w.add_float32("phi3.rope.scaling.attn_factor", ATTN_FACTOR)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        w.add_tensor(gguf_name(name), t)
    w.add_tensor("rope_factors_long.weight", np.array(LONG, dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(SHORT, dtype=np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD, "hidden_act": "silu",
        "max_position_embeddings": N_CTX_TRAIN, "original_max_position_embeddings": N_CTX_ORIG,
        "rms_norm_eps": EPS, "rope_theta": THETA, "sliding_window": None, "tie_word_embeddings": False,
        "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
        "bos_token_id": 1, "eos_token_id": 2,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "phi3-longrope.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    out = {"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": PROMPT}
    for key, n_ctx, n_tokens in (("long", 64, 24), ("short", 32, 24)):
        logits = llama_cpp_logits(path, PROMPT[:n_tokens], n_ctx)
        out[key] = {"n_ctx": n_ctx, "logits": rounded(logits)}
        print(key, "n_ctx", n_ctx, "argmax", logits.argmax(-1).tolist())
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
