#!/usr/bin/python3
"""lora-engine with real lora-worker processes on ipc sockets in a temporary run directory,
driven through the frontend, control and publish sockets (client.py). Prints TAP.

    test_engine.py BIN_DIR MODEL_DIR EXPECTED.jsonl BATCH.jsonl ADAPTER_DIR...  (8 adapters a0..a7)

EXPECTED holds `lora-worker generate --json --ignore-eos --logprobs 3` of BATCH.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client import Frontend, control, endpoint  # noqa: E402
from tap import check, done  # noqa: E402

class Stack:
    """An engine and its workers in a fresh run directory; always stopped by close()."""

    def __init__(self, bins, model, tp=1, args=(), worker_env=None, before_start=None):
        self.dir = tempfile.mkdtemp(prefix="lora-test-engine-")
        os.chmod(self.dir, 0o700)
        if before_start:
            before_start(self.dir)
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.engine = subprocess.Popen(
            [os.path.join(bins, "lora-engine"), "--model", model, "--run-dir", self.dir,
             "--tensor-parallel-size", str(tp), "--idle-notify-ms", "100"] + list(args),
            stdout=self.log, stderr=self.log)
        self.workers = [subprocess.Popen(
            [os.path.join(bins, "lora-worker"), "serve", "--engine",
             endpoint(self.dir, "worker"), "--rank", str(r)], stdout=self.log, stderr=self.log,
            env=dict(os.environ, **(worker_env or {}).get(r, {})))
            for r in range(tp)]
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.engine.poll() is not None:
                raise RuntimeError("the engine exited: " + self.logs())
            try:
                if control(self.dir, "health", timeout_s=0.5).get("ok"):
                    return
            except TimeoutError:
                pass
            time.sleep(0.05)
        raise TimeoutError("the stack did not become ready: " + self.logs())

    def logs(self):
        self.log.flush()
        return open(os.path.join(self.dir, "log")).read()[-3000:]

    def control(self, op, name=None, path=None):
        return control(self.dir, op, name, path)

    def residency(self):
        r = self.control("residency")
        assert r["ok"], r
        return r["data"]

    def close(self):
        for p in [self.engine] + self.workers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [self.engine] + self.workers:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def subscribe(run_dir, topic):
    """A SUB socket on the engine's publish socket, for topic, given time to join."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint(run_dir, "publish"))
    time.sleep(0.3)
    return sub


