#!/usr/bin/env python3
"""Log-probabilities of generated tokens, megakernel's server against llama.cpp, side by side.

For each prompt below (ids from llama.cpp's tokenizer), llama.cpp decodes greedily and gives, per
generated token, the log-softmax of its logits row (the model's own distribution, as
llama-cpp-python's `logprobs` and vLLM's raw logprobs): the chosen token's logprob and the N most
likely tokens. `megakernel serve` answers /v1/completions with the same ids, temperature 0 and
"logprobs": N. Prints the largest difference per prompt and exits 1 when a token or a logprob
(beyond --tol x (1 + |logprob|)) differs. With --fixture F it writes llama.cpp's values as JSON (the
test E2ELogprobs.MatchLlamaCpp reads tests/data/logprobs/llamacpp_logprobs.json).

An alternative can swap places with the next where their logits are within the engines' float
differences; such a swap is reported, not hidden.

Run with the venv that bench/llamacpp_compare.sh makes (llama-cpp-python, gguf, numpy):
  ~/.cache/megakernel/venvs/llamacpp/bin/python bench/llamacpp_logprobs.py [--megakernel BIN] [--model F]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = ["Once upon a time", "The little dog ran to the park and", "Lily and Tom"]
N_NEW = 24
N_TOP = 5


def llamacpp_logprobs(llm, prompt_ids, n_new, n_top):
    import llama_cpp
    import numpy as np

    llm.reset()
    llm.eval(prompt_ids)
    steps = []
    for _ in range(n_new):
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)  # the last row llama.cpp computed
        row = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)
        m = row.max()
        lp = row - (m + np.log(np.exp(row - m).sum()))
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:n_top]
        t = order[0]
        if llm.token_eos() == t:
            break
        steps.append({"id": t, "logprob": float(lp[t]), "top": [[i, float(lp[i])] for i in order]})
        llm.eval([t])
    return steps


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def megakernel_logprobs(port, prompt_ids, n_new, n_top):
    body = json.dumps({"prompt": prompt_ids, "max_tokens": n_new, "temperature": 0, "logprobs": n_top,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        c = json.load(r)["choices"][0]
    lp = c["logprobs"]
    return c["token_ids"], lp["token_logprobs"], lp["top_logprobs"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megakernel", default=os.path.join(here, "..", "build", "megakernel"))
    ap.add_argument("--model", default=os.path.join(here, "..", "..", "shared", "models", "stories260K", "stories260K.gguf"))
    ap.add_argument("--tol", type=float, default=5e-3,
                    help="largest logprob difference accepted, times 1 + |logprob| (the engines' logits differ by ~1e-3 relative)")
    ap.add_argument("--fixture", help="write llama.cpp's values here")
    a = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=a.model, n_ctx=256, n_threads=2, verbose=False)
    cases = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        cases.append({"prompt_ids": ids, "steps": llamacpp_logprobs(llm, ids, N_NEW, N_TOP)})
    del llm
    if a.fixture:
        with open(a.fixture, "w") as f:
            json.dump({"model": os.path.basename(a.model), "n_top": N_TOP,
                       "source": "llama-cpp-python " + llama_cpp.__version__ + ": greedy decoding; per token the "
                       "log-softmax (float64) of llama.cpp's logits row, chosen token and the n_top most likely "
                       "(bench/llamacpp_logprobs.py)", "cases": cases}, f, indent=1)

    port = free_port()
    srv = subprocess.Popen([a.megakernel, "serve", "-m", a.model, "--port", str(port), "-c", "256"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    bad = 0
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        for case in cases:
            want = case["steps"]
            ids, lps, tops = megakernel_logprobs(port, case["prompt_ids"], len(want), N_TOP)
            worst, swaps, wrong = 0.0, 0, 0
            for k, w in enumerate(want):
                if k >= len(ids) or ids[k] != w["id"]:
                    wrong += 1
                    break
                worst = max(worst, abs(lps[k] - w["logprob"]) / (1 + abs(w["logprob"])))
                got_top = sorted(tops[k].values(), reverse=True)[:N_TOP]
                want_top = [v for _, v in w["top"]]
                worst = max(worst, max(abs(x - y) / (1 + abs(y)) for x, y in zip(got_top, want_top)))
                swaps += len(got_top) != len(want_top)
            ok = not wrong and not swaps and worst <= a.tol
            bad += not ok
            print(f"{'ok  ' if ok else 'DIFF'} {case['prompt_ids']}: {len(want)} tokens, largest logprob difference "
                  f"{worst:.2e} x (1 + |logprob|){', a token differs' if wrong else ''}{f', {swaps} alternative lists differ' if swaps else ''}")
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    print(f"{bad} prompt(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
