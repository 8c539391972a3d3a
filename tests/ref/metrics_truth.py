#!/usr/bin/python3
"""Checks lora-metrics against the truth on a real stack: workers, lora-engine, lora-frontend
and two exporters (the default --lora-info=resident and --lora-info=inflight), all started
here in a work directory and stopped whatever happens.

The truth is what `lora-inspect residency --json` reports for every rank (an adapter is at a
level when every rank holds it there) and the request states this script knows itself: a
held-open stream that has received a chunk is running, one that has received nothing is queued.
After each step every residency and request series of both scrapes must equal it.

    metrics_truth.py workload --bin DIR --work DIR [--tp N] [--record FILE]
        Loads, held-open streams for several adapters, a queued-only adapter, a pin, evictions
        from the slots and the CPU cache, the streams closed, an unload. --record writes the
        residency series after each step, to compare two runs (TP=1 and TP=2).
    metrics_truth.py idle --bin DIR --work DIR
        The first scrape after the exporter's ready line shows the --lora-modules adapters,
        before any request; a load on an idle engine is visible within 500 ms.
    metrics_truth.py disagree --bin DIR --work DIR
        TP=2 where rank 1 ignores adding one adapter: lora_residency_disagreement is 1.
    metrics_truth.py lifecycle --bin DIR --work DIR
        A restarted engine resets its counters; a stopped (SIGSTOP) engine is lost: its gauges
        go and /health is not 200, and come back with SIGCONT; two engines side by side.

Exit 0 when every check holds; otherwise the failing step with both sides on stderr, exit 1.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client  # noqa: E402
from procs import Failure, Procs  # noqa: E402

LEVELS = {"registered": 0, "none": 0, "cpu": 1, "gpu": 2}
LEVEL_NAMES = {1: "cpu", 2: "gpu"}
STEP_DELAY_MS = "30"  # keeps the streams running while the script looks
SETTLE_S = 10  # how long a step may take to show on both sides


# ---- processes ------------------------------------------------------------------------------


class Engine:
    """An engine with its workers and one frontend, in run directory work/NAME."""

    def __init__(self, procs, bin_dir, model, name, tp=1, index=0, modules=(), rank_env=None,
                 args=()):
        self.procs, self.bin, self.model, self.tp = procs, bin_dir, model, tp
        self.run = os.path.join(procs.work, name)
        os.makedirs(self.run, mode=0o700, exist_ok=True)
        self.name, self.index, self.modules = name, index, list(modules)
        self.rank_env = rank_env or {}
        self.args = list(args)
        self.publish = "ipc://" + os.path.join(self.run, "publish.sock")
        self.fe_publish = "ipc://" + os.path.join(self.run, "frontend-stats.sock")
        self.frontend = None

    def start(self):
        argv = [os.path.join(self.bin, "lora-engine"), "--model", self.model, "--run-dir",
                self.run, "--tensor-parallel-size", str(self.tp), "--engine-index",
                str(self.index)] + self.args
        for n, path in self.modules:
            argv += ["--lora-modules", "%s=%s" % (n, path)]
        self.engine = self.procs.start(self.name + "-engine", argv)
        self.workers = []
        for r in range(self.tp):
            env = {"LORA_WORKER_TEST_STEP_DELAY_MS": STEP_DELAY_MS}
            env.update(self.rank_env.get(r, {}))
            self.workers.append(self.procs.start(
                "%s-worker%d" % (self.name, r),
                [os.path.join(self.bin, "lora-worker"), "serve", "--engine",
                 "ipc://" + os.path.join(self.run, "worker.sock"), "--rank", str(r)], env))
        self.procs.wait_line(self.engine, r"lora-engine: ready: engine %d, " % self.index)
        return self

    def start_frontend(self):
        self.frontend = self.procs.start(self.name + "-frontend", [
            os.path.join(self.bin, "lora-frontend"), "--run-dir", self.run, "--port", "0",
            "--publish-endpoint", self.fe_publish])
        m = self.procs.wait_line(self.frontend, r"lora-frontend: ready: http://[^:]+:(\d+)")
        self.port = int(m.group(1))
        return self

    def stop(self):
        for p in [self.frontend, self.engine] + self.workers:
            if p:
                self.procs.stop(p)

    def control(self, op, name=None, path=None):
        reply = client.control(self.run, op, name, path, timeout_s=30)
        if not reply.get("ok"):
            raise Failure("control %s %s: %s" % (op, name or "", reply))
        return reply

    def inspect(self):
        out = subprocess.run([os.path.join(self.bin, "lora-inspect"), "residency", "--run-dir",
                              self.run, "--json"], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise Failure("lora-inspect residency: %s" % out.stderr)
        return [json.loads(line) for line in out.stdout.splitlines()]


class Exporter:
    def __init__(self, procs, bin_dir, name, engines, mode="resident", timeout_ms=5000):
        argv = [os.path.join(bin_dir, "lora-metrics"), "--listen", "127.0.0.1:0",
                "--lora-info", mode, "--engine-timeout-ms", str(timeout_ms)]
        for e in engines:
            argv += ["--engine", e.publish]
            if e.frontend:
                argv += ["--frontend", e.fe_publish]
        self.mode = mode
        self.procs = procs
        self.p = procs.start(name, argv)
        m = procs.wait_line(self.p, r"lora-metrics: ready: http://[^:]+:(\d+)")
        self.port = int(m.group(1))

    def get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path),
                                        timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def scrape(self):
        status, text = self.get("/metrics")
        if status != 200:
            raise Failure("/metrics answered %d" % status)
        return parse_scrape(text)


# ---- the exposition -------------------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def parse_scrape(text):
    """[(name, {label: value}, number)] of every sample."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise Failure("unparsable line: %r" % line)
        labels = dict(LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


# The families compared, with the labels that identify a series in them.
TRUTH_FAMILIES = ("vllm:lora_adapter_loaded", "vllm:num_gpu_loaded_lora_adapters",
                  "vllm:num_cpu_loaded_lora_adapters", "vllm:max_gpu_lora_adapters",
                  "lora_residency_disagreement", "lora_adapter_requests",
                  "vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:lora_requests_info")
RESIDENCY_FAMILIES = TRUTH_FAMILIES[:5]
SKIP_LABELS = ("model_name",)


def observed(samples, engine, families=TRUTH_FAMILIES):
    """The scrape's series of one engine in the compared families, as a set of lines; the
    value of vllm:lora_requests_info (the time) is left out."""
    got = set()
    for name, labels, v in samples:
        if name not in families or labels.get("engine") != str(engine):
            continue
        lab = ",".join("%s=%s" % kv for kv in sorted(labels.items())
                       if kv[0] not in SKIP_LABELS)
        got.add("%s{%s}%s" % (name, lab, "" if name == "vllm:lora_requests_info" else
                              " %g" % v))
    return got


def value_of(samples, name, **labels):
    vals = [v for n, lab, v in samples if n == name and all(lab.get(k) == x
                                                            for k, x in labels.items())]
    return vals[0] if len(vals) == 1 else None


# ---- the truth ------------------------------------------------------------------------------


def residency(records):
    """{adapter: (engine-wide level 0/1/2, pinned by every rank, ranks disagree)}, and the
    world size, from lora-inspect's records."""
    world = next(r["world_size"] for r in records if r["kind"] == "engine")
    per = {}
    for r in records:
        if r["kind"] == "adapter":
            per.setdefault(r["adapter"], {})[r["rank"]] = (LEVELS[r["level"]], r["pinned"])
    out = {}
    for a, ranks in per.items():
        levels = [ranks.get(k, (0, False))[0] for k in range(world)]
        pinned = all(ranks.get(k, (0, False))[1] for k in range(world))
        out[a] = (min(levels), pinned, len(set(levels)) > 1)
    return out, world


def expected(res, requests, mode, engine, max_loras):
    """The series both scrapes must show: res from residency(), requests {adapter: (running,
    waiting)} as this script knows them."""
    want = set()
    lab = "engine=%d" % engine

    def add(name, labels, v=None):
        body = ",".join(sorted([lab] + labels))
        want.add("%s{%s}%s" % (name, body, "" if v is None else " %g" % v))

    for a, (level, pinned, _) in res.items():
        if level:
            add("vllm:lora_adapter_loaded", ["adapter_name=" + a, "level=" + LEVEL_NAMES[level],
                                             "pinned=" + ("true" if pinned else "false")], 1)
    add("vllm:num_gpu_loaded_lora_adapters", [], sum(r[0] == 2 for r in res.values()))
    add("vllm:num_cpu_loaded_lora_adapters", [], sum(r[0] >= 1 for r in res.values()))
    add("vllm:max_gpu_lora_adapters", [], max_loras)
    add("lora_residency_disagreement", [], sum(r[2] for r in res.values()))
    for a in set(res) | set(requests):
        run, wait = requests.get(a, (0, 0))
        if res.get(a, (0,))[0] or run or wait:
            add("lora_adapter_requests", ["adapter_name=" + a, "state=running"], run)
            add("lora_adapter_requests", ["adapter_name=" + a, "state=waiting"], wait)
    add("vllm:num_requests_running", [], sum(r for r, _ in requests.values()))
    add("vllm:num_requests_waiting", [], sum(w for _, w in requests.values()))
    if mode == "inflight":
        running = sorted(a for a, (r, _) in requests.items() if r)
        waiting = sorted(a for a, (_, w) in requests.items() if w)
    else:
        running = sorted(a for a, (level, _, _) in res.items() if level == 2)
        waiting = sorted(a for a, (_, w) in requests.items() if w and a not in running)
    add("vllm:lora_requests_info", ["max_lora=%d" % max_loras,
                                    "running_lora_adapters=" + ",".join(running),
                                    "waiting_lora_adapters=" + ",".join(waiting)])
    return want


def inspect_requests(records):
    """{adapter: (running, waiting)} as the engine reports them (rank 0's records)."""
    return {r["adapter"]: (r["running"], r["waiting"]) for r in records
            if r["kind"] == "adapter" and r["rank"] == 0 and (r["running"] or r["waiting"])}


def settle(step, engine, exporters, requests, max_loras, streams=()):
    """Waits until the engine's own report agrees with the request states known here and every
    exporter's series equal the truth; returns the last residency. Raises with the difference."""
    deadline = time.time() + SETTLE_S
    known = {a: rw for a, rw in requests.items() if rw != (0, 0)}
    while True:
        problems = []
        for s in streams:
            if s.error:
                problems.append("stream %s: %s" % (s.model, s.error))
        records = engine.inspect()
        res, _ = residency(records)
        if inspect_requests(records) != known:
            problems.append("lora-inspect requests %s, expected %s" %
                            (inspect_requests(records), known))
        for x in exporters:
            got = observed(x.scrape(), engine.index)
            want = expected(res, known, x.mode, engine.index, max_loras)
            if got != want:
                problems.append("%s: missing %s; unexpected %s" % (
                    x.mode, sorted(want - got), sorted(got - want)))
        if not problems:
            return res
        if time.time() > deadline:
            raise Failure("step '%s' did not settle within %d s:\n  %s\nresidency: %s" % (
                step, SETTLE_S, "\n  ".join(problems), res))
        time.sleep(0.05)


# ---- held-open streams ----------------------------------------------------------------------


class Stream:
    """A streaming completion held open until close(); started is set on its first chunk."""

    def __init__(self, port, model):
        self.model = model
        self.started = threading.Event()
        self.error = None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 3000,
                           "ignore_eos": True, "stream": True}).encode()
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" %
                          (len(body), body))
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        buf = b""
        try:
            while not self.started.is_set():
                chunk = self.sock.recv(4096)
                if not chunk:
                    self.error = "closed before a chunk: %r" % buf[:300]
                    return
                buf += chunk
                if b"HTTP/1.1 200" not in buf[:20] and b"\r\n" in buf:
                    self.error = "answered %r" % buf[:300]
                    return
                if b'"choices"' in buf:
                    self.started.set()
            while self.sock.recv(65536):
                pass
        except OSError:
            pass

    def wait_started(self, timeout_s=20):
        if not self.started.wait(timeout_s):
            raise Failure("the stream for %s got no chunk: %s" % (self.model, self.error))

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# ---- scenarios ------------------------------------------------------------------------------


