#!/usr/bin/python3
"""The HTTP frontend's own cost per request, at 64 concurrent streams.

Starts an engine, one worker and lora-frontend on a generated model, runs 64 streaming
completions at once (ignore_eos, fixed lengths), and reads the frontend's request_stats
(man/lora-stack-protocol.7): submit_seconds (request received -> its message sent to the engine:
JSON parsing, tokenization, encoding) and output_seconds (an engine output received -> its
server-sent event handed to the HTTP server: detokenization, stop strings, JSON). Both are
printed as p50 / p99 over the requests (output_seconds is each request's mean over its
events), beside the engine's median step time from its stats topic, so the overhead reads as a
share of a step. Those are wall times on a shared machine: with the client, the engine and the
worker on the same cores they include waiting for a core, so the frontend's CPU time per
request and per event (from /proc) is printed too. Run it with OMP_WAIT_POLICY=passive, as
make bench does, or the worker's spinning threads take the cores the frontend needs.

    frontend_overhead.py --bin DIR [--streams 64] [--tokens 32] [--rounds 3]
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import zmq


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream_one(port, body, out, i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    out[i] = data.count("data: ") - 1  # events before [DONE]
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="lora-bench-frontend-")
    procs = []
    try:
        w = os.path.join(a.bin, "lora-worker")
        subprocess.run([w, "make-model", "--out", d + "/m", "--hidden", "256", "--layers", "4",
                        "--heads", "8", "--kv-heads", "2", "--intermediate", "512", "--vocab",
                        "258"], check=True, capture_output=True)
        subprocess.run([w, "make-adapter", "--model", d + "/m", "--out", d + "/a0", "--rank",
                        "16"], check=True, capture_output=True)
        run = d + "/run"
        os.mkdir(run, 0o700)
        log = open(d + "/log", "w")
        procs.append(subprocess.Popen(
            [os.path.join(a.bin, "lora-engine"), "--model", d + "/m", "--run-dir", run,
             "--lora-modules", "a0=" + d + "/a0", "--max-num-seqs", str(a.streams)],
            stdout=log, stderr=log))
        procs.append(subprocess.Popen([w, "serve", "--engine", "ipc://%s/worker.sock" % run,
                                       "--rank", "0"], stdout=log, stderr=log))
        fe_log = d + "/frontend.log"
        procs.append(subprocess.Popen(
            [os.path.join(a.bin, "lora-frontend"), "--run-dir", run, "--port", "0",
             "--publish-endpoint", "ipc://%s/stats.sock" % run],
            stdout=open(fe_log, "w"), stderr=subprocess.STDOUT))
        port = None
        for _ in range(600):
            text = open(fe_log).read()
            if "ready: http://" in text:
                port = int(text.split("ready: http://127.0.0.1:")[1].split()[0])
                break
            time.sleep(0.1)
        if not port:
            sys.exit("frontend_overhead: the stack did not start:\n" + open(d + "/log").read())
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect("ipc://%s/stats.sock" % run)
        esub = ctx.socket(zmq.SUB)
        esub.setsockopt(zmq.SUBSCRIBE, b"stats")
        esub.connect("ipc://%s/publish.sock" % run)
        time.sleep(0.5)
        body = {"model": "a0", "prompt": "benchmark the frontend", "max_tokens": a.tokens,
                "ignore_eos": True, "temperature": 0, "stream": True}
        submit, output, steps, events = [], [], [], []
        fe_pid = procs[2].pid
        cpu0 = cpu_seconds(fe_pid)
        for _ in range(a.rounds):
            counts = [0] * a.streams
            ts = [threading.Thread(target=stream_one, args=(port, body, counts, i))
                  for i in range(a.streams)]
            t0 = time.time()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            wall = time.time() - t0
            events.append(sum(counts))
            got = 0
            while got < a.streams and sub.poll(5000):
                m = msgpack.unpackb(sub.recv_multipart()[2], raw=False)
                submit.append(m.get("submit_seconds", 0))
                output.append(m.get("output_seconds", 0))
                got += 1
            while esub.poll(0):
                m = msgpack.unpackb(esub.recv_multipart()[2], raw=False)
                if m.get("step_tokens", 0) >= a.streams:
                    steps.append(m["step_seconds"])
        cpu = cpu_seconds(fe_pid) - cpu0
        step = statistics.median(steps) if steps else float("nan")
        print("frontend overhead, %d concurrent streams of %d tokens, %d rounds (%d requests, "
              "%d events, last round %.2f s)" % (a.streams, a.tokens, a.rounds, len(submit),
                                                 sum(events), wall))
        print("  request received -> sent to the engine: p50 %.3f ms, p99 %.3f ms" %
              (quantile(submit, 0.5) * 1e3, quantile(submit, 0.99) * 1e3))
        print("  engine output -> event handed to HTTP:  p50 %.3f ms, p99 %.3f ms" %
              (quantile(output, 0.5) * 1e3, quantile(output, 0.99) * 1e3))
        print("  engine decode step at batch %d: median %.3f ms; output overhead p50 = %.1f%% "
              "of a step" % (a.streams, step * 1e3, 100 * quantile(output, 0.5) / step))
        print("  frontend CPU time: %.3f ms per request, %.1f us per streamed event (%.2f s "
              "in all)" % (1e3 * cpu / len(submit), 1e6 * cpu / sum(events), cpu))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
