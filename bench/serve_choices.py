#!/usr/bin/env python3
"""`n` choices of one long prompt on `megakernel serve`, with and without the prefix cache
(standard library only).

A request's choices after the prompt's first wait until it has read the prompt and take its KV
blocks from the prefix cache (docs/serve.md, "Several choices and prompts"): the prompt is computed
once instead of n times. For each mode this starts a server on a free loopback port, sends --reps
requests (each prompt begins differently, so no request finds another's blocks), and prints the
rows the engine computed (/metrics megakernel_batch_rows_total), the cached prompt tokens and the
wall time of each request.

    bench/serve_choices.py -m ~/.cache/megakernel/models/SmolLM2-135M-Instruct.Q4_1.gguf -n 4
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--bin", default=os.environ.get("MEGAKERNEL", os.path.join(here, "..", "build", "megakernel")))
    ap.add_argument("-n", type=int, default=4, help="choices per request")
    ap.add_argument("--prompt-chars", type=int, default=3000, help="characters of README.md used as the prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    text = open(os.path.join(here, "..", "README.md"), encoding="utf-8").read()[: a.prompt_chars]
    for flags in ([], ["--no-prefix-cache"]):
        log = tempfile.NamedTemporaryFile("w+", prefix="mk_serve_choices_", suffix=".log", delete=False)
        srv = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "-c", "4096",
                                "--parallel", str(max(a.n, 4)), *flags], stderr=log, stdout=log)
        port = None
        while port is None:
            if srv.poll() is not None:
                raise SystemExit("the server exited:\n" + open(log.name).read())
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
            port = int(m.group(1)) if m else None
            time.sleep(0.05)

        def metrics():
            t = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(megakernel_\S+) (\S+)$", t, re.M)}

        for rep in range(a.reps):
            body = {"prompt": f"Note {rep}: " + text, "max_tokens": a.max_tokens, "temperature": 0.8, "seed": 1, "n": a.n}
            before = metrics()
            t0 = time.time()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            r = json.load(urllib.request.urlopen(req, timeout=3600))
            wall = time.time() - t0
            after = metrics()
            print(f"{'prefix cache' if not flags else 'no prefix cache':16} n={a.n} prompt {r['usage']['prompt_tokens']} tokens: "
                  f"rows computed {int(after['megakernel_batch_rows_total'] - before['megakernel_batch_rows_total'])}, "
                  f"cached {int(after['megakernel_prompt_tokens_cached_total'] - before['megakernel_prompt_tokens_cached_total'])}, "
                  f"wall {wall * 1000:.0f} ms", flush=True)
        srv.terminate()
        srv.wait()
        os.unlink(log.name)


if __name__ == "__main__":
    main()
