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
  hf-qwen3moe-tiny/, hf-mixtral-tiny/, hf-olmoe-tiny/
                           the same weights as transformers Qwen3MoeForCausalLM / MixtralForCausalLM / OlmoeForCausalLM
                           directories (config.json, model.safetensors; one tensor per expert).
  olmoe-tiny.f32.gguf      GGUF arch `olmoe` (OLMoE's layout: q/k RMSNorm over the whole projections,
                           NEOX RoPE, 4 KV heads: llama.cpp reads OLMoE's k norm as n_embd wide),
                           8 experts, 3 used, their weights not renormalised; f32.
  granitemoe-tiny.f32.gguf GGUF arch `granitemoe`: Granite 3's four multipliers (tests/data/granite's
                           values), q/k permuted, 4 experts, 2 used; f32 (no HF directory: transformers'
                           GraniteMoe stores each layer's gate and up fused, not read here).
  qwen3moe-tiny.q8_0.gguf  qwen3moe-tiny quantized by llama.cpp (Q8_0: the expert matrices q8_0).
  expected.json            llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt for
                           qwen3moe-tiny, and under "mixtral" / "olmoe" / "granitemoe" / "q8_0" for the others.
"""
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import (add_placeholder_vocab, finish_gguf, llama_cpp_logits, llama_cpp_quantize, rounded,  # noqa: E402
                        write_expected, write_hf as write_hf_dir)

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_FF_EXP = 128, 64, 3, 4, 2, 16, 96, 32
N_CTX_TRAIN, EPS, THETA = 64, 1e-6, 10000.0
PROMPT = [int(x) for x in np.random.default_rng(21).integers(3, N_VOCAB, size=24)]


def rand(rng, *shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


def permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute: each head's rotate_half pairs made adjacent."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# HF names of the FFN parts per family: the router, then each expert's gate, up and down.
FFN = {"granitemoe": ("block_sparse_moe.gate", "block_sparse_moe.experts.{}.w1", "block_sparse_moe.experts.{}.w3",
                      "block_sparse_moe.experts.{}.w2"),
       "qwen3moe": ("mlp.gate", "mlp.experts.{}.gate_proj", "mlp.experts.{}.up_proj", "mlp.experts.{}.down_proj"),
       "olmoe": ("mlp.gate", "mlp.experts.{}.gate_proj", "mlp.experts.{}.up_proj", "mlp.experts.{}.down_proj"),
       "llama": ("block_sparse_moe.gate", "block_sparse_moe.experts.{}.w1", "block_sparse_moe.experts.{}.w3",
                 "block_sparse_moe.experts.{}.w2")}


def kv_heads(arch):
    """llama.cpp reads OLMoE's k norm as n_embd wide: KV heads as many as heads (as OLMoE-1B-7B)."""
    return N_HEAD if arch == "olmoe" else N_HEAD_KV


def hf_weights(arch, n_expert, seed):
    """The model's weights under transformers' names (Qwen3MoeForCausalLM / MixtralForCausalLM / OlmoeForCausalLM)."""
    rng = np.random.default_rng(seed)
    n_kv = kv_heads(arch)
    router, gate, up, down = FFN[arch]
    t = {"model.embed_tokens.weight": rand(rng, N_VOCAB, N_EMBD, std=0.5), "model.norm.weight": 1 + rand(rng, N_EMBD, std=0.1),
         "lm_head.weight": rand(rng, N_VOCAB, N_EMBD, std=0.2)}
    for il in range(N_LAYER):
        p = f"model.layers.{il}."
        t[p + "input_layernorm.weight"] = 1 + rand(rng, N_EMBD, std=0.1)
        t[p + "self_attn.q_proj.weight"] = rand(rng, N_HEAD * HEAD_DIM, N_EMBD, std=0.3)
        t[p + "self_attn.k_proj.weight"] = rand(rng, n_kv * HEAD_DIM, N_EMBD, std=0.3)
        t[p + "self_attn.v_proj.weight"] = rand(rng, n_kv * HEAD_DIM, N_EMBD, std=0.2)
        t[p + "self_attn.o_proj.weight"] = rand(rng, N_EMBD, N_HEAD * HEAD_DIM, std=0.15)
        if arch == "qwen3moe":
            t[p + "self_attn.q_norm.weight"] = 1 + rand(rng, HEAD_DIM, std=0.2)
            t[p + "self_attn.k_norm.weight"] = 1 + rand(rng, HEAD_DIM, std=0.2)
        if arch == "olmoe":  # over the whole projections
            t[p + "self_attn.q_norm.weight"] = 1 + rand(rng, N_HEAD * HEAD_DIM, std=0.2)
            t[p + "self_attn.k_norm.weight"] = 1 + rand(rng, n_kv * HEAD_DIM, std=0.2)
        t[p + "post_attention_layernorm.weight"] = 1 + rand(rng, N_EMBD, std=0.1)
        # a router with some spread, so that every row's choice is clear of ties
        t[p + router + ".weight"] = rand(rng, n_expert, N_EMBD, std=0.4)
        for e in range(n_expert):
            t[p + gate.format(e) + ".weight"] = rand(rng, N_FF_EXP, N_EMBD, std=0.25)
            t[p + up.format(e) + ".weight"] = rand(rng, N_FF_EXP, N_EMBD, std=0.25)
            t[p + down.format(e) + ".weight"] = rand(rng, N_EMBD, N_FF_EXP, std=0.25)
    return t


def write_gguf(path, arch, hf, n_expert, n_used):
    """As convert_hf_to_gguf.py writes it: the experts of each matrix stacked into one 3-D tensor
    [n_expert, rows, cols] (ffn_gate_exps, ffn_up_exps, ffn_down_exps), the router ffn_gate_inp;
    llama: q/k rows permuted for RoPE on adjacent pairs."""
    qwen = arch == "qwen3moe"
    neox = arch not in ("llama", "granitemoe")
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.context_length", N_CTX_TRAIN)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.block_count", N_LAYER)
    w.add_uint32(f"{arch}.feed_forward_length", N_FF if qwen else N_FF_EXP)
    w.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    w.add_uint32(f"{arch}.attention.head_count_kv", kv_heads(arch))
    w.add_uint32(f"{arch}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{arch}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{arch}.rope.freq_base", THETA)
    w.add_uint32(f"{arch}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{arch}.expert_count", n_expert)
    w.add_uint32(f"{arch}.expert_used_count", n_used)
    if qwen:
        w.add_uint32(f"{arch}.expert_feed_forward_length", N_FF_EXP)
    if arch == "granitemoe":  # Granite 3's multipliers (as tests/data/granite)
        w.add_float32(f"{arch}.attention.scale", 1 / 128)
        w.add_float32(f"{arch}.embedding_scale", 12.0)
        w.add_float32(f"{arch}.residual_scale", 0.22)
        w.add_float32(f"{arch}.logit_scale", 8.0)
    add_placeholder_vocab(w, N_VOCAB)
    router, gate, up, down = FFN[arch]
    t = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"],
         "output.weight": hf["lm_head.weight"]}
    for il in range(N_LAYER):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        q, k = hf[p + "self_attn.q_proj.weight"], hf[p + "self_attn.k_proj.weight"]
        t[b + "attn_norm.weight"] = hf[p + "input_layernorm.weight"]
        t[b + "attn_q.weight"] = q if neox else permute(q, N_HEAD)
        t[b + "attn_k.weight"] = k if neox else permute(k, N_HEAD_KV)
        t[b + "attn_v.weight"] = hf[p + "self_attn.v_proj.weight"]
        t[b + "attn_output.weight"] = hf[p + "self_attn.o_proj.weight"]
        if arch in ("qwen3moe", "olmoe"):
            t[b + "attn_q_norm.weight"] = hf[p + "self_attn.q_norm.weight"]
            t[b + "attn_k_norm.weight"] = hf[p + "self_attn.k_norm.weight"]
        t[b + "ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
        t[b + "ffn_gate_inp.weight"] = hf[p + router + ".weight"]
        for part, name in (("gate", gate), ("up", up), ("down", down)):
            t[b + f"ffn_{part}_exps.weight"] = np.stack([hf[p + name.format(e) + ".weight"] for e in range(n_expert)])
    for name, v in t.items():
        w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))
    finish_gguf(w)


