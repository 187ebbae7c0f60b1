#!/usr/bin/env python3
"""Replays one decode step of a megakernel trace (`run --backend cuda --trace FILE`) under other
claim policies, with the measured duration of every instruction, to ask "what would the step take if
blocks took instructions differently?" without a GPU.

Model (calibrated against the measured step; see docs/PERFORMANCE.md, H200 2026-12-04):
  - ops run in stages (q/k/v together, then each op alone, in program order); an instruction is ready
    LAT_US after the last instruction of the previous stage ends (release, acquire, barrier);
  - a block spends GAP_US between the end of one instruction and the wait of the next;
  - policies: `ahead` (the first GPU run's loop: the next instruction is claimed when the wait for the
    current one begins), `after_wait` (claimed when the current one starts running), `at_end` (claimed
    when it ends), `rr` (static: tile i of every op on block i mod blocks, in program order).

Usage: bench/trace_sim.py TRACE.json[.gz] [--step N] [--blocks B] [--lat 2.0] [--gap 1.2] [--ops]
Steps are numbered from 1 as in the trace; step 1 of a `run` is the prompt, later ones decode one
token each (`run -n 8` records steps 1..8). --blocks defaults to the trace's number of tracks (the
SMs or emulated blocks that ran). Prints the measured step span, with --ops each op's span and the
most tiles one block ran, then each policy's simulated span.
"""
import argparse
import collections
import gzip
import heapq
import json


def load_all(path):
    """The trace's instruction events (`run --trace` format); exits with a message on a bad file."""
    op = gzip.open if path.endswith(".gz") else open
    try:
        with op(path, "rt") as f:
            d = json.load(f)
        ev = [e for e in d["traceEvents"] if e.get("cat") == "instr"]
        for e in ev:
            e["args"]["step"], e["args"]["instr"], e["args"]["op"], e["ts"], e["dur"], e["tid"]  # noqa: B018
    except (OSError, ValueError, EOFError) as e:
        raise SystemExit(f"error: {path}: {e}")
    except (KeyError, TypeError, AttributeError):
        raise SystemExit(f"error: {path}: not a megakernel trace (run --trace FILE: traceEvents with instr events)")
    if not ev:
        raise SystemExit(f"error: {path}: the trace holds no instructions")
    return ev


def load(path, step, ev=None):
    ev = [e for e in (ev if ev is not None else load_all(path)) if e["args"]["step"] == step]
    if not ev:
        raise SystemExit(f"error: {path}: no instructions of step {step} (steps are numbered from 1)")
    ev.sort(key=lambda e: e["args"]["instr"])
    return ev


QKV = ("q_rope", "q", "k_cache", "v_cache", "k", "v")


def stages_of(ev):
    """Stage index per instruction: a new stage at every change of op, except that the q, k and v
    projections of one layer, in any order, form one stage (they read the same input)."""
    def qkv_layer(o):
        parts = o.split(".")
        return parts[1] if len(parts) == 3 and parts[0] == "blk" and parts[2] in QKV else None

    st, cur, last_op = [], -1, None
    for e in ev:
        o = e["args"]["op"]
        if o != last_op:
            layer = qkv_layer(o)
            if not (layer is not None and last_op is not None and qkv_layer(last_op) == layer):
                cur += 1
            last_op = o
        st.append(cur)
    return st


