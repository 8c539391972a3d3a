#!/usr/bin/python3
"""lora-worker serve against the Python engine of fake_engine.py: residency, pinning, unload,
the notification channel, malformed traffic and a vanished engine. Prints TAP.

    test_worker.py WORKER_BIN MODEL_DIR ADAPTER_DIR...   (at least three adapters)
"""

import os
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_engine import MAGIC, Engine  # noqa: E402
from tap import check, done  # noqa: E402

LIMITS = {"max_loras": 2, "max_cpu_loras": 3, "max_lora_rank": 64, "block_size": 16,
          "num_kv_blocks": 64, "max_model_len": 512, "max_num_batched_tokens": 256,
          "max_num_seqs": 16, "vocab_size": 0}

def ok_all(replies):
    for r in replies:
        assert r["ok"], r


def main():
    worker, model, adapters = sys.argv[1], sys.argv[2], sys.argv[3:6]
    names = ["a1", "a2", "a3"]
    eng = Engine(worker, model, 1, LIMITS)

    def residency_after_loads():
        for i, (n, p) in enumerate(zip(names, adapters)):
            ok_all(eng.adapter_op("add", n, path=p))
            ok_all(eng.adapter_op("activate", n, slot=[0, 1, 0][i]))
        st = eng.residency()[0]
        assert st["slots"] == ["a3", "a2"], st
        assert st["cpu"] == ["a1", "a2", "a3"], st
        assert st["pinned"] == [], st

    def pin_brings_back():
        ok_all(eng.adapter_op("pin", "a1"))
        st = eng.residency()[0]
        assert "a1" in st["slots"] and st["pinned"] == ["a1"], st
        # A pinned adapter's slot cannot be taken.
        slot = st["slots"].index("a1")
        rep = eng.adapter_op("activate", "a3" if "a3" not in st["slots"] else "a2", slot=slot)[0]
        assert not rep["ok"] and "pinned" in rep["error"], rep
        assert "a1" in eng.residency()[0]["slots"]

    def remove_unloads():
        ok_all(eng.adapter_op("remove", "a2"))
        st = eng.residency()[0]
        assert "a2" not in st["slots"] and "a2" not in st["cpu"], st
        rep = eng.adapter_op("activate", "a2", slot=0)[0]
        assert not rep["ok"], rep

    def notifications_tell_the_state():
        items = eng.take_notifications()[0]["items"]
        assert items, "no notification"
        last = items[-1]
        assert last["kind"] == "lora_load", last
        assert last["state"] == eng.residency()[0], (last["state"], eng.residency()[0])
        kinds = {t["transition"] for it in items for t in it.get("timings", [])}
        assert {"load", "activate", "remove"} <= kinds, kinds
        assert eng.take_notifications()[0]["items"] == []

    def bad_add_is_refused():
        rep = eng.adapter_op("add", "bad", path="/nonexistent/adapter")[0]
        assert not rep["ok"] and "adapter_config.json" in rep["error"], rep
        rep = eng.adapter_op("add", "a1", path=adapters[0])[0]
        assert not rep["ok"] and "already" in rep["error"], rep

    def overflow_drops_oldest():
        for _ in range(600):
            ok_all(eng.adapter_op("unpin", "a1"))
            ok_all(eng.adapter_op("pin", "a1"))
        m = eng.take_notifications()[0]
        assert len(m["items"]) == 1024, len(m["items"])
        assert m["dropped"] == 1200 - 1024, m["dropped"]
        seqs = [it["seq"] for it in m["items"]]
        assert seqs == sorted(seqs) and seqs[-1] - seqs[0] == 1023, (seqs[0], seqs[-1])

    def malformed_is_dropped():
        rid = eng.rids[0]
        for frames in ([rid, b"LORA9", b"\x80"], [rid, MAGIC, b"\xc1"], [rid, MAGIC, b"\x81"],
                       [rid, MAGIC, b"\x81\xa4type\xa7nothing"], [rid, MAGIC]):
            eng.sock.send_multipart(frames)
        assert eng.residency()[0]["cpu"] == ["a1", "a3"]

    def engine_gone_worker_exits():
        eng.sock.close()
        t0 = time.time()
        rc = eng.procs[0].wait(timeout=15)
        assert rc == 111, rc
        assert time.time() - t0 < 10, time.time() - t0

    check("loading 1, 2, 3 with 2 slots and 3 cache places leaves 2, 3 in slots, 1 in the cache",
          residency_after_loads)
    check("pinning 1 brings it into a slot, and its slot cannot be taken", pin_brings_back)
    check("remove takes the adapter out of its slot and the cache", remove_unloads)
    check("notifications carry the full state and the load, activate and remove timings",
          notifications_tell_the_state)
    check("a failed or duplicate add is refused with the reason", bad_add_is_refused)
    check("1200 notifications: the oldest are dropped, 1024 kept, the drop count reported",
          overflow_drops_oldest)
    check("malformed frames are dropped and the worker keeps serving", malformed_is_dropped)
    check("the worker exits with 111 when the engine goes silent", engine_gone_worker_exits)
    eng.procs = []
    try:
        eng.ctx.term()
    except zmq.ZMQError:
        pass
    for name in os.listdir(eng.dir):
        os.unlink(os.path.join(eng.dir, name))
    os.rmdir(eng.dir)
    return done()


if __name__ == "__main__":
    sys.exit(main())
