#!/usr/bin/python3
"""The cost of the process split: the share of each decode step that the engine and the worker
spend outside the model (scheduling, encoding, ZeroMQ transport, decoding, routing outputs), at
batch 1 and batch 64, on a model with the shape of a 0.5B Llama.

    protocol_share.py --bin BUILD/bin [--model DIR] [--tokens N]

The engine publishes, per step, its wall time (step_seconds) and the slowest rank's own time in
the step (model_seconds, from receiving the step to sending the reply: forward pass, sampling and
the worker's decoding of the step message). The share is 1 - model_seconds / step_seconds over
the steps that decode only, median and mean. Without --model the model is generated into a
temporary directory and removed afterwards.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from client import Frontend  # noqa: E402
from test_engine import Stack, subscribe  # noqa: E402


def measure(stack, batch, tokens):
    sub = subscribe(stack.dir, b"stats")
    fe = Frontend(stack.dir)
    rids = ["b%d-%d" % (batch, i) for i in range(batch)]
    for i, rid in enumerate(rids):
        fe.request(rid, {"prompt_ids": [1 + i % 200, 2, 3, 4, 5, 6, 7, 8], "max_tokens": tokens,
                         "lora": None})
    fe.collect(rids, 3600)
    fe.close()
    shares = []
    while sub.poll(500):
        s = msgpack.unpackb(sub.recv_multipart()[2], raw=False)
        decoding = s["step_tokens"] == batch and s["running"] == batch
        if os.environ.get("LORA_BENCH_DEBUG"):
            print("# stats", {k: s[k] for k in ("running", "waiting", "step_tokens",
                                                "step_seconds", "model_seconds")})
        if decoding and s["step_seconds"] > 0:
            shares.append(1 - s.get("model_seconds", 0) / s["step_seconds"])
    sub.close()
    return shares


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    tmp = None
    model = a.model
    if not model:
        tmp = tempfile.mkdtemp(prefix="lora-bench-")
        model = os.path.join(tmp, "model")
        subprocess.run([os.path.join(a.bin, "lora-worker"), "make-model", "--out", model,
                        "--hidden", "896", "--layers", "24", "--heads", "14", "--kv-heads", "2",
                        "--intermediate", "4864", "--vocab", "151936", "--tied"], check=True)
    try:
        st = Stack(a.bin, model, 1, ["--max-num-seqs", "64", "--max-num-batched-tokens", "1024",
                                     "--max-model-len", "256"])
        try:
            print("protocol share of decode steps (1 - worker time / engine step time):")
            for batch in (1, 64):
                s = measure(st, batch, a.tokens)
                if not s:
                    print("  batch %2d: no decode step seen" % batch)
                    continue
                print("  batch %2d: median %.2f%%, mean %.2f%% over %d steps" %
                      (batch, 100 * statistics.median(s), 100 * statistics.mean(s), len(s)))
        finally:
            st.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