def make_files(bin_dir, work, names):
    w = os.path.join(bin_dir, "lora-worker")
    model = os.path.join(work, "model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([w, "make-model", "--out", model], check=True, capture_output=True)
    paths = {}
    for i, n in enumerate(names):
        paths[n] = os.path.join(work, "adapter-" + n)
        if not os.path.exists(os.path.join(paths[n], "adapter_config.json")):
            subprocess.run([w, "make-adapter", "--model", model, "--out", paths[n], "--rank", "4",
                            "--seed", str(11 + i)], check=True, capture_output=True)
    return model, paths


def workload(a):
    """max_loras 2, a CPU cache of 3; a and b loaded before ready."""
    procs = Procs(a.work)
    model, ad = make_files(a.bin, a.work, "abcd")
    record = []
    streams = {}
    try:
        e = Engine(procs, a.bin, model, "w", tp=a.tp, modules=[("a", ad["a"]), ("b", ad["b"])],
                   args=["--max-loras", "2", "--max-cpu-loras", "3", "--publish-interval-ms",
                         "200"]).start().start_frontend()
        xs = [Exporter(procs, a.bin, "metrics-resident", [e]),
              Exporter(procs, a.bin, "metrics-inflight", [e], mode="inflight")]
        req = {}
        before = {}

        def step(name):
            res = settle(name, e, xs, req, 2, [s for ss in streams.values() for s in ss])
            samples = xs[0].scrape()
            record.append("== %s" % name)
            record.extend(sorted(observed(samples, 0, RESIDENCY_FAMILIES)))
            check_counters(name, samples, before, res, closed[0])
            print("ok: %s: %s" % (name, {k: v[0] for k, v in sorted(res.items())}))
            return res

        def open_streams(adapter, n, run):
            for _ in range(n):
                s = Stream(e.port, adapter)
                streams.setdefault(adapter, []).append(s)
                if run:
                    s.wait_started()
            r, w = req.get(adapter, (0, 0))
            req[adapter] = (r + n, w) if run else (r, w + n)

        closed = [0]

        def close_streams(adapter):
            for s in streams.pop(adapter):
                s.close()
                closed[0] += 1
            req.pop(adapter, None)

        res = step("before traffic: a and b loaded at start-up")
        if res.get("a", (0,))[0] != 2 or res.get("b", (0,))[0] != 2:
            raise Failure("a and b should sit in the slots before traffic: %s" % res)
        before.update(counters(xs[0].scrape()), res=res, transitions={"cpu": [0, 0],
                                                                      "gpu": [0, 0]})
        e.control("load", "c", ad["c"])
        step("load c")
        open_streams("a", 2, True)
        open_streams("b", 1, True)
        step("two streams for a, one for b")
        open_streams("c", 1, False)
        time.sleep(0.5)  # give c the chance to be wrongly scheduled; it must stay queued
        step("a stream for c, queued behind the full slots")
        if streams["c"][0].started.is_set():
            raise Failure("the stream for c ran although every slot is in use")
        e.control("pin", "a")
        step("pin a")
        close_streams("b")
        streams["c"][0].wait_started()
        req["c"] = (1, 0)
        res = step("b's stream closed: c takes b's slot")
        if res["b"][0] == 2 or res["c"][0] != 2:
            raise Failure("c should have replaced b in the slots: %s" % res)
        e.control("load", "d", ad["d"])
        res = step("load d into a full CPU cache")
        close_streams("a")
        close_streams("c")
        step("every stream closed: idle")
        e.control("unload", "c")
        step("unload c")
        for x in xs:
            text = x.get("/metrics")[1]
            if 'adapter_name="c"' in text or re.search(r'_adapters="([^"]*,)?c(,|")', text):
                raise Failure("%s: a series still names c after its unload" % x.mode)
        print("ok: no series names c after its unload, in either mode")
        if a.record:
            with open(a.record, "w") as f:
                f.write("\n".join(record) + "\n")
        return 0
    finally:
        for ss in streams.values():
            for s in ss:
                s.close()
        procs.stop_all()


COUNTERS = (("lora_adapter_loads_total", "cpu"), ("lora_adapter_loads_total", "gpu"),
            ("lora_adapter_evictions_total", "cpu"), ("lora_adapter_evictions_total", "gpu"))


def counters(samples):
    c = {(n, lv): value_of(samples, n, engine="0", level=lv) for n, lv in COUNTERS}
    c["abort"] = value_of(samples, "vllm:request_success_total", engine="0",
                          finished_reason="abort")
    return c


def check_counters(step, samples, before, res, n_closed):
    """Loads and evictions since the first step equal the level changes seen between steps
    (an unload is no eviction); aborts equal the streams closed."""
    if not before:
        return
    t = before["transitions"]
    prev = before["res"]
    for a in set(prev) | set(res):
        old = prev.get(a, (0,))[0]
        new = res.get(a, (0,))[0]
        for i, lv in ((0, "cpu"), (1, "gpu")):
            if old < i + 1 <= new:
                t[lv][0] += 1
            if new < i + 1 <= old and a in res:
                t[lv][1] += 1
    before["res"] = res
    now = counters(samples)
    for (n, lv) in COUNTERS:
        want = before[(n, lv)] + t[lv][0 if n.startswith("lora_adapter_loads") else 1]
        if now[(n, lv)] != want:
            raise Failure("step '%s': %s{level=%s} is %s, the level changes make it %s" % (
                step, n, lv, now[(n, lv)], want))
    if now["abort"] != before["abort"] + n_closed:
        raise Failure("step '%s': %s aborted requests counted, %d streams closed" % (
            step, now["abort"], n_closed))


def idle(a):
    """Default publish interval (1 s): what shows fast shows through the notification path."""
    procs = Procs(a.work)
    model, ad = make_files(a.bin, a.work, "abc")
    try:
        e = Engine(procs, a.bin, model, "i", modules=[("a", ad["a"]), ("b", ad["b"])],
                   args=["--max-loras", "2", "--max-cpu-loras", "4"]).start()
        x = Exporter(procs, a.bin, "metrics", [e])
        samples = x.scrape()  # the first scrape after ready: no retry
        res, _ = residency(e.inspect())
        got = observed(samples, 0)
        want = expected(res, {}, "resident", 0, 2)
        if got != want or res["a"][0] != 2 or res["b"][0] != 2:
            raise Failure("the first scrape after ready: missing %s; unexpected %s" % (
                sorted(want - got), sorted(got - want)))
        print("ok: the first scrape after ready shows a and b in the slots")
        delays = []
        for _ in range(5):
            e.control("load", "c", ad["c"])
            t0 = time.monotonic()
            while value_of(x.scrape(), "vllm:lora_adapter_loaded", adapter_name="c") is None:
                if time.monotonic() - t0 > 2:
                    raise Failure("a load on the idle engine was not visible within 2 s")
                time.sleep(0.002)
            delays.append(time.monotonic() - t0)
            e.control("unload", "c")
            t0 = time.monotonic()
            while value_of(x.scrape(), "vllm:lora_adapter_loaded", adapter_name="c") is not None:
                if time.monotonic() - t0 > 2:
                    raise Failure("an unload on the idle engine was not visible within 2 s")
                time.sleep(0.002)
        print("ok: loads on the idle engine visible after %s ms" %
              ", ".join("%.0f" % (d * 1000) for d in delays))
        if max(delays) >= 0.5:
            raise Failure("a load took %.0f ms to show, over 500 ms" % (max(delays) * 1000))
        return 0
    finally:
        procs.stop_all()


def disagree(a):
    procs = Procs(a.work)
    model, ad = make_files(a.bin, a.work, "ac")
    try:
        e = Engine(procs, a.bin, model, "d", tp=2, modules=[("a", ad["a"])],
                   rank_env={1: {"LORA_WORKER_TEST_IGNORE_ADD": "c"}},
                   args=["--max-loras", "2", "--max-cpu-loras", "3",
                         "--publish-interval-ms", "200"]).start()
        xs = [Exporter(procs, a.bin, "metrics", [e])]
        res = settle("healthy", e, xs, {}, 2)
        print("ok: healthy ranks: disagreement 0, %s" % res)
        e.control("load", "c", ad["c"])
        res = settle("rank 1 ignores c", e, xs, {}, 2)
        if value_of(xs[0].scrape(), "lora_residency_disagreement", engine="0") != 1:
            raise Failure("lora_residency_disagreement is not 1: %s" % res)
        print("ok: rank 1 without c: lora_residency_disagreement 1, c not shown as loaded")
        e.control("unload", "c")
        settle("c unloaded", e, xs, {}, 2)
        print("ok: c unloaded: disagreement 0 again")
        return 0
    finally:
        procs.stop_all()


def lifecycle(a):
    procs = Procs(a.work)
    model, ad = make_files(a.bin, a.work, "ab")
    args = ["--max-loras", "2", "--max-cpu-loras", "3", "--publish-interval-ms", "200"]
    try:
        e0 = Engine(procs, a.bin, model, "e0", index=0, modules=[("a", ad["a"])],
                    args=args).start().start_frontend()
        e1 = Engine(procs, a.bin, model, "e1", index=1, modules=[("b", ad["b"])],
                    args=args).start()
        x = Exporter(procs, a.bin, "metrics", [e0, e1], timeout_ms=1000)
        for e in (e0, e1):
            settle("engine %d beside the other" % e.index, e, [x], {}, 2)
        print("ok: two engines side by side, each equal to its own residency")

        s = Stream(e0.port, "a")
        s.wait_started()
        s.close()
        deadline = time.time() + SETTLE_S
        while (value_of(x.scrape(), "vllm:prompt_tokens_total", engine="0") or 0) == 0:
            if time.time() > deadline:
                raise Failure("engine 0's prompt tokens never counted")
            time.sleep(0.05)
        print("ok: engine 0 counted its request")

        e0.stop()
        # A fresh engine, not a restart of the same one: without its registry file, which
        # would bring a back, only the new --lora-modules are loaded.
        os.unlink(os.path.join(e0.run, "adapters.json"))
        e0.modules = [("b", ad["b"])]
        e0.start().start_frontend()
        res = settle("engine 0 restarted with b only", e0, [x], {}, 2)
        if "a" in res:
            raise Failure("a survived the restart: %s" % res)
        samples = x.scrape()
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
            if value_of(samples, name, engine="0") != 0:
                raise Failure("%s of the restarted engine is %s, not 0" % (
                    name, value_of(samples, name, engine="0")))
        if value_of(samples, "vllm:lora_adapter_loaded", engine="1", adapter_name="b") != 1:
            raise Failure("engine 1 lost its series when engine 0 restarted")
        print("ok: the restarted engine's counters start from 0; engine 1 untouched")

        os.kill(e1.engine.pid, signal.SIGSTOP)
        try:
            deadline = time.time() + SETTLE_S
            while True:
                status, body = x.get("/health")
                samples = x.scrape()
                gone = value_of(samples, "vllm:num_requests_running", engine="1") is None
                if status != 200 and gone:
                    break
                if time.time() > deadline:
                    raise Failure("a stopped engine is still shown: /health %d %s" % (status,
                                                                                   body))
                time.sleep(0.05)
            if value_of(samples, "vllm:num_requests_running", engine="0") is None:
                raise Failure("engine 0's gauges went with engine 1")
            if value_of(samples, "vllm:prompt_tokens_total", engine="1") is None:
                raise Failure("the lost engine's counters went too")
            print("ok: the stopped engine is lost: its gauges go, its counters stay, /health "
                  "%d: %s" % (status, body.strip().replace("\n", "; ")))
        finally:
            os.kill(e1.engine.pid, signal.SIGCONT)
        deadline = time.time() + SETTLE_S
        while x.get("/health")[0] != 200:
            if time.time() > deadline:
                raise Failure("/health did not come back after SIGCONT")
            time.sleep(0.05)
        settle("engine 1 continued", e1, [x], {}, 2)
        print("ok: after SIGCONT engine 1's gauges are back and /health is 200")
        return 0
    finally:
        procs.stop_all()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["workload", "idle", "disagree", "lifecycle"])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--record")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    try:
        return globals()[a.scenario](a)
    except Failure as f:
        print("FAIL: %s" % f, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
