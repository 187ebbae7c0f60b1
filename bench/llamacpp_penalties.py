#!/usr/bin/env python3
"""Repetition penalties and min-p, megakernel against llama.cpp's samplers, side by side.

For each model and setting below, the prompt's ids come from llama.cpp's tokenizer; llama.cpp
decodes greedily through its own sampler chain (penalties with the prompt accepted into the window,
as llama-cli does, then greedy), and `megakernel run --ids ... --temp 0 --repeat-penalty ...
--json` decodes the same ids. Prints each setting's agreement (the common prefix of the generated
ids) and exits 1 when one differs. With --fixture F it also writes llama.cpp's ids as JSON (the
test E2EPenalties.GreedyMatchesLlamaCpp reads tests/data/penalties/llamacpp_greedy.json).

A greedy token can flip where two logits are within the engines' float differences (~1e-5 here), so
a difference late in a long generation is worth a look, not necessarily a bug.

Run with the venv that bench/llamacpp_compare.sh makes (llama-cpp-python, gguf, numpy):
  ~/.cache/megakernel/venvs/llamacpp/bin/python bench/llamacpp_penalties.py [--megakernel BIN] [--model F ...]
"""
import argparse
import json
import os
import subprocess
import sys

SETTINGS = [  # (repeat_penalty, frequency_penalty, presence_penalty, last_n)
    (1.0, 0.0, 0.0, 64),
    (1.3, 0.0, 0.0, 64),
    (1.1, 0.0, 0.0, -1),
    (1.5, 0.0, 0.0, 8),
    (1.0, 0.5, 0.0, 64),
    (1.0, 0.0, 1.0, 64),
    (1.2, 0.3, 0.4, 32),
    (0.8, 0.0, 0.0, 64),
    (1.0, -0.5, 0.0, 16),
]
PROMPTS = ["Once upon a time", "The little dog ran to the park and the little dog"]
N_NEW = 48


def llamacpp_greedy(llm, prompt_ids, rep, freq, pres, last_n, n_new):
    import llama_cpp

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    window = last_n if last_n >= 0 else llm.n_ctx()
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_penalties(window, rep, freq, pres))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    for t in prompt_ids:
        llama_cpp.llama_sampler_accept(chain, t)
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    for _ in range(n_new):
        t = llama_cpp.llama_sampler_sample(chain, llm.ctx, -1)  # accepts t into the window
        if llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), t):
            break
        out.append(t)
        llm.eval([t])
    llama_cpp.llama_sampler_free(chain)
    return out


def megakernel_greedy(binary, model, prompt_ids, rep, freq, pres, last_n, n_new):
    cmd = [binary, "run", "-m", model, "--ids", ",".join(map(str, prompt_ids)), "-n", str(n_new), "--temp", "0",
           "--repeat-penalty", str(rep), "--frequency-penalty", str(freq), "--presence-penalty", str(pres),
           "--repeat-last-n", str(last_n), "-c", "256", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["generated_ids"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megakernel", default=os.path.join(here, "..", "build", "megakernel"))
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--fixture", help="write llama.cpp's ids for the first model here")
    a = ap.parse_args()
    models = a.model or [os.path.join(here, "..", "..", "shared", "models", "stories260K", "stories260K.gguf")]
    import llama_cpp  # noqa: F401  (fails early without the venv)
    from llama_cpp import Llama

    bad = 0
    cases = []
    for model in models:
        llm = Llama(model_path=model, n_ctx=256, n_threads=2, verbose=False)
        for prompt in PROMPTS:
            ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
            for rep, freq, pres, last_n in SETTINGS:
                want = llamacpp_greedy(llm, ids, rep, freq, pres, last_n, N_NEW)
                got = megakernel_greedy(a.megakernel, model, ids, rep, freq, pres, last_n, N_NEW)
                same = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
                ok = want == got
                bad += not ok
                print(f"{'ok  ' if ok else 'DIFF'} {os.path.basename(model)} rep={rep} freq={freq} pres={pres} "
                      f"last_n={last_n} {prompt[:24]!r}: {same}/{len(want)} ids agree")
                cases.append({"prompt_ids": ids, "repeat_penalty": rep, "frequency_penalty": freq,
                              "presence_penalty": pres, "last_n": last_n, "generated_ids": want})
        if a.fixture and model == models[0]:
            with open(a.fixture, "w") as f:
                json.dump({"model": os.path.basename(model), "n_new": N_NEW,
                           "source": "llama-cpp-python " + llama_cpp.__version__ + ": penalties(last_n, repeat, freq, "
                           "present) then greedy, the prompt accepted into the window (bench/llamacpp_penalties.py)",
                           "cases": cases}, f, indent=1)
        del llm
    print(f"{bad} setting(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
