#!/usr/bin/python3
"""A small frontend-side client of lora-engine, written against the documented protocol
(man/lora-stack-protocol.7) with the distribution's pyzmq and msgpack, for tests before and beside the
HTTP frontend.

    client.py generate --run-dir DIR --batch FILE [--logprobs N] [--timeout S]
        Sends every request of FILE (lines {"prompt_ids":[...],"max_tokens":K,"lora":NAME|null,
        optional "temperature","seed","ignore_eos","id"}) at once and prints one JSON line per
        request in input order: {"prompt_logprobs","tokens","top_logprobs","finish_reason",
        "error"}, like `lora-worker generate --json`.
    client.py control --run-dir DIR OP [NAME [PATH]]
        One control command (residency, config, health, stats, load, unload, pin, unpin); prints
        the reply as JSON; exit 0 when ok.
    client.py wait-ready --run-dir DIR [--timeout S]
        Waits until the engine answers health with ok.
"""

import argparse
import json
import os
import struct
import sys
import time

import msgpack
import zmq

MAGIC = b"LORA1"


def endpoint(run_dir, name):
    return "ipc://" + os.path.join(run_dir, name + ".sock")


HEARTBEAT_S = 0.5  # the protocol's interval: the engine drops a peer silent for 3 s


class Peer:
    def __init__(self, ep):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(ep)
        self.last_sent = 0.0

    def send(self, body, bins=()):
        self.sock.send_multipart([MAGIC, msgpack.packb(body)] + list(bins))
        self.last_sent = time.time()

    def recv(self, timeout_s):
        """The next message that is not a heartbeat, or None on timeout. Sends heartbeats
        while it waits, as every peer must."""
        deadline = time.time() + timeout_s
        while True:
            now = time.time()
            if now - self.last_sent >= HEARTBEAT_S:
                self.send({"type": "heartbeat"})
            left = min(deadline - now, HEARTBEAT_S)
            if deadline - now <= 0:
                return None
            if not self.sock.poll(max(1, int(left * 1000))):
                continue
            frames = self.sock.recv_multipart()
            body = msgpack.unpackb(frames[1], raw=False)
            if body.get("type") != "heartbeat":
                return body

    def close(self):
        self.sock.close()


def control(run_dir, op, name=None, path=None, timeout_s=60):
    p = Peer(endpoint(run_dir, "control"))
    try:
        body = {"type": "control", "id": 1, "op": op}
        if name is not None:
            body["name"] = name
        if path is not None:
            body["path"] = path
        p.send(body)
        reply = p.recv(timeout_s)
        if reply is None:
            raise TimeoutError("no control reply")
        if "data" in reply and isinstance(reply["data"], bytes):
            reply["data"] = msgpack.unpackb(reply["data"], raw=False)
        return reply
    finally:
        p.close()


class Frontend(Peer):
    def __init__(self, run_dir, timeout_s=30):
        super().__init__(endpoint(run_dir, "frontend"))
        self.send({"type": "hello", "version": 1, "role": "frontend", "pid": os.getpid()})
        self.registry = None
        while True:
            m = self.recv(timeout_s)
            if m is None:
                raise TimeoutError("the engine did not answer hello")
            if m["type"] == "ready":
                self.ready = m
                break

    def request(self, rid, q, logprobs=0):
        body = {"type": "request", "request_id": rid, "n_prompt": len(q["prompt_ids"]),
                "max_tokens": q["max_tokens"], "temperature": q.get("temperature", 0.0),
                "top_p": 1.0, "top_k": 0, "logprobs": logprobs, "prompt_logprobs": True,
                "ignore_eos": q.get("ignore_eos", True), "min_tokens": 0, "stop_token_ids": []}
        if q.get("lora"):
            body["lora"] = q["lora"]
        if "seed" in q:
            body["seed"] = q["seed"]
        ids = q["prompt_ids"]
        self.send(body, [struct.pack("<%di" % len(ids), *ids)])

    def abort(self, rid):
        self.send({"type": "abort", "request_id": rid})

    def collect(self, rids, timeout_s):
        """Outputs of every request in rids until each finished: {rid: result}."""
        res = {r: {"prompt_logprobs": None, "tokens": [], "top_logprobs": [],
                   "finish_reason": None, "error": None} for r in rids}
        left = set(rids)
        while left:
            m = self.recv(timeout_s)
            if m is None:
                raise TimeoutError("requests still open: %s" % sorted(left))
            if m["type"] != "output" or m["request_id"] not in res:
                continue
            r = res[m["request_id"]]
            if m.get("prompt_logprobs") is not None and r["prompt_logprobs"] is None:
                lps = m["prompt_logprobs"]
                r["prompt_logprobs"] = [None] + list(lps[1:])
            r["tokens"] += m.get("tokens", [])
            top_n = m.get("top_n", 0)
            ids, lps = m.get("top_ids", []), m.get("top_logprobs", [])
            for k in range(len(m.get("tokens", []))):
                r["top_logprobs"].append([[ids[k * top_n + j], lps[k * top_n + j]]
                                          for j in range(top_n)])
            if m.get("finished"):
                r["finish_reason"] = m.get("finish_reason")
                r["error"] = m.get("error")
                left.discard(m["request_id"])
        return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--run-dir", required=True)
    g.add_argument("--batch", required=True)
    g.add_argument("--logprobs", type=int, default=0)
    g.add_argument("--timeout", type=float, default=120)
    c = sub.add_parser("control")
    c.add_argument("--run-dir", required=True)
    c.add_argument("op")
    c.add_argument("name", nargs="?")
    c.add_argument("path", nargs="?")
    w = sub.add_parser("wait-ready")
    w.add_argument("--run-dir", required=True)
    w.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    if a.cmd == "generate":
        fe = Frontend(a.run_dir)
        reqs = [json.loads(line) for line in open(a.batch) if line.strip()]
        rids = [q.get("id", "req-%d" % i) for i, q in enumerate(reqs)]
        for rid, q in zip(rids, reqs):
            fe.request(rid, q, a.logprobs)
        res = fe.collect(rids, a.timeout)
        for rid in rids:
            print(json.dumps(res[rid]))
        fe.close()
        return 0 if all(res[r]["error"] is None for r in rids) else 1
    if a.cmd == "control":
        reply = control(a.run_dir, a.op, a.name, a.path)
        print(json.dumps(reply, default=str))
        return 0 if reply.get("ok") else 1
    deadline = time.time() + a.timeout
    while time.time() < deadline:
        try:
            if control(a.run_dir, "health", timeout_s=1).get("ok"):
                return 0
        except TimeoutError:
            pass
        time.sleep(0.05)
    print("client: the engine did not become ready", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
