#!/usr/bin/python3
"""What a scrape of lora-metrics costs, and how soon an adapter load shows on /metrics.

    metrics_scrape.py --bin DIR [--scrapes 500] [--loads 200] [--step-delay-ms 10,0]

1. Scrape time and size. lora-metrics --stdin is fed a synthetic stream (built field by field as
   tests/ref/metrics_stream.py builds its messages) of one engine of two ranks: a large state
   (1000 registered adapters, 64 in slots on both ranks, 192 more in the CPU caches, requests
   running or waiting for 40 adapters, finished requests of 500) and a small one as the
   reference (16 registered, 4 in slots, 4 more cached, requests for 4, finished ones of 8).
   Each is scraped --scrapes times over one kept-alive loopback connection and as many times
   over a fresh connection per scrape; times are client-side, from sending the request to the
   last byte of the body, with a minimal socket client so that Python's HTTP parsing stays out
   of them. The exporter's own CPU time per scrape (from /proc) is printed beside them.
2. Load visibility. A real engine (one rank, --publish-interval-ms 200) and lora-metrics
   subscribed to it; --loads times, an adapter is loaded through the control socket
   (tests/ref/client.py), /metrics is polled in a tight loop over a kept-alive connection until
   vllm:lora_adapter_loaded has its series, then it is unloaded and polled until the series is
   gone. The delay is from the load's acknowledgement (and from just before the command was
   sent) to the end of the first scrape that shows it. A plain subscriber to the engine's
   notifications beside it tells the engine's and the transport's part from the exporter's.
   With the engine idle, then busy: a child process (not a thread, which would share the
   poller's interpreter lock) keeps 8 requests running, and every worker step is held longer
   by LORA_WORKER_TEST_STEP_DELAY_MS, once for each --step-delay-ms (default 10, about a real
   model's step, and 0, unthrottled: the most stats and events a second).

3. The frontend's own /metrics beside lora-metrics', on the same state: a publisher in this
   script plays an engine of two ranks with the large state of 1 (1000 registered adapters),
   and both lora-metrics and a lora-frontend (whose requests go to a real engine of one rank,
   --engine-publish-endpoint pointing at the publisher) subscribe to it. Scrapes alternate
   between the two over kept-alive connections, --scrapes each: p50 and p99 side by side and
   their ratio (the aim: the frontend's p99 within 2x). Then the request path: --requests
   completions (8 tokens, ignore_eos, one at a time over a kept-alive connection) with no
   scraper, with a child process scraping the frontend's /metrics in a tight loop, and with the
   same child on lora-metrics' instead (the same CPU taken from the machine, nothing asked of
   the frontend), in three interleaved rounds; completion latency p50 and p99 of each, the
   scrapes the child made, and what the frontend says at its end of the engine messages that
   waited for a render.

No thresholds: the aims (a scrape under 2 ms, visibility p99 under 10 ms when busy) are printed
for reference only. Exits non-zero when something does not work (a program does not start, a
scrape fails, a load never shows).
"""

import argparse
import io
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
from client import Frontend, control  # noqa: E402
from procs import Failure, Procs  # noqa: E402
from test_engine import subscribe  # noqa: E402

T0 = 1767225600.0


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ms(xs):
    return "p50 %.3f ms, p99 %.3f ms, max %.3f ms" % (
        quantile(xs, 0.5) * 1e3, quantile(xs, 0.99) * 1e3, max(xs) * 1e3)


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine():
    model, cores, mem = "?", 0, "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            cores += 1
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = "%.1f GiB" % (int(line.split()[1]) / 2**20)
    return "%s, %d cores (%d usable), %s" % (model, cores, len(os.sched_getaffinity(0)), mem)


# ---- processes ---------------------------------------------------------------------------------

def start_metrics(procs, bin_dir, args, stdin=None):
    p = procs.start("metrics-%d" % len(procs.procs), [os.path.join(bin_dir, "lora-metrics"),
                                                      "--listen", "127.0.0.1:0"] + args,
                    stdin=stdin)
    port = int(procs.wait_line(p, r"lora-metrics: ready: http://127\.0\.0\.1:(\d+)").group(1))
    return p, port


