#!/usr/bin/env python3
"""Writes the tiny Gemma 2 fixtures in this folder and llama.cpp's logits for them (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/gemma2/gen_gemma2.py

(the venv has llama-cpp-python 0.3.16, gguf and numpy; see docs/architectures.md). Outputs, next to
this script:
  gemma2-tiny.f32.gguf   GGUF arch `gemma2` as llama.cpp's convert_hf_to_gguf.py writes it: GGUF tensor
                         names, every norm weight stored as 1 + w, keys gemma2.attention.sliding_window,
                         gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping; f32 weights; a
                         placeholder SentencePiece vocabulary (llama.cpp needs one for n_vocab).
  hf/config.json, hf/model.safetensors
                         the same weights in the transformers Gemma2ForCausalLM layout (model_type gemma2,
                         HF tensor names, norm weights w).
  expected.json          {"prompt_ids", "window", "attn_softcap", "final_softcap", "logits": [n_tokens][n_vocab]}:
                         llama.cpp's logits at every position (f32 KV cache, no flash attention), the oracle
                         of tests/e2e/test_gemma2.cpp.

Shape: 4 layers (layers 0 and 2 local with a window of 8 positions, 1 and 3 global, as Gemma 2's
alternation), n_embd 48, 4 query heads / 2 KV heads of 16 (head_dim is not n_embd / n_head, as in
the released models), n_ff 96, vocab 128, a 24-token prompt. The soft-caps are small (attention 2,
logits 6) so that tanh bends most scores and the larger logits of these random weights: without
either one the logits are far from llama.cpp's.
"""
import json
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, llama_cpp_logits, rounded, write_hf as write_hf_dir  # noqa: E402
N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 128, 48, 4, 4, 2, 16, 96
WINDOW, N_CTX_TRAIN, EPS, THETA = 8, 128, 1e-6, 10_000.0
ATTN_SOFTCAP, FINAL_SOFTCAP = 2.0, 6.0
PROMPT = [int(x) for x in np.random.default_rng(11).integers(1, N_VOCAB, size=24)]

rng = np.random.default_rng(4321)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


# HF-layout weights (PyTorch shapes [n_out, n_in]); Gemma2RMSNorm weights w (applied as 1 + w).
hf = {"model.embed_tokens.weight": rand(N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": rand(N_EMBD, std=0.1)}
for il in range(N_LAYER):
    p = f"model.layers.{il}."
    for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        hf[p + n + ".weight"] = rand(N_EMBD, std=0.1)
    hf[p + "self_attn.q_proj.weight"] = rand(N_HEAD * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.k_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.v_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
    hf[p + "self_attn.o_proj.weight"] = rand(N_EMBD, N_HEAD * HEAD_DIM, std=0.2)
    hf[p + "mlp.gate_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.up_proj.weight"] = rand(N_FF, N_EMBD, std=0.2)
    hf[p + "mlp.down_proj.weight"] = rand(N_EMBD, N_FF, std=0.2)

GGUF_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
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
    w = gguf.GGUFWriter(path, "gemma2")
    w.add_uint32("gemma2.context_length", N_CTX_TRAIN)
    w.add_uint32("gemma2.embedding_length", N_EMBD)
    w.add_uint32("gemma2.block_count", N_LAYER)
    w.add_uint32("gemma2.feed_forward_length", N_FF)
    w.add_uint32("gemma2.attention.head_count", N_HEAD)
    w.add_uint32("gemma2.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32("gemma2.attention.key_length", HEAD_DIM)
    w.add_uint32("gemma2.attention.value_length", HEAD_DIM)
    w.add_float32("gemma2.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32("gemma2.attention.sliding_window", WINDOW)
    w.add_float32("gemma2.attn_logit_softcapping", ATTN_SOFTCAP)
    w.add_float32("gemma2.final_logit_softcapping", FINAL_SOFTCAP)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        if name.endswith("norm.weight"):
            t = t + np.float32(1.0)  # convert_hf_to_gguf.py Gemma2Model: norm weights + 1
        w.add_tensor(gguf_name(name), t.astype(np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "torch_dtype": "float32",
        "vocab_size": N_VOCAB, "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "head_dim": HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": N_CTX_TRAIN, "rms_norm_eps": EPS,
        "rope_theta": THETA, "sliding_window": WINDOW, "query_pre_attn_scalar": HEAD_DIM,
        "attn_logit_softcapping": ATTN_SOFTCAP, "final_logit_softcapping": FINAL_SOFTCAP,
        "attention_bias": False, "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "gemma2-tiny.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    logits = llama_cpp_logits(path, PROMPT, 64)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": PROMPT,
                   "window": WINDOW, "attn_softcap": ATTN_SOFTCAP, "final_softcap": FINAL_SOFTCAP,
                   "logits": rounded(logits)}, f)
    print("wrote", path, "logits", logits.shape, "argmax", logits.argmax(-1).tolist(),
          "max |logit|", float(np.abs(logits).max()))


if __name__ == "__main__":
    main()
