#!/usr/bin/python3
"""A minimal engine written against the documented wire protocol (man/lora-stack-protocol.7), in
Python with the distribution's pyzmq and msgpack: it drives real `lora-worker serve` processes
so that the worker is tested before, and independently of, the C engine.

    fake_engine.py generate --worker BIN --model DIR [--lora NAME=DIR]... --batch FILE
                            [--tp N] [--logprobs N] [--block-size N]
        Runs the batch greedily (prefill of every prompt in the first step, then one decode
        token per sequence per step) and prints one JSON line per request, like
        `lora-worker generate --json` (prompt_logprobs, tokens and top_logprobs).

The Engine class is also imported by tests/ref/test_worker.py.

Only the standard library, zmq and msgpack are used.
"""

import argparse
import json
import os
import struct
import subprocess
import tempfile
import time

import msgpack
import zmq

MAGIC = b"LORA1"


class Engine:
    def __init__(self, worker_bin, model, tp, limits):
        self.dir = tempfile.mkdtemp(prefix="lora-fake-engine-")
        self.endpoint = "ipc://" + os.path.join(self.dir, "workers.sock")
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.tp = tp
        self.limits = dict(limits, world_size=tp)
        self.procs = [subprocess.Popen([worker_bin, "serve", "--engine", self.endpoint,
                                        "--rank", str(r)]) for r in range(tp)]
        self.rids = {}
        self.op_id = 0
        self.step_id = 0
        while len(self.rids) < tp:
            rid, body, _ = self.recv()
            if body["type"] == "hello":
                assert body["role"] == "worker", body
                self.rids[body["rank"]] = rid
        shm = "/lora-fake-%d" % os.getpid()
        for r in range(tp):
            self.send(r, {"type": "setup", "model": model, "rank": r, "limits": self.limits,
                          "shm": shm})
        for body in self.gather("setup_done"):
            assert body["ok"], body

    def close(self):
        for r in range(self.tp):
            try:
                self.send(r, {"type": "shutdown"})
            except zmq.ZMQError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.sock.close()
        self.ctx.term()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def send(self, rank, body, bins=()):
        self.sock.send_multipart([self.rids[rank], MAGIC, msgpack.packb(body)] + list(bins))

    def recv(self, timeout_s=60):
        """The next message other than a heartbeat: (routing id, body, binary frames)."""
        deadline = time.time() + timeout_s
        while True:
            left = deadline - time.time()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise TimeoutError("no message from the workers")
            frames = self.sock.recv_multipart()
            assert frames[1] == MAGIC, frames[:2]
            body = msgpack.unpackb(frames[2], raw=False)
            if body["type"] != "heartbeat":
                return frames[0], body, frames[3:]

    def gather(self, type_name):
        """One reply of type_name from every rank, by rank."""
        got = {}
        while len(got) < self.tp:
            _, body, _ = self.recv()
            if body["type"] == type_name:
                got[body["rank"]] = body
        return [got[r] for r in range(self.tp)]

    def adapter_op(self, op, name, path=None, slot=None):
        self.op_id += 1
        body = {"type": "adapter_op", "op_id": self.op_id, "op": op, "name": name}
        if path is not None:
            body["path"] = path
        if slot is not None:
            body["slot"] = slot
        for r in range(self.tp):
            self.send(r, body)
        return self.gather("adapter_op_reply")

    def residency(self):
        for r in range(self.tp):
            self.send(r, {"type": "residency"})
        return [b["state"] for b in self.gather("residency_reply")]

    def take_notifications(self):
        for r in range(self.tp):
            self.send(r, {"type": "take_notifications"})
        return self.gather("notifications")

    def step(self, seqs, tokens, tables):
        self.step_id += 1
        body = {"type": "step", "step_id": self.step_id, "seqs": seqs,
                "n_tokens_total": len(tokens), "n_block_entries": len(tables)}
        bins = [struct.pack("<%di" % len(tokens), *tokens),
                struct.pack("<%di" % len(tables), *tables)]
        for r in range(self.tp):
            self.send(r, body, bins)
        replies = self.gather("step_reply")
        for rep in replies:
            assert rep["ok"], rep
        return replies[0]["outs"]


def generate(args):
    limits = {"max_loras": max(1, len(args.lora)), "max_cpu_loras": max(1, len(args.lora)),
              "max_lora_rank": 64, "block_size": args.block_size, "num_kv_blocks": 512,
              "max_model_len": 1024, "max_num_batched_tokens": 1024, "max_num_seqs": 64,
              "vocab_size": 0}
    eng = Engine(args.worker, args.model, args.tp, limits)
    try:
        names = []
        for i, spec in enumerate(args.lora):
            name, path = spec.split("=", 1)
            for rep in eng.adapter_op("add", name, path=path):
                assert rep["ok"], rep
            for rep in eng.adapter_op("activate", name, slot=i):
                assert rep["ok"], rep
            names.append(name)
        reqs = [json.loads(line) for line in open(args.batch) if line.strip()]
        bs = args.block_size
        next_block = 0
        state = []
        for q in reqs:
            need = (len(q["prompt_ids"]) + q["max_tokens"] + bs - 1) // bs
            state.append({"ids": list(q["prompt_ids"]), "pos": 0, "out": [], "top": [],
                          "plp": [None],
                          "blocks": list(range(next_block, next_block + need)),
                          "slot": names.index(q["lora"]) if q.get("lora") else -1,
                          "max": q["max_tokens"]})
            next_block += need
        while True:
            live = [i for i, s in enumerate(state) if len(s["out"]) < s["max"]]
            if not live:
                break
            seqs, tokens, tables = [], [], []
            for i in live:
                s = state[i]
                chunk = s["ids"][s["pos"]:]
                n_blocks = (s["pos"] + len(chunk) + bs - 1) // bs
                seqs.append({"seq_id": i, "n_tokens": len(chunk), "pos": s["pos"],
                             "slot": s["slot"], "all_logits": s["pos"] == 0, "sample": True,
                             "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0,
                             "n_generated": len(s["out"]), "top_n": args.logprobs,
                             "n_blocks": n_blocks, "next_token": -1})
                tokens += chunk
                tables += s["blocks"][:n_blocks]
            outs = eng.step(seqs, tokens, tables)
            for i, o in zip(live, outs):
                s = state[i]
                assert o["seq_id"] == i, o
                if s["pos"] == 0:
                    s["plp"] += o.get("prompt_logprobs", [])
                s["pos"] = len(s["ids"])
                s["ids"].append(o["token"])
                s["out"].append(o["token"])
                s["top"].append([[a, b] for a, b in zip(o.get("top_ids", []),
                                                        o.get("top_logprobs", []))])
        for s in state:
            print(json.dumps({"prompt_logprobs": s["plp"], "tokens": s["out"],
                              "top_logprobs": s["top"]}))
    finally:
        eng.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--worker", required=True)
    g.add_argument("--model", required=True)
    g.add_argument("--lora", action="append", default=[])
    g.add_argument("--batch", required=True)
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--logprobs", type=int, default=0)
    g.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    if args.cmd == "generate":
        generate(args)


if __name__ == "__main__":
    main()