# ---- HTTP ---------------------------------------------------------------------------------------

class Conn:
    """One HTTP/1.1 connection; get() sends a GET and reads the whole response
    (Content-Length framed, as lora-metrics answers)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.closed = False

    def get(self, path):
        """path None: only read the response of a request already sent."""
        if path is not None:
            self.s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        buf = self.buf
        while b"\r\n\r\n" not in buf:
            chunk = self.s.recv(262144)
            if not chunk:
                raise Failure("the connection closed inside a response")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        hdr = {k.strip().lower(): v.strip() for k, v in
               (line.split(":", 1) for line in lines[1:] if ":" in line)}
        length = int(hdr.get("content-length", "-1"))
        if length < 0:
            raise Failure("a response without Content-Length")
        parts, have = [rest], len(rest)
        while have < length:
            chunk = self.s.recv(max(262144, length - have))
            if not chunk:
                raise Failure("the connection closed inside a body")
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.buf = data[length:]
        self.closed = hdr.get("connection", "").lower() == "close"
        return status, data[:length]

    def post(self, path, body):
        self.s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                       % len(body) + body)
        return self.get(None)

    def close(self):
        self.s.close()


def scrape_once(port):
    c = Conn(port)
    try:
        return c.get("/metrics")
    finally:
        c.close()


# ---- 1. scrape time and size -------------------------------------------------------------------

def synthetic_stream(n_registered, n_slots, n_cpu, n_busy, n_accounted, world=2):
    """Message bodies of one engine: registry of n_registered, n_slots in slots and n_cpu in the
    CPU cache (slots included) on every rank, the first 4 of the slots pinned; stats with
    requests for n_busy adapters (three quarters of them resident, running; the rest waiting);
    a finished request of each of the first n_accounted adapters."""
    names = ["tenant-%04d/adapter" % i for i in range(n_registered)]
    limits = {"max_loras": n_slots, "max_cpu_loras": n_cpu, "max_lora_rank": 16,
              "block_size": 16, "num_kv_blocks": 4096, "world_size": world,
              "max_model_len": 4096, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
              "vocab_size": 151936}
    state = {"slots": names[:n_slots], "cpu": names[:n_cpu], "pinned": names[:min(4, n_slots)]}
    out = [{"type": "ready", "version": 1, "engine_index": 0, "model": "bench-model",
            "limits": limits},
           {"type": "registry", "engine": 0, "adapters": [
               {"name": n, "path": "/adapters/" + n, "id": i + 1} for i, n in enumerate(names)]}]
    for rank in range(world):
        out.append({"type": "residency_reply", "engine": 0, "rank": rank, "state": state})
        out.append({"type": "notifications", "engine": 0, "rank": rank, "dropped": 0, "items": [
            {"kind": "lora_load", "seq": 1, "time": T0, "state": state, "timings": [
                {"name": names[0], "transition": "load", "seconds": 0.02},
                {"name": names[0], "transition": "activate", "seconds": 0.003}]}]})
    for i in range(n_accounted):
        rid = "req-%d" % i
        out.append({"type": "event", "engine": 0, "request_id": rid, "event": "FINISHED",
                    "time": T0 + i, "lora": names[i], "finish_reason": "stop",
                    "num_prompt_tokens": 100 + i, "num_generation_tokens": 20 + i})
        out.append({"type": "request_stats", "engine": 0, "request_id": rid, "lora": names[i],
                    "finish_reason": "stop", "arrival_time": T0 + i,
                    "finished_time": T0 + i + 0.8, "first_token_time": T0 + i + 0.1,
                    "queued_time": T0 + i + 0.001, "scheduled_time": T0 + i + 0.01,
                    "engine_first_token_time": T0 + i + 0.09,
                    "engine_finished_time": T0 + i + 0.79, "num_prompt_tokens": 100 + i,
                    "num_generation_tokens": 20 + i, "max_tokens": 256})
    n_run = n_busy * 3 // 4
    counts = [{"name": names[i], "running": 1 + i % 3, "waiting": 0} for i in range(n_run)]
    counts += [{"name": names[n_cpu + i], "running": 0, "waiting": 1 + i % 2}
               for i in range(n_busy - n_run)]
    out.append({"type": "stats", "engine": 0, "time": T0 + 1000,
                "running": sum(c["running"] for c in counts),
                "waiting": sum(c["waiting"] for c in counts), "kv_usage": 0.5,
                "num_preemptions": 0, "step_adapters": 8, "step_tokens": 256,
                "step_seconds": 0.02, "model_seconds": 0.018, "adapters": counts})
    return b"".join(msgpack.packb(b, use_bin_type=True) for b in out)


def family_bytes(body):
    """Bytes per family (its HELP and TYPE lines with its samples), largest first."""
    sizes, fam = {}, None
    for line in body.split(b"\n"):
        if line.startswith(b"# HELP "):
            fam = line.split(b" ")[2].decode()
        if fam:
            sizes[fam] = sizes.get(fam, 0) + len(line) + 1
    return sorted(sizes.items(), key=lambda kv: -kv[1])


def scrape_case(procs, bin_dir, label, n_scrapes, shape):
    n_registered, n_slots, n_cpu, n_busy, n_accounted = shape
    p, port = start_metrics(procs, bin_dir, ["--stdin", "--engine-timeout-ms", "0"],
                            stdin=subprocess.PIPE)
    try:
        p.stdin.write(synthetic_stream(*shape))
        p.stdin.flush()
        # Ready is announced at once for --stdin: wait for the stream's state instead.
        gpu = "vllm:num_gpu_loaded_lora_adapters{model_name=\"bench-model\",engine=\"0\"} " \
              "%d.0\n" % n_slots
        want = [gpu.encode(), b'lora_adapter_prompt_tokens_total{model_name="bench-model",'
                b'engine="0",adapter_name="tenant-%04d/adapter"}' % (n_accounted - 1)]
        deadline = time.time() + 30
        while True:
            status, body = scrape_once(port)
            if status == 200 and all(w in body for w in want):
                break
            if time.time() > deadline:
                raise Failure("%s: the stream's state never showed:\n%s" %
                              (label, body.decode()[-3000:]))
            time.sleep(0.01)
        loaded = body.count(b"\nvllm:lora_adapter_loaded{")
        if loaded != n_cpu:
            raise Failure("%s: %d vllm:lora_adapter_loaded series, not %d" %
                          (label, loaded, n_cpu))
        res = {"bytes": len(body), "series": sum(1 for ln in body.split(b"\n")
                                                 if ln and not ln.startswith(b"#")),
               "families": family_bytes(body)}
        c = Conn(port)
        reconnects = 0
        for _ in range(20):  # warm-up: first-touch of the buffers, the thread, the caches
            c.get("/metrics")
        for mode in ("kept-alive", "fresh"):
            times = []
            cpu0 = cpu_seconds(p.pid)
            for _ in range(n_scrapes):
                t = time.perf_counter()
                if mode == "fresh":
                    status, b = scrape_once(port)
                else:
                    status, b = c.get("/metrics")
                times.append(time.perf_counter() - t)
                if status != 200 or len(b) < len(body) // 2:
                    raise Failure("%s: a scrape answered %d, %d bytes" % (label, status, len(b)))
                if mode != "fresh" and c.closed:
                    reconnects += 1
                    c.close()
                    c = Conn(port)
            res[mode] = times
            res[mode + " cpu"] = (cpu_seconds(p.pid) - cpu0) / n_scrapes
        c.close()
        res["reconnects"] = reconnects
        return res
    finally:
        procs.stop(p)


def bench_scrape(procs, bin_dir, n_scrapes):
    cases = [("small", (16, 4, 8, 4, 8)), ("large", (1000, 64, 256, 40, 500))]
    print("1. scrape of /metrics, lora-metrics --stdin, one engine of 2 ranks; client-side, "
          "%d scrapes each" % n_scrapes)
    results = {}
    for label, shape in cases:
        r = scrape_case(procs, bin_dir, label, n_scrapes, shape)
        results[label] = r
        print("  %s: %d registered, %d in slots, %d in the CPU caches (slots included), "
              "requests for %d, %d accounted" % ((label,) + shape))
        print("    response %d bytes, %d sample lines" % (r["bytes"], r["series"]))
        for mode in ("kept-alive", "fresh"):
            print("    %-10s connection: %s; exporter CPU %.3f ms per scrape" %
                  (mode, ms(r[mode]), r[mode + " cpu"] * 1e3))
        if r["reconnects"]:
            print("    (the server closed the kept-alive connection %d times)" % r["reconnects"])
    big, small = results["large"], results["small"]
    print("  large / small: %.1fx the bytes; kept-alive p50 %.1fx, fresh p50 %.1fx, "
          "exporter CPU %.1fx" % (
              big["bytes"] / small["bytes"],
              quantile(big["kept-alive"], 0.5) / quantile(small["kept-alive"], 0.5),
              quantile(big["fresh"], 0.5) / quantile(small["fresh"], 0.5),
              big["kept-alive cpu"] / max(small["kept-alive cpu"], 1e-9)))
    print("  large, bytes by family: " + ", ".join(
        "%s %d" % kv for kv in big["families"][:5]))
    print("  aim (for reference): a scrape under 2 ms")
    return results


# ---- 2. load visibility -------------------------------------------------------------------------

def busy_main(run_dir, streams, tokens):
    """The child that keeps the engine busy: streams requests always open, alternating between
    the base model and adapter a0, each replaced as soon as it finishes."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    fe = Frontend(run_dir)
    n = 0

    def submit():
        nonlocal n
        fe.request("busy-%d" % n, {"prompt_ids": [1 + n % 200, 2, 3, 4, 5, 6, 7, 8],
                                   "max_tokens": tokens, "lora": "a0" if n % 2 else None})
        n += 1

    for _ in range(streams):
        submit()
    while True:
        m = fe.recv(60)
        if m is None:
            return 1
        if m.get("type") == "output" and m.get("finished"):
            submit()


