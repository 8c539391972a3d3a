#!/usr/bin/python3
"""A worker rank written against the documented wire protocol (man/lora-stack-protocol.7), in
Python with the distribution's pyzmq and msgpack: it holds no model and runs no step, but says
hello, answers setup with the KV blocks it has room for, and answers what an engine asks of a
rank at start-up and while idle, so that the engine's handling of the ranks' KV capacities can be
tested with ranks that differ.

    fake_worker.py --engine ENDPOINT --rank N --kv-room BLOCKS

It reports min(BLOCKS, the setup's cap) KV blocks (the cap is limits.num_kv_blocks, 0: none), as
lora-worker does with the blocks its budget holds. It heartbeats every 500 ms; it exits 0 on
shutdown, 1 when the engine refuses its hello, 111 when the engine is silent for 3 s. It says
what it did on standard error, one line each: "fake_worker: rank R: ...".

Only the standard library, zmq and msgpack are used.
"""

import argparse
import os
import sys
import time

import msgpack
import zmq

MAGIC = b"LORA1"
HEARTBEAT_S = 0.5
DEAD_S = 3.0


def log(rank, what):
    print("fake_worker: rank %d: %s" % (rank, what), file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--kv-room", type=int, required=True)
    args = ap.parse_args()

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"worker-%d-%d" % (args.rank, os.getpid()))
    sock.setsockopt(zmq.LINGER, 500)
    sock.connect(args.engine)

    def send(body):
        sock.send_multipart([MAGIC, msgpack.packb(body, use_bin_type=True)])

    hello = {"type": "hello", "version": 1, "role": "worker", "rank": args.rank,
             "pid": os.getpid()}
    rank = args.rank
    engine_seen = False
    set_up = False
    last_sent = 0.0
    last_heard = time.monotonic()
    while True:
        now = time.monotonic()
        if engine_seen and now - last_heard > DEAD_S:
            log(rank, "the engine is gone")
            return 111
        if now - last_sent >= HEARTBEAT_S:
            send({"type": "heartbeat"} if engine_seen else hello)
            last_sent = now
        if not sock.poll(100):
            continue
        frames = sock.recv_multipart()
        engine_seen = True
        last_heard = time.monotonic()
        if len(frames) < 2 or frames[0] != MAGIC:
            continue
        body = msgpack.unpackb(frames[1], raw=False)
        t = body.get("type")
        if t == "setup":
            cap = body["limits"]["num_kv_blocks"]
            blocks = min(args.kv_room, cap) if cap > 0 else args.kv_room
            set_up = True
            log(rank, "set up with %d KV blocks (room for %d, cap %d)" % (blocks, args.kv_room,
                                                                         cap))
            send({"type": "setup_done", "ok": True, "rank": rank, "weight_bytes": 0,
                  "kv_blocks": blocks})
        elif t == "setup_done" and not set_up:
            log(rank, "refused: %s" % body.get("error"))
            return 1
        elif t == "take_notifications":
            send({"type": "notifications", "rank": rank, "dropped": 0, "items": []})
        elif t == "residency":
            send({"type": "residency_reply", "rank": rank,
                  "state": {"slots": [], "cpu": [], "pinned": []}})
        elif t == "adapter_op":
            send({"type": "adapter_op_reply", "op_id": body["op_id"], "rank": rank,
                  "ok": False, "error": "a fake worker holds no adapter", "seconds": 0.0})
        elif t == "step":
            send({"type": "step_reply", "step_id": body["step_id"], "rank": rank, "ok": False,
                  "error": "a fake worker runs no step", "doorbell": False,
                  "step_seconds": 0.0, "outs": []})
        elif t == "shutdown":
            log(rank, "shutdown")
            return 0


if __name__ == "__main__":
    sys.exit(main())
