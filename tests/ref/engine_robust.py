#!/usr/bin/env python3
"""Engine robustness checks against a running lora-engine (run directory given), one per
subcommand, each exiting 0 when it holds and 1 with the reason otherwise:

  unload-idle RUN ADAPTER   a stream on ADAPTER runs; an unload sent meanwhile is answered once
                            the stream ends, with no other request to run a step; afterwards no
                            rank holds the adapter and loading it again is not "already loaded"
  flood RUN N               N malformed control messages and N heartbeats on the control socket;
                            the engine answers a health query afterwards
  serve RUN [ADAPTER]       one request completes (with ADAPTER when given)
  impostor RUN ID           a connection that takes the routing id ID (a live worker's) and says
                            hello for its rank: ZeroMQ refuses it, so nothing answers it
  first-ok RUN ADAPTER T    retries a request on ADAPTER until one completes without error, for at
                            most T s; prints the seconds it took
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client  # noqa: E402


def fail(why):
    print("engine_robust: " + why, file=sys.stderr)
    sys.exit(1)


def unload_idle(run, adapter):
    fe = client.Frontend(run)
    fe.request("long", {"prompt_ids": [1, 2, 3], "max_tokens": 24, "lora": adapter})
    got_first = False
    while not got_first:
        m = fe.recv(30)
        if m is None:
            fail("no output for the stream")
        if m["type"] == "output" and m["request_id"] == "long":
            if m.get("finished"):
                fail("the stream ended before the unload was sent: %r" % m)
            got_first = True
    ctl = client.Peer(client.endpoint(run, "control"))
    ctl.send({"type": "control", "id": 7, "op": "unload", "name": adapter})
    finished = False
    reply = None
    deadline = time.time() + 60
    # The frontend drains its stream while the unload is pending; both keep their heartbeats.
    while time.time() < deadline and (reply is None or not finished):
        if not finished:
            m = fe.recv(0.05)
            if m and m["type"] == "output" and m["request_id"] == "long" and m.get("finished"):
                if m.get("error"):
                    fail("the stream failed: %r" % m.get("error"))
                finished = True
        if reply is None:
            reply = ctl.recv(0.05)
    if not finished:
        fail("the stream did not finish")
    if reply is None:
        fail("the unload was not answered within 60 s of the stream's end")
    if not reply.get("ok"):
        fail("the unload failed: %r" % reply)
    res = client.control(run, "residency")["data"]
    for rank in res["ranks"]:
        if adapter in rank["slots"] or adapter in rank["cpu"]:
            fail("rank %d still holds %s: %r" % (rank["rank"], adapter, rank))
    if any(a["name"] == adapter for a in res["adapters"]):
        fail("%s is still registered" % adapter)
    fe.close()
    ctl.close()
    print("unloaded once the stream ended")


def flood(run, n):
    ctl = client.Peer(client.endpoint(run, "control"))
    for i in range(n):
        ctl.send({"type": "heartbeat"})
        ctl.send({"type": "control", "op": "no-such-op", "id": i})
    ctl.send({"type": "control", "id": 424242, "op": "health"})
    while True:
        m = ctl.recv(60)
        if m is None:
            fail("no health reply after the flood")
        if m.get("id") == 424242:
            break
    ctl.close()
    print("answered after %d malformed messages" % n)


def one_request(run, adapter, timeout_s=30):
    fe = client.Frontend(run, timeout_s)
    try:
        q = {"prompt_ids": [4, 5, 6], "max_tokens": 3}
        if adapter:
            q["lora"] = adapter
        fe.request("r", q)
        return fe.collect(["r"], timeout_s)["r"]
    finally:
        fe.close()


def serve(run, adapter=None):
    r = one_request(run, adapter)
    if r["error"] or len(r["tokens"]) != 3:
        fail("the request failed: %r" % r)
    print("served")


def first_ok(run, adapter, limit_s):
    t0 = time.time()
    last = None
    while time.time() - t0 < limit_s:
        try:
            r = one_request(run, adapter, 5)
            if not r["error"] and len(r["tokens"]) == 3:
                print("%.2f" % (time.time() - t0))
                return
            last = r["error"]
        except TimeoutError as e:
            last = str(e)
        time.sleep(0.05)
    fail("no request completed within %s s (last: %s)" % (limit_s, last))


def impostor(run, rid):
    ctx = client.zmq.Context.instance()
    s = ctx.socket(client.zmq.DEALER)
    s.setsockopt(client.zmq.LINGER, 0)
    s.setsockopt(client.zmq.ROUTING_ID, rid.encode())
    s.connect(client.endpoint(run, "worker"))
    hello = client.msgpack.packb({"type": "hello", "version": 1, "role": "worker", "rank": 0,
                                  "pid": 1})
    deadline = time.time() + 3
    while time.time() < deadline:
        if s.poll(0, client.zmq.POLLOUT):
            s.send_multipart([client.MAGIC, hello], client.zmq.NOBLOCK)
        if s.poll(200):
            fail("the engine answered a connection that took a live worker's routing id: %r"
                 % s.recv_multipart())
    s.close()
    print("nothing answered the impostor")


def main():
    cmd, run = sys.argv[1], sys.argv[2]
    if cmd == "unload-idle":
        unload_idle(run, sys.argv[3])
    elif cmd == "flood":
        flood(run, int(sys.argv[3]))
    elif cmd == "serve":
        serve(run, sys.argv[3] if len(sys.argv) > 3 else None)
    elif cmd == "impostor":
        impostor(run, sys.argv[3])
    elif cmd == "first-ok":
        first_ok(run, sys.argv[3], float(sys.argv[4]))
    else:
        fail("unknown check " + cmd)


if __name__ == "__main__":
    main()
