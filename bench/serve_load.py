#!/usr/bin/env python3
"""Load benchmark for `megakernel serve` (standard library only).

For each concurrency level C (default 1, 4, 16) it runs C client threads, each sending streaming
completions back to back (greedy unless --temperature, ignore_eos, fixed max_tokens), and reports the aggregate generated
tokens/s (all tokens of all requests / wall time of the level), and time-to-first-token (median and
p90 over the level's requests). The server is started on a free loopback port with --parallel equal
to the largest level and stopped by its PID at the end.

    bench/serve_load.py -m ../shared/models/stories260K/stories260K.bin -z ../shared/models/stories260K/tok512.bin
    bench/serve_load.py -m synth:stories110m -t 2 --max-tokens 32

Synthetic models have no tokenizer: prompts are sent as token ids. Prints a table and, with --json
FILE, writes the figures as JSON.
"""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))


def start_server(args, parallel):
    log = tempfile.NamedTemporaryFile("w+", prefix="mk_bench_serve_", suffix=".log", delete=False)
    cmd = [args.bin, "serve", "-m", args.model, "--port", "0", "--parallel", str(parallel), "-t", str(args.threads),
           "--max-queue", "64", "--timeout", "0"]
    if args.tokenizer:
        cmd += ["-z", args.tokenizer]
    if args.ctx:
        cmd += ["-c", str(args.ctx)]
    proc = subprocess.Popen(cmd + args.server_args, stdout=log, stderr=log)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited {proc.returncode}:\n" + open(log.name).read())
        text = open(log.name).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m:
            print(text.strip().splitlines()[-1], file=sys.stderr)
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    sys.exit("server did not start:\n" + open(log.name).read())


def one_request(port, prompt, max_tokens, temperature=0.0, seed=0):
    """Streams one completion; returns (ttft_s, n_tokens, total_s)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    if temperature > 0:
        body["seed"] = seed
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]}")
    ttft, n = None, 0
    for line in r:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        j = json.loads(line[6:])
        if "error" in j:
            raise RuntimeError(j["error"]["message"])
        for ch in j.get("choices", []):
            if ch.get("token_ids") and ttft is None:
                ttft = time.perf_counter() - t0
        if j.get("usage"):
            n = j["usage"]["completion_tokens"]
    c.close()
    return ttft or 0.0, n, time.perf_counter() - t0


def run_level(port, streams, args, prompts):
    results, errors = [], []
    lock = threading.Lock()

    def client(k):
        for i in range(args.requests_per_stream):
            try:
                r = one_request(port, prompts[(k * args.requests_per_stream + i) % len(prompts)], args.max_tokens,
                                args.temperature, k * args.requests_per_stream + i)
                with lock:
                    results.append(r)
            except Exception as e:  # reported below; the level fails
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        sys.exit(f"{len(errors)} request(s) failed at {streams} streams: {errors[:3]}")
    tokens = sum(n for _, n, _ in results)
    ttfts = sorted(t for t, _, _ in results)
    return {"streams": streams, "requests": len(results), "generated_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_median_ms": 1000 * statistics.median(ttfts),
            "ttft_p90_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-z", "--tokenizer")
    ap.add_argument("--bin", default=os.environ.get("MK_BIN", os.path.join(here, "..", "build", "megakernel")))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=0)
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy (default); > 0: sampled as an OpenAI client's default request (top_p 1, no "
                         "top_k), a seed per request")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (as ids)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("server_args", nargs="*", help="more flags for `serve` (after --)")
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    # Distinct prompts as token ids (works with and without a tokenizer): 1 = BOS, then varied ids.
    prompts = [[1] + [(7 + 31 * i + 17 * k) % 250 + 3 for k in range(args.prompt_tokens - 1)] for i in range(64)]
    proc, port = start_server(args, max(levels))
    try:
        one_request(port, prompts[0], 4)  # warm-up
        rows = [run_level(port, s, args, prompts) for s in levels]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    base = rows[0]["tokens_per_s"]
    print(f"{'streams':>7} {'requests':>8} {'tokens':>7} {'tokens/s':>9} {'x 1-stream':>10} {'TTFT med ms':>11} {'TTFT p90 ms':>11}")
    for r in rows:
        print(f"{r['streams']:>7} {r['requests']:>8} {r['generated_tokens']:>7} {r['tokens_per_s']:>9.1f} "
              f"{r['tokens_per_s'] / base:>10.2f} {r['ttft_median_ms']:>11.1f} {r['ttft_p90_ms']:>11.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "max_tokens": args.max_tokens,
                       "temperature": args.temperature, "levels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
