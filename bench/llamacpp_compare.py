#!/usr/bin/env python3
"""Side-by-side CPU speed of megakernel and llama.cpp (llama-cpp-python) on the same GGUF files.

Run by bench/llamacpp_compare.sh, which makes the venv (llama-cpp-python, gguf, numpy) outside the
repo. For each model file both engines, in this one process run, with the same thread count:
  - prompt: evaluate the same N-token prompt (ids, no tokenizer involved) from an empty cache;
  - decode: then generate M tokens greedily, one token per step.
Each side runs `--reps` times (alternating) and the fastest run is reported, since this machine's
speed swings. megakernel runs as a subprocess (`run --ids ... --json`), which reports its own
prompt and per-token times; llama.cpp is timed around its eval() calls.

Models: the files given with --model, plus (with --synth) a 768-wide Llama (stories110M shape:
12 layers, 12 heads, n_ff 2048; random weights, std 0.02) with SmolLM2's gpt2 vocabulary,
written as f32 GGUF and quantized by llama.cpp's own quantizer to Q8_0 and Q4_K_M.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

import numpy as np


def make_synth_768(vocab_src, path_f32, seed=0):
    import gguf

    rd = gguf.GGUFReader(vocab_src)
    fields = rd.fields

    tokens = [bytes(fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8", "replace")
              for i in fields["tokenizer.ggml.tokens"].data]
    types = [int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data]
    merges = [bytes(fields["tokenizer.ggml.merges"].parts[i]).decode("utf-8", "replace")
              for i in fields["tokenizer.ggml.merges"].data]
    n_vocab, n_embd, n_layer, n_head, n_ff = len(tokens), 768, 12, 12, 2048
    rng = np.random.default_rng(seed)

    def rnd(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(path_f32, "llama")
    w.add_name("synth-768")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(fields["tokenizer.ggml.bos_token_id"].parts[-1][0]))
    w.add_eos_token_id(int(fields["tokenizer.ggml.eos_token_id"].parts[-1][0]))
    w.add_tensor("token_embd.weight", rnd(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output.weight", rnd(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + t + ".weight", rnd(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", rnd(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", rnd(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(llama_cpp, src, dst, ftype, threads):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"error: llama.cpp could not quantize {src} (rc {rc})")


def run_megakernel(binary, model, ids, n_gen, threads, n_ctx):
    cmd = [binary, "run", "-m", model, "--ids", ",".join(map(str, ids)), "-n", str(n_gen), "--temp", "0",
           "--ignore-eos", "--json", "--backend", "cpu", "-t", str(threads), "-c", str(n_ctx)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[:4])}: {out.stderr.strip()}")
    j = json.loads(out.stdout)
    return 1000.0 / j["prompt_ms_per_token"], 1000.0 / j["ms_per_token"], j["generated_ids"]


def run_llamacpp(llama_cpp, llm, ids, n_gen):
    n_vocab = llm.n_vocab()

    def last_logits():  # the last evaluated row (llama-cpp-python keeps scores only with logits_all)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    out = []
    for _ in range(n_gen):
        tok = int(np.argmax(last_logits()))
        out.append(tok)
        llm.eval([tok])
    t2 = time.perf_counter()
    return len(ids) / (t1 - t0), n_gen / (t2 - t1), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megakernel", required=True)
    ap.add_argument("--model", action="append", default=[], help="GGUF file (repeatable)")
    ap.add_argument("--synth", action="store_true", help="also the 768-wide model in Q8_0 and Q4_K_M")
    ap.add_argument("--vocab-from", help="GGUF whose gpt2 vocabulary the synthetic model uses")
    ap.add_argument("--work", required=True, help="folder for generated model files")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=150, help="prompt tokens")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()

    import llama_cpp

    models = list(a.model)
    if a.synth:
        os.makedirs(a.work, exist_ok=True)
        f32 = os.path.join(a.work, "synth768-f32.gguf")
        if not os.path.exists(f32):
            make_synth_768(a.vocab_from, f32)
        for name, ft in (("Q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0), ("Q4_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)):
            q = os.path.join(a.work, f"synth768-{name}.gguf")
            if not os.path.exists(q):
                quantize(llama_cpp, f32, q, ft, a.threads)
            models.append(q)

    n_ctx = 512
    rows = []
    for m in models:
        llm = llama_cpp.Llama(model_path=m, n_ctx=n_ctx, n_batch=512, n_threads=a.threads, n_threads_batch=a.threads,
                              verbose=False)
        n_vocab = llm.n_vocab()
        rng = np.random.default_rng(1)
        ids = [int(x) for x in rng.integers(100, min(n_vocab, 30000), a.prompt)]
        best = {"mk": [0, 0], "lc": [0, 0]}
        same = None
        for _ in range(a.reps):
            p, d, mk_ids = run_megakernel(a.megakernel, m, ids, a.gen, a.threads, n_ctx)
            best["mk"] = [max(best["mk"][0], p), max(best["mk"][1], d)]
            p, d, lc_ids = run_llamacpp(llama_cpp, llm, ids, a.gen)
            best["lc"] = [max(best["lc"][0], p), max(best["lc"][1], d)]
            k = 0
            while k < min(len(mk_ids), len(lc_ids)) and mk_ids[k] == lc_ids[k]:
                k += 1
            same = k
        del llm
        rows.append((os.path.basename(m), best, same))

    print(f"threads {a.threads}, prompt {a.prompt} tokens, {a.gen} generated (best of {a.reps} each)")
    print(f"| model | megakernel prompt tok/s | llama.cpp prompt tok/s | megakernel decode tok/s | llama.cpp decode tok/s | same greedy ids |")
    print("|---|---|---|---|---|---|")
    for name, b, same in rows:
        print(f"| {name} | {b['mk'][0]:.1f} | {b['lc'][0]:.1f} | {b['mk'][1]:.1f} | {b['lc'][1]:.1f} | {same}/{a.gen} |")


if __name__ == "__main__":
    main()