def loaded_series(body, name):
    """The vllm:lora_adapter_loaded line of adapter name, or None."""
    key = b'adapter_name="' + name.encode() + b'"'
    for line in body.split(b"\n"):
        if line.startswith(b"vllm:lora_adapter_loaded{") and key in line:
            return line
    return None


def running(body):
    m = re.search(rb"\nvllm:num_requests_running\{[^}]*\} (\S+)", body)
    return float(m.group(1)) if m else 0.0


class Watch:
    """The engine's notifications topic, read without blocking: when a notification naming an
    adapter in a rank's CPU cache or slots was first taken from the socket (one rank here)."""

    def __init__(self, run):
        self.sub = subscribe(run, b"notifications")
        self.seen = {}

    def drain(self):
        now = time.perf_counter()
        while self.sub.poll(0):
            m = msgpack.unpackb(self.sub.recv_multipart()[2], raw=False)
            if not m.get("items"):
                continue
            st = m["items"][-1]["state"]
            for name in set(st.get("cpu", [])) | set(st.get("slots", [])):
                self.seen.setdefault(name, now)

    def close(self):
        self.sub.close()


def poll_until(c, name, present, watch=None, timeout_s=10):
    """Scrapes until the adapter's series is present (or gone); (time at the end of that scrape,
    the scrape, scrapes taken)."""
    deadline = time.perf_counter() + timeout_s
    n = 0
    while True:
        status, body = c.get("/metrics")
        t = time.perf_counter()
        n += 1
        if watch:
            watch.drain()
        if status != 200:
            raise Failure("a scrape answered %d" % status)
        if (loaded_series(body, name) is not None) == present:
            return t, body, n
        if t > deadline:
            raise Failure("adapter '%s' still %s on /metrics after %d s" %
                          (name, "missing" if present else "there", timeout_s))