def simulate(ev, stage, policy, blocks, lat, gap):
    """The step's span (us) under `policy`: event-driven, one running instruction per block."""
    n = len(ev)
    dur = [e["dur"] for e in ev]
    n_stage = max(stage) + 1
    left = collections.Counter(stage)  # instructions of each stage not yet finished
    stage_end = [0.0] * n_stage
    ready_at = [None] * n_stage        # stage s is ready LAT after stage s - 1's last end
    ready_at[0] = 0.0
    lists = [[] for _ in range(blocks)]  # policy rr: each block's static list
    if policy == "rr":
        tile_in_op = collections.Counter()
        for i, e in enumerate(ev):
            o = e["args"]["op"]
            lists[tile_in_op[o] % blocks].append(i)
            tile_in_op[o] += 1
    pos = [0] * blocks
    head = 0                             # the dynamic queue's next instruction
    claimed = [[] for _ in range(blocks)]  # claimed, not yet started, per block
    waiting = collections.defaultdict(list)  # stage -> [(block, wait begin, instruction)]
    running = []                         # heap of (end, block, instruction)
    end = [None] * n

    def claim(b):
        nonlocal head
        if policy == "rr":
            if pos[b] < len(lists[b]):
                claimed[b].append(lists[b][pos[b]])
                pos[b] += 1
        elif head < n:
            claimed[b].append(head)
            head += 1

    def run(b, t_wait, i):
        start = max(t_wait, ready_at[stage[i]])
        claimed[b].pop(0)
        if policy == "after_wait" and not claimed[b]:
            claim(b)
        end[i] = start + dur[i]
        heapq.heappush(running, (end[i], b, i))

    def next_wait(b, t):
        """Block b starts waiting for its next instruction at t."""
        if not claimed[b]:
            claim(b)
            if not claimed[b]:
                return
        i = claimed[b][0]
        if policy == "ahead" and len(claimed[b]) == 1:
            claim(b)  # the next one, while this one waits
        if ready_at[stage[i]] is None:
            waiting[stage[i]].append((b, t, i))
        else:
            run(b, t, i)

    for b in range(blocks):
        next_wait(b, 0.0)
    while running:
        t, b, i = heapq.heappop(running)
        s = stage[i]
        left[s] -= 1
        stage_end[s] = max(stage_end[s], t)
        if left[s] == 0 and s + 1 < n_stage:
            ready_at[s + 1] = stage_end[s] + lat
            for bb, tw, ii in waiting.pop(s + 1, []):
                run(bb, tw, ii)
        if policy == "at_end" and not claimed[b]:
            claim(b)
        next_wait(b, t + gap)
    if any(x is None for x in end):
        raise SystemExit(f"policy {policy}: {sum(x is None for x in end)} instructions never ran (model bug)")
    return max(end)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a trace written by `run --trace FILE` (.json or .json.gz)")
    ap.add_argument("--step", type=int, default=5, help="the step to replay, from 1 (default 5: a decode step)")
    ap.add_argument("--blocks", type=int, default=0, help="blocks to replay on (default: the trace's tracks)")
    ap.add_argument("--lat", type=float, default=2.0, help="us from an op's last tile to the next op's readiness")
    ap.add_argument("--gap", type=float, default=1.2, help="us between a block's instructions")
    ap.add_argument("--ops", action="store_true", help="per-op spans of the measured step")
    a = ap.parse_args()
    for name, v in (("--lat", a.lat), ("--gap", a.gap)):
        if not (v >= 0 and v < 1e9):
            ap.error(f"{name} must be a number of microseconds >= 0, got {v}")
    if a.blocks < 0:
        ap.error(f"--blocks must be >= 1, got {a.blocks}")
    all_ev = load_all(a.trace)
    if a.blocks == 0:
        a.blocks = len({e["tid"] for e in all_ev})
    ev = load(a.trace, a.step, all_ev)
    t0 = min(e["ts"] for e in ev)
    span = max(e["ts"] + e["dur"] for e in ev) - t0
    print(f"measured step {a.step}: {span:.1f} us, {len(ev)} instructions")
    if a.ops:
        by = collections.OrderedDict()
        for e in ev:
            by.setdefault(e["args"]["op"], []).append(e)
        for o, l in by.items():
            s = min(e["ts"] for e in l) - t0
            en = max(e["ts"] + e["dur"] for e in l) - t0
            per_sm = collections.Counter(e["tid"] for e in l)
            print(f"  {o:28s} tiles {len(l):4d}  {s:8.1f} .. {en:8.1f} us  span {en - s:6.1f}  most tiles on one SM {max(per_sm.values())}")
    st = stages_of(ev)
    for pol in ("ahead", "after_wait", "at_end", "rr"):
        print(f"simulated {pol:10s}: {simulate(ev, st, pol, a.blocks, a.lat, a.gap):8.1f} us")


if __name__ == "__main__":
    main()
