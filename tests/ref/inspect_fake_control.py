#!/usr/bin/python3
"""A stand-in for lora-engine's control socket, for tests of lora-inspect: what the real engine
cannot be made to do on demand (answer late, answer with another id first, be unhealthy).
Written against the documented protocol (man/lora-engine.1, CONTROL) with pyzmq and msgpack.

    inspect_fake_control.py --endpoint EP --report FILE [--delay-s S] [--wrong-id-first]
                            [--unhealthy REASON] [--timeout-s S]

Binds a ROUTER at EP, prints "ready" on stderr, takes one control request, waits --delay-s while
it counts the heartbeats that arrive, optionally sends a reply with another id first, then the
reply: for health, healthy or (--unhealthy) ok false with the reason; for the other operations
a small data map. It writes {"op", "id", "heartbeats", "frames_ok"} as JSON to FILE and exits 0,
or exits 1 when no request came within --timeout-s.
"""

import argparse
import json
import sys
import time

import msgpack
import zmq

MAGIC = b"LORA1"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--wrong-id-first", action="store_true")
    ap.add_argument("--unhealthy")
    ap.add_argument("--timeout-s", type=float, default=20.0)
    a = ap.parse_args()

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.bind(a.endpoint)
    print("ready", file=sys.stderr, flush=True)

    report = {"op": None, "id": None, "heartbeats": 0, "frames_ok": True}
    deadline = time.time() + a.timeout_s
    rid = req = None
    while req is None:
        left = deadline - time.time()
        if left <= 0 or not sock.poll(int(left * 1000)):
            print("no request", file=sys.stderr)
            return 1
        frames = sock.recv_multipart()
        report["frames_ok"] &= len(frames) == 3 and frames[1] == MAGIC
        body = msgpack.unpackb(frames[-1], raw=False)
        if body.get("type") == "heartbeat":
            report["heartbeats"] += 1
        elif body.get("type") == "control":
            rid, req = frames[0], body
    report["op"], report["id"] = req["op"], req["id"]

    until = time.time() + a.delay_s
    while time.time() < until:
        if sock.poll(max(1, int((until - time.time()) * 1000))):
            frames = sock.recv_multipart()
            if msgpack.unpackb(frames[-1], raw=False).get("type") == "heartbeat":
                report["heartbeats"] += 1

    def reply(body):
        sock.send_multipart([rid, MAGIC, msgpack.packb(body)])

    if a.wrong_id_first:
        reply({"type": "control_reply", "id": req["id"] + 1000, "ok": False,
               "error": "this reply is for someone else"})
    if req["op"] == "health":
        data = {"healthy": a.unhealthy is None, "reason": a.unhealthy or "", "workers": 1}
        body = {"type": "control_reply", "id": req["id"], "ok": a.unhealthy is None,
                "data": data}
        if a.unhealthy is not None:
            body["error"] = a.unhealthy
    else:
        body = {"type": "control_reply", "id": req["id"], "ok": True,
                "data": {"running": 0, "waiting": 0, "note": "tab\there\nnewline"}}
    reply(body)
    time.sleep(0.2)
    with open(a.report, "w") as f:
        json.dump(report, f)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