def visibility_round(run, port, adapter, tag, n_loads):
    c = Conn(port)
    watch = Watch(run)
    res = {"ack": [], "sent": [], "cmd": [], "unload": [], "scrapes": [], "busy": 0,
           "levels": {}, "early": 0, "sub": []}
    try:
        for i in range(n_loads):
            name = "%s-%d" % (tag, i)
            watch.drain()
            t_sent = time.perf_counter()
            reply = control(run, "load", name, adapter, timeout_s=30)
            t_ack = time.perf_counter()
            if not reply.get("ok"):
                raise Failure("load '%s': %s" % (name, reply))
            watch.drain()
            early = name in watch.seen
            res["early"] += early
            t_vis, body, n = poll_until(c, name, True, watch)
            if not early and name in watch.seen:
                res["sub"].append(watch.seen[name] - t_ack)
            res["ack"].append(t_vis - t_ack)
            res["sent"].append(t_vis - t_sent)
            res["cmd"].append(t_ack - t_sent)
            res["scrapes"].append(n)
            res["busy"] += running(body) > 0
            level = re.search(rb'level="(\w+)"', loaded_series(body, name)).group(1).decode()
            res["levels"][level] = res["levels"].get(level, 0) + 1
            reply = control(run, "unload", name, timeout_s=30)
            t_ack = time.perf_counter()
            if not reply.get("ok"):
                raise Failure("unload '%s': %s" % (name, reply))
            t_gone, _, _ = poll_until(c, name, False)
            res["unload"].append(t_gone - t_ack)
    finally:
        c.close()
        watch.close()
    return res