def load_jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main():
    bins, model, expected_path, batch_path = sys.argv[1:5]
    adapters = sys.argv[5:13]
    mods = []
    for i, a in enumerate(adapters):
        mods += ["--lora-modules", "a%d=%s" % (i, a)]
    expected = load_jsonl(expected_path)
    batch = load_jsonl(batch_path)

    def same_as_generate(tp):
        st = Stack(bins, model, tp, ["--max-loras", "8"] + mods)
        try:
            fe = Frontend(st.dir)
            rids = ["r%d" % i for i in range(len(batch))]
            for rid, q in zip(rids, batch):
                fe.request(rid, q, 3)
            got = fe.collect(rids, 120)
            fe.close()
            for i, rid in enumerate(rids):
                g, x = got[rid], expected[i]
                assert g["error"] is None, g
                assert g["tokens"] == x["tokens"], (i, g["tokens"], x["tokens"])
                for a, b in zip(g["top_logprobs"], x["top_logprobs"]):
                    assert [p[0] for p in a] == [p[0] for p in b], (i, a, b)
                    assert max(abs(p[1] - q[1]) for p, q in zip(a, b)) < 1e-4, (i, a, b)
                for a, b in zip(g["prompt_logprobs"][1:], x["prompt_logprobs"][1:]):
                    assert abs(a - b) < 1e-4, (i, a, b)
        finally:
            st.close()

    def residency_levels():
        st = Stack(bins, model, 2, ["--max-loras", "2", "--max-cpu-loras", "3"] + mods[:6])
        try:
            d = st.residency()
            for rank in d["ranks"]:
                assert sorted(rank["slots"]) == ["a1", "a2"], d
                assert rank["cpu"] == ["a0", "a1", "a2"], d
            assert d["disagreement"] == 0, d
            r = st.control("pin", "a0")
            assert r["ok"], r
            d = st.residency()
            for rank in d["ranks"]:
                assert "a0" in rank["slots"] and rank["pinned"] == ["a0"], d
            assert d["ranks"][0] == dict(d["ranks"][1], rank=0), d
            # Requests for the other adapters go on, and never evict the pinned one.
            fe = Frontend(st.dir)
            for i, name in enumerate(["a1", "a2", "a1", "a2"]):
                fe.request("p%d" % i, {"prompt_ids": [5, 6, 7], "max_tokens": 3, "lora": name})
            got = fe.collect(["p%d" % i for i in range(4)], 60)
            fe.close()
            assert all(g["error"] is None for g in got.values()), got
            d = st.residency()
            for rank in d["ranks"]:
                assert "a0" in rank["slots"], d
            assert d["disagreement"] == 0, d
        finally:
            st.close()

    def unload_unloads():
        st = Stack(bins, model, 1, ["--max-loras", "2", "--max-cpu-loras", "3"] + mods[:6])
        try:
            r = st.control("unload", "a1")
            assert r["ok"], r
            d = st.residency()
            for rank in d["ranks"]:
                assert "a1" not in rank["slots"] and "a1" not in rank["cpu"], d
            assert all(a["name"] != "a1" for a in d["adapters"]), d
            fe = Frontend(st.dir)
            fe.request("x", {"prompt_ids": [1, 2], "max_tokens": 2, "lora": "a1"})
            got = fe.collect(["x"], 30)["x"]
            fe.close()
            assert got["error"] and "not found" in got["error"], got
            r = st.control("unload", "a1")
            assert not r["ok"] and "not found" in r["error"], r
        finally:
            st.close()

    def max_loras_per_step():
        st = Stack(bins, model, 1, ["--max-loras", "2", "--max-cpu-loras", "8"] + mods)
        try:
            sub = subscribe(st.dir, b"stats")
            fe = Frontend(st.dir)
            rids = []
            # A queue for the resident adapters, then one for a non-resident adapter behind it.
            for i in range(24):
                rid = "q%d" % i
                fe.request(rid, {"prompt_ids": [3 + i, 4, 5], "max_tokens": 6,
                                 "lora": ["a6", "a7"][i % 2]})
                rids.append(rid)
            fe.request("late", {"prompt_ids": [9, 9, 9], "max_tokens": 4, "lora": "a0"})
            got = fe.collect(rids + ["late"], 120)
            fe.close()
            assert all(g["error"] is None for g in got.values()), got
            assert len(got["late"]["tokens"]) == 4, got["late"]
            seen = 0
            while sub.poll(200):
                frames = sub.recv_multipart()
                s = msgpack.unpackb(frames[2], raw=False)
                assert s["step_adapters"] <= 2, s
                seen += 1
            sub.close()
            assert seen > 0, "no stats were published"
        finally:
            st.close()

    def preemption():
        st = Stack(bins, model, 1, ["--max-loras", "8", "--num-kv-blocks", "12",
                                    "--block-size", "4"] + mods)
        try:
            fe = Frontend(st.dir)
            rids = ["r%d" % i for i in range(len(batch))]
            for rid, q in zip(rids, batch):
                fe.request(rid, q, 3)
            got = fe.collect(rids, 120)
            fe.close()
            for i, rid in enumerate(rids):
                assert got[rid]["tokens"] == expected[i]["tokens"], (i, got[rid])
            stats = st.control("stats")["data"]
            assert stats["num_preemptions"] > 0, stats
            assert stats["free_blocks"] == stats["num_kv_blocks"] == 12, stats
        finally:
            st.close()

    def worker_killed():
        st = Stack(bins, model, 2, ["--max-loras", "8"] + mods)
        try:
            fe = Frontend(st.dir)
            fe.request("long", {"prompt_ids": [1, 2, 3], "max_tokens": 400, "lora": "a3"})
            time.sleep(0.5)
            t0 = time.time()
            st.workers[1].kill()
            got = fe.collect(["long"], 10)["long"]
            fe.close()
            assert got["finish_reason"] == "error" and got["error"], got
            assert time.time() - t0 < 5, time.time() - t0
            h = st.control("health")
            assert not h["ok"] and not h["data"]["healthy"], h
        finally:
            st.close()

    def idle_load_published():
        st = Stack(bins, model, 1, ["--max-loras", "2"])
        try:
            sub = subscribe(st.dir, b"notifications")
            t0 = time.time()
            r = st.control("load", "late", adapters[4])
            assert r["ok"], r
            found = False
            while not found and sub.poll(1000):
                m = msgpack.unpackb(sub.recv_multipart()[2], raw=False)
                for it in m["items"]:
                    found |= "late" in it["state"]["cpu"]
            sub.close()
            assert found and time.time() - t0 < 1.0, (found, time.time() - t0)
        finally:
            st.close()

    def startup_published_first():
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"notifications")
        sub.setsockopt(zmq.LINGER, 0)
        # Connected before the engine binds: ZeroMQ completes the connection when it does.
        st = Stack(bins, model, 1, ["--max-loras", "2"] + mods[:4],
                   before_start=lambda d: sub.connect(endpoint(d, "publish")))
        try:
            held = set()
            while sub.poll(2000):
                m = msgpack.unpackb(sub.recv_multipart()[2], raw=False)
                for it in m["items"]:
                    held |= set(it["state"]["cpu"])
                if {"a0", "a1"} <= held:
                    break
            assert {"a0", "a1"} <= held, held
        finally:
            sub.close()
            st.close()

    def disagreement_reported():
        st = Stack(bins, model, 2, ["--max-loras", "2"],
                   worker_env={1: {"LORA_WORKER_TEST_IGNORE_ADD": "odd"}})
        try:
            r = st.control("load", "odd", adapters[2])
            assert r["ok"], r
            d = st.residency()
            assert "odd" in d["ranks"][0]["cpu"] and "odd" not in d["ranks"][1]["cpu"], d
            assert d["disagreement"] == 1, d
            r = st.control("load", "even", adapters[3])
            assert st.residency()["disagreement"] == 1
        finally:
            st.close()

    def cpu_eviction_reloads():
        st = Stack(bins, model, 1, ["--max-loras", "1", "--max-cpu-loras", "2"] + mods[:4])
        try:
            r = st.control("load", "a2", adapters[2])
            assert r["ok"], r
            d = st.residency()
            assert "a0" not in d["ranks"][0]["cpu"], d
            fe = Frontend(st.dir)
            fe.request("again", batch[0], 3)
            got = fe.collect(["again"], 60)["again"]
            fe.close()
            assert got["error"] is None and got["tokens"] == expected[0]["tokens"], got
            assert "a0" in st.residency()["ranks"][0]["cpu"]
        finally:
            st.close()

    def lifecycle_events():
        st = Stack(bins, model, 1, ["--max-loras", "2"] + mods[:2])
        try:
            sub = subscribe(st.dir, b"event")
            fe = Frontend(st.dir)
            fe.request("done", {"prompt_ids": [4, 5, 6], "max_tokens": 3, "lora": "a0"})
            fe.collect(["done"], 30)
            fe.request("stopped", {"prompt_ids": [4, 5, 6], "max_tokens": 3000, "lora": None})
            fe.abort("stopped")
            got = fe.collect(["stopped"], 30)["stopped"]
            assert got["finish_reason"] == "abort", got
            fe.close()
            events = {}
            while sub.poll(500):
                m = msgpack.unpackb(sub.recv_multipart()[2], raw=False)
                events.setdefault(m["request_id"], []).append(m)
            sub.close()
            done = events["done"]
            assert [e["event"] for e in done] == ["QUEUED", "SCHEDULED", "FINISHED"], done
            assert done[-1]["finish_reason"] == "length" and done[-1]["lora"] == "a0", done
            assert done[0]["time"] <= done[1]["time"] <= done[2]["time"], done
            assert done[-1]["num_generation_tokens"] == 3, done
            stopped = events["stopped"]
            assert stopped[-1]["event"] == "FINISHED", stopped
            assert stopped[-1]["finish_reason"] == "abort", stopped
            stats = st.control("stats")["data"]
            assert stats["running"] == 0 and stats["free_blocks"] == stats["num_kv_blocks"], stats
        finally:
            st.close()

    check("tokens and log-probabilities equal lora-worker generate, 8 adapters mixed",
          lambda: same_as_generate(1))
    check("tensor parallelism: TP=2 gives the tokens of lora-worker generate",
          lambda: same_as_generate(2))
    check("max-loras 2, max-cpu-loras 3: 1, 2, 3 loaded leave 2 and 3 in slots and 1 in the "
          "cache; a pinned 1 takes a slot and keeps it; both ranks agree", residency_levels)
    check("unload really unloads: no rank holds it, and new requests get not found",
          unload_unloads)
    check("no step runs more than max_loras adapters, and a non-resident adapter behind a queue "
          "finishes", max_loras_per_step)
    check("a KV cache too small preempts; requests still finish with the right tokens and no "
          "block leaks", preemption)
    check("a worker killed mid-generation fails the request within 5 s and the engine reports "
          "unhealthy", worker_killed)
    check("a load on an idle engine is published at once", idle_load_published)
    check("the start-up adapters' load event is published before any request",
          startup_published_first)
    check("a rank that disagrees is reported, not hidden", disagreement_reported)
    check("an adapter dropped from the CPU cache stays registered and is reloaded for a request",
          cpu_eviction_reloads)
    check("lifecycle events QUEUED, SCHEDULED, FINISHED with reasons; an abort frees its blocks",
          lifecycle_events)
    return done()


if __name__ == "__main__":
    sys.exit(main())