def write_hf(folder, arch, hf, n_expert, n_used):
    common = {"vocab_size": N_VOCAB, "hidden_size": N_EMBD, "num_hidden_layers": N_LAYER, "num_attention_heads": N_HEAD,
              "num_key_value_heads": kv_heads(arch), "head_dim": HEAD_DIM, "hidden_act": "silu",
              "max_position_embeddings": N_CTX_TRAIN, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
              "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
              "num_experts_per_tok": n_used}
    if arch == "qwen3moe":
        config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common, "intermediate_size": N_FF,
                  "moe_intermediate_size": N_FF_EXP, "num_experts": n_expert, "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False}
    elif arch == "olmoe":
        config = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", **common, "intermediate_size": N_FF_EXP,
                  "num_experts": n_expert, "norm_topk_prob": False, "clip_qkv": None, "attention_bias": False}
    else:
        config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **common, "intermediate_size": N_FF_EXP,
                  "num_local_experts": n_expert, "sliding_window": None}
    write_hf_dir(folder, config, hf)


def write_moe(name, arch, n_expert, n_used, seed):
    """<name>.f32.gguf and the HF directory hf-<name>/ of one random model."""
    hf = hf_weights(arch, n_expert, seed)
    write_gguf(os.path.join(HERE, name + ".f32.gguf"), arch, hf, n_expert, n_used)
    write_hf(os.path.join(HERE, "hf-" + name), arch, hf, n_expert, n_used)
    return os.path.join(HERE, name + ".f32.gguf")


def main():
    import llama_cpp

    qwen = write_moe("qwen3moe-tiny", "qwen3moe", 8, 2, 4343)
    mixtral = write_moe("mixtral-tiny", "llama", 4, 2, 4444)
    olmoe = write_moe("olmoe-tiny", "olmoe", 8, 3, 4545)
    granite = os.path.join(HERE, "granitemoe-tiny.f32.gguf")  # no HF directory: GraniteMoe fuses gate and up
    write_gguf(granite, "granitemoe", hf_weights("granitemoe", 4, 4646), 4, 2)
    q8 = os.path.join(HERE, "qwen3moe-tiny.q8_0.gguf")
    types = llama_cpp_quantize(qwen, q8, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0)
    extra = {"mixtral": {"logits": rounded(llama_cpp_logits(mixtral, PROMPT, N_CTX_TRAIN))},
             "olmoe": {"logits": rounded(llama_cpp_logits(olmoe, PROMPT, N_CTX_TRAIN))},
             "granitemoe": {"logits": rounded(llama_cpp_logits(granite, PROMPT, N_CTX_TRAIN))},
             "q8_0": {"types": types, "logits": rounded(llama_cpp_logits(q8, PROMPT, N_CTX_TRAIN))}}
    write_expected(HERE, qwen, PROMPT, N_CTX_TRAIN, **extra)


if __name__ == "__main__":
    main()