def print_round(label, r, n_loads):
    print("  %s, %d loads (levels at first sight: %s; engine running requests in %d of those "
          "scrapes):" % (label, n_loads, ", ".join("%s %d" % kv for kv in sorted(
              r["levels"].items())), r["busy"]))
    print("    load acknowledged -> visible: %s" % ms(r["ack"]))
    print("    load sent         -> visible: %s" % ms(r["sent"]))
    print("    load sent -> acknowledged:    %s" % ms(r["cmd"]))
    print("    unload acknowledged -> gone:  %s" % ms(r["unload"]))
    print("    the load's notification already at a plain subscriber when the ack came: "
          "%d of %d%s" % (r["early"], n_loads, "; the others, ack -> there (to a scrape's "
                          "resolution): " + ms(r["sub"]) if r["sub"] else ""))
    print("    scrapes until visible: median %d, max %d" % (
        statistics.median(r["scrapes"]), max(r["scrapes"])))


def start_stack(procs, bin_dir, d, step_delay_ms):
    """An engine of one rank with adapter a0, its worker (steps held step_delay_ms longer) and
    lora-metrics subscribed to it: (run dir, the exporter's process, its port)."""
    run = tempfile.mkdtemp(prefix="run-", dir=d)
    os.chmod(run, 0o700)
    eng = procs.start("engine-%d" % step_delay_ms, [
        os.path.join(bin_dir, "lora-engine"), "--model", d + "/m", "--run-dir", run,
        "--tensor-parallel-size", "1", "--max-loras", "4", "--max-cpu-loras", "8",
        "--publish-interval-ms", "200", "--lora-modules", "a0=" + d + "/a0"])
    env = {"LORA_WORKER_TEST_STEP_DELAY_MS": str(step_delay_ms),
           # spinning threads would take the cores
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive")}
    procs.start("worker-%d" % step_delay_ms, [
        os.path.join(bin_dir, "lora-worker"), "serve", "--engine", "ipc://%s/worker.sock" % run,
        "--rank", "0"], env=env)
    procs.wait_line(eng, r"lora-engine: ready:", 60)
    mp, port = start_metrics(procs, bin_dir, ["--engine", "ipc://%s/publish.sock" % run])
    return run, mp, port


def busy_round(procs, run, mp, port, adapter, step_delay_ms, n_loads):
    busy = procs.start("busy-%d" % step_delay_ms,
                       [sys.executable, os.path.abspath(__file__), "--busy", run])
    c = Conn(port)
    deadline = time.time() + 30
    while running(c.get("/metrics")[1]) == 0:
        if time.time() > deadline or busy.poll() is not None:
            raise Failure("the engine never got busy:\n" + procs.log(busy)[-2000:])
        time.sleep(0.01)
    c.close()
    cpu0 = cpu_seconds(mp.pid)
    t0 = time.time()
    r = visibility_round(run, port, adapter, "busy%d" % step_delay_ms, n_loads)
    share = (cpu_seconds(mp.pid) - cpu0) / (time.time() - t0)
    if busy.poll() is not None:
        raise Failure("the busy client ended:\n" + procs.log(busy)[-2000:])
    procs.stop(busy)
    print_round("busy, 8 streams, worker steps held %d ms longer" % step_delay_ms, r, n_loads)
    print("    lora-metrics CPU meanwhile: %.0f%% of a core" % (100 * share))
    if r["busy"] < n_loads // 2:
        raise Failure("the engine ran requests in only %d of %d busy scrapes" %
                      (r["busy"], n_loads))
    return r


def bench_visibility(procs, bin_dir, d, n_loads, step_delays_ms):
    w = os.path.join(bin_dir, "lora-worker")
    subprocess.run([w, "make-model", "--out", d + "/m"], check=True, capture_output=True)
    for a, seed in (("a0", 1), ("x", 2)):
        subprocess.run([w, "make-adapter", "--model", d + "/m", "--out", d + "/" + a,
                        "--rank", "4", "--seed", str(seed)], check=True, capture_output=True)
    print("2. load -> visible on /metrics, a real engine (1 rank, publish interval 200 ms); "
          "kept-alive connection, polled in a tight loop")
    results = {}
    for k, delay in enumerate(step_delays_ms):
        started = len(procs.procs)
        run, mp, port = start_stack(procs, bin_dir, d, delay)
        if k == 0:
            results["idle"] = visibility_round(run, port, d + "/x", "idle", n_loads)
            print_round("idle", results["idle"], n_loads)
        results[delay] = busy_round(procs, run, mp, port, d + "/x", delay, n_loads)
        for p in reversed(procs.procs[started:]):
            procs.stop(p)
    print("  aim (for reference): visibility p99 under 10 ms when busy")
    return results


# ---- 3. the frontend's /metrics beside lora-metrics' ---------------------------------------

class Publisher:
    """Plays an engine on a PUB socket of its own: the whole state of synthetic_stream() again
    every 100 ms (ready, registry, every rank's residency, stats: applying them again changes
    nothing), and once, when asked, what counts (notifications, events, request_stats)."""

    def __init__(self, endpoint, shape):
        self.endpoint = endpoint
        self.again, self.once = [], []
        for body in msgpack.Unpacker(io.BytesIO(synthetic_stream(*shape)),
                                     raw=False):
            kind = body["type"]
            (self.again if kind in ("ready", "registry", "residency_reply", "stats")
             else self.once).append(("engine" if kind != "request_stats" else "request",
                                     msgpack.packb(body, use_bin_type=True)))
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        # The one-off part is about 1000 messages in a burst: above ZeroMQ's default
        # high-water mark of 1000, a PUB socket drops them.
        self.sock.setsockopt(zmq.SNDHWM, 100000)
        self.sock.bind(endpoint)
        self.send_once = False
        self.stopped = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopped:
            batch = list(self.again)
            if self.send_once:
                self.send_once = False
                batch = self.again + self.once
            for topic, body in batch:
                self.sock.send_multipart([topic.encode(), b"LORA1", body])
            time.sleep(0.1)

    def close(self):
        self.stopped = True
        self.thread.join()
        self.sock.close()


def hammer_main(port):
    """The child that scrapes /metrics in a tight loop until SIGTERM; prints how many."""
    n = 0

    def done(*_):
        print("scrapes %d" % n, flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, done)
    c = Conn(port)
    while True:
        status, _ = c.get("/metrics")
        if status != 200:
            print("a scrape answered %d" % status, flush=True)
            os._exit(1)
        n += 1
        if c.closed:
            c.close()
            c = Conn(port)


def completions(port, n):
    c = Conn(port)
    body = b'{"model":"bench-model","prompt":[1,2,3,4,5,6,7,8],"max_tokens":8,' \
           b'"ignore_eos":true,"temperature":0}'
    times = []
    for _ in range(n):
        t = time.perf_counter()
        status, data = c.post("/v1/completions", body)
        times.append(time.perf_counter() - t)
        if status != 200:
            raise Failure("a completion answered %d: %s" % (status, data[:300]))
        if c.closed:
            c.close()
            c = Conn(port)
    c.close()
    return times


def bench_frontend(procs, bin_dir, d, n_scrapes, n_requests):
    shape = (1000, 64, 256, 40, 500)
    w = os.path.join(bin_dir, "lora-worker")
    if not os.path.isdir(d + "/m"):
        subprocess.run([w, "make-model", "--out", d + "/m"], check=True, capture_output=True)
    run = tempfile.mkdtemp(prefix="run-", dir=d)
    os.chmod(run, 0o700)
    eng = procs.start("engine-fe", [os.path.join(bin_dir, "lora-engine"), "--model", d + "/m",
                                    "--run-dir", run, "--publish-interval-ms", "200"])
    procs.start("worker-fe", [w, "serve", "--engine", "ipc://%s/worker.sock" % run, "--rank",
                              "0"], env={"OMP_WAIT_POLICY": "passive"})
    procs.wait_line(eng, r"lora-engine: ready:", 60)
    pub = Publisher("ipc://%s/bench-publish.sock" % d, shape)
    try:
        mp, mport = start_metrics(procs, bin_dir, ["--engine", pub.endpoint])
        fp = procs.start("frontend", [os.path.join(bin_dir, "lora-frontend"), "--run-dir", run,
                                      "--port", "0", "--engine-publish-endpoint", pub.endpoint,
                                      "--served-model-name", "bench-model"])
        fport = int(procs.wait_line(fp, r"lora-frontend: ready: http://127\.0\.0\.1:(\d+)",
                                    60).group(1))
        pub.send_once = True
        want = b'lora_adapter_prompt_tokens_total{model_name="bench-model",engine="0",' \
               b'adapter_name="tenant-%04d/adapter"}' % (shape[4] - 1)
        deadline = time.time() + 30
        bodies = {}
        for label, port in (("lora-metrics", mport), ("lora-frontend", fport)):
            while True:
                status, body = scrape_once(port)
                if status == 200 and want in body:
                    bodies[label] = body
                    break
                if time.time() > deadline:
                    raise Failure("%s never showed the whole state" % label)
                time.sleep(0.01)
        for label, body in bodies.items():
            loaded = body.count(b"\nvllm:lora_adapter_loaded{")
            if loaded != shape[2]:
                raise Failure("%s: %d vllm:lora_adapter_loaded series, not %d" %
                              (label, loaded, shape[2]))
        print("3. the frontend's /metrics beside lora-metrics', the same state (%d registered, "
              "%d in slots, %d in the CPU caches, 2 ranks), kept-alive, alternating, %d scrapes "
              "each" % (shape[0], shape[1], shape[2], n_scrapes))
        print("  response: lora-metrics %d bytes, lora-frontend %d bytes" %
              (len(bodies["lora-metrics"]), len(bodies["lora-frontend"])))
        conns = {"lora-metrics": Conn(mport), "lora-frontend": Conn(fport)}
        times = {k: [] for k in conns}
        for _ in range(20):
            for c in conns.values():
                c.get("/metrics")
        for _ in range(n_scrapes):
            for label in ("lora-metrics", "lora-frontend"):
                t = time.perf_counter()
                status, b = conns[label].get("/metrics")
                times[label].append(time.perf_counter() - t)
                if status != 200 or conns[label].closed:
                    raise Failure("%s: a scrape answered %d (or closed)" % (label, status))
        for c in conns.values():
            c.close()
        for label in ("lora-metrics", "lora-frontend"):
            print("  %-13s %s" % (label + ":", ms(times[label])))
        r50 = quantile(times["lora-frontend"], 0.5) / quantile(times["lora-metrics"], 0.5)
        r99 = quantile(times["lora-frontend"], 0.99) / quantile(times["lora-metrics"], 0.99)
        print("  lora-frontend / lora-metrics: p50 %.2fx, p99 %.2fx (aim: p99 within 2x)" %
              (r50, r99))

        completions(fport, 10)  # warm-up
        # Three rounds of each, interleaved, so that a change in the machine's load meanwhile
        # falls on all three alike. A scraper on lora-metrics costs the machine the same CPU
        # without touching the frontend: what is left beyond it is the frontend's own.
        rounds = {k: ([], 0, 0.0) for k in ("none", "frontend", "lora-metrics")}
        per_round = max(1, n_requests // 3)
        for _ in range(3):
            for key, port in (("none", None), ("frontend", fport), ("lora-metrics", mport)):
                t0 = time.time()
                ham = None
                if port:
                    ham = procs.start("hammer-" + key, [sys.executable,
                                                        os.path.abspath(__file__), "--hammer",
                                                        str(port)])
                    time.sleep(0.2)
                times = completions(fport, per_round)
                n = 0
                if ham:
                    procs.stop(ham)
                    m = re.search(r"scrapes (\d+)", procs.log(ham))
                    if not m:
                        raise Failure("the scraping child failed:\n" + procs.log(ham)[-2000:])
                    n = int(m.group(1))
                old = rounds[key]
                rounds[key] = (old[0] + times, old[1] + n, old[2] + time.time() - t0)
        procs.stop(fp)
        note = re.search(r"/metrics: (\d+) messages waited for a render \(the longest (\d+) "
                         r"ms\); the engine link waited for the lock (\d+) times \(the longest "
                         r"(\d+) us\)", procs.log(fp))
        print("  request path: %d completions of 8 tokens through the frontend, one at a time, "
              "in 3 interleaved rounds of each; completion latency" % (3 * per_round))
        base = rounds["none"][0]
        for key, label in (("none", "no scraper"),
                           ("frontend", "a child scraping the frontend's /metrics non-stop"),
                           ("lora-metrics", "the same child on lora-metrics' /metrics instead")):
            times, n, span = rounds[key]
            print("    %-50s %s%s" % (label + ":", ms(times), "" if key == "none" else
                                      "; p50 %.2fx, p99 %.2fx of none (%d scrapes, %.0f/s)" % (
                                          quantile(times, 0.5) / quantile(base, 0.5),
                                          quantile(times, 0.99) / quantile(base, 0.99), n,
                                          n / span)))
        if note:
            print("    engine messages that waited for a render: %s (the longest %s ms); the "
                  "engine link waited for the lock %s times (the longest %s us)" % note.groups())
        else:
            print("    no engine message waited for a render; the engine link never waited "
                  "for the lock")
    finally:
        pub.close()
        for p in reversed(procs.procs):
            procs.stop(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin")
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--loads", type=int, default=200)
    ap.add_argument("--step-delay-ms", default="10,0",
                    help="comma-separated: one busy round for each")
    ap.add_argument("--requests", type=int, default=300,
                    help="completions of each round of the request path (3.)")
    ap.add_argument("--only", choices=("scrape", "visibility", "frontend"),
                    help="run one part only")
    ap.add_argument("--busy", metavar="RUN_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--hammer", metavar="PORT", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.busy:
        return busy_main(a.busy, 8, 32)
    if a.hammer:
        return hammer_main(a.hammer)
    if not a.bin:
        ap.error("--bin is required")
    try:
        delays = [int(x) for x in a.step_delay_ms.split(",")]
    except ValueError:
        ap.error("--step-delay-ms: give milliseconds, comma-separated")
    # A TERM (make interrupted) still runs the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.stdout.reconfigure(line_buffering=True)  # progress in order with errors
    print("machine: " + machine())
    d = tempfile.mkdtemp(prefix="lora-bench-metrics-")
    procs = Procs(d)
    t0 = time.time()
    try:
        if a.only in (None, "scrape"):
            bench_scrape(procs, a.bin, a.scrapes)
        if a.only in (None, "visibility"):
            bench_visibility(procs, a.bin, d, a.loads, delays)
        if a.only in (None, "frontend"):
            bench_frontend(procs, a.bin, d, a.scrapes, a.requests)
    except (Failure, subprocess.CalledProcessError, OSError, TimeoutError) as e:
        print("metrics_scrape: fatal: %s" % e, file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        shutil.rmtree(d, ignore_errors=True)
    print("total %.1f s" % (time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
