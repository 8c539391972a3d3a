#!/usr/bin/python3
"""Clients that try to take lora-frontend's connections or memory, bounded in count and time,
on loopback only. Each check prints TAP and exits 0 when it held.

    slow_clients.py deadline PORT N S       N clients trickling header lines are cut, after S s
    slow_clients.py per-ip PORT CAP         one address gets at most CAP connections
    slow_clients.py crowd PORT N            N trickling clients from four addresses fill every
                                            connection; a normal client is still served
    slow_clients.py memory PORT PID MB      eight concurrent 15.7 MB /tokenize bodies keep the
                                            frontend's resident memory under MB
"""

import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import check, done  # noqa: E402


def ok(cond, name, why=""):
    """One TAP check of a condition already measured."""
    def verify():
        assert cond, why
    check(name, verify)

BOUND_S = 30  # no check waits longer than this for what it expects


def connect(port, source="127.0.0.1", timeout=5):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s):
    """Whether the server has closed s (EOF or reset), without waiting."""
    s.setblocking(False)
    try:
        data = s.recv(4096)
        return data == b"" or data.startswith(b"HTTP/")
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def trickle(socks, stop):
    """Sends one more header line on every open socket, every 0.5 s, until stop or all closed."""
    n = 0
    while not stop.is_set():
        n += 1
        for s in socks:
            try:
                s.send(b"X-Slow-%d: x\r\n" % n)
            except OSError:
                pass
        stop.wait(0.5)


def start_slow(port, n, sources):
    socks = []
    for i in range(n):
        try:
            s = connect(port, sources[i % len(sources)])
            s.send(b"GET /version HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            pass
    stop = threading.Event()
    t = threading.Thread(target=trickle, args=(socks, stop), daemon=True)
    t.start()
    return socks, stop


def served(port, source="127.0.0.1"):
    try:
        s = connect(port, source, timeout=2)
        s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = s.recv(4096)
        s.close()
        return data.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def cmd_deadline(port, n, deadline_s):
    t0 = time.time()
    socks, stop = start_slow(port, n, ["127.0.0.1"])
    ok(len(socks) == n, "%d slow clients connected" % n, "connected %d" % len(socks))
    open_ = list(socks)
    first_cut = None
    while open_ and time.time() - t0 < BOUND_S:
        still = [s for s in open_ if not closed_by_server(s)]
        if len(still) < len(open_) and first_cut is None:
            first_cut = time.time() - t0
        open_ = still
        time.sleep(0.1)
    stop.set()
    ok(not open_, "every client that trickles header lines is cut",
       "%d of %d still open after %d s of one line every 0.5 s" % (len(open_), n, BOUND_S))
    # A loaded machine only makes the cut later, never earlier than the deadline.
    ok(first_cut is not None and first_cut >= deadline_s - 0.2,
       "none is cut before the %g s deadline" % deadline_s, "first cut at %s s" % first_cut)
    ok(served(port), "a normal client is served afterwards")


def cmd_per_ip(port, cap):
    want = cap * 3
    socks, stop = start_slow(port, want, ["127.0.0.2"])
    time.sleep(0.5)
    t0 = time.time()
    held = [s for s in socks if not closed_by_server(s)]
    while len(held) > cap and time.time() - t0 < BOUND_S:
        time.sleep(0.1)
        held = [s for s in held if not closed_by_server(s)]
    ok(len(held) <= cap, "one address holds at most %d connections" % cap,
          "127.0.0.2 holds %d" % len(held))
    ok(served(port), "another address is served meanwhile")
    stop.set()
    for s in socks:
        s.close()


def cmd_crowd(port, n):
    sources = ["127.0.0.%d" % i for i in range(2, 6)]
    socks, stop = start_slow(port, n, sources)
    t0 = time.time()
    got = False
    while time.time() - t0 < BOUND_S:
        if served(port):
            got = True
            break
        time.sleep(0.2)
    stop.set()
    ok(got, "a normal client is served while %d trickling clients try to hold every "
          "connection" % n, "not served within %d s" % BOUND_S)
    for s in socks:
        s.close()


def rss_kb(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cmd_memory(port, pid, limit_mb):
    body = json.dumps({"prompt": "a" * (15_700_000 - 20)}).encode()
    head = ("POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)).encode()
    base = rss_kb(pid)
    statuses = []
    lock = threading.Lock()

    def one():
        st = 0
        try:
            s = connect(port, timeout=BOUND_S)
            s.sendall(head)
            for i in range(0, len(body), 1 << 20):
                s.sendall(body[i:i + (1 << 20)])
            buf = b""
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            s.close()
            if buf.startswith(b"HTTP/1."):
                st = int(buf.split(b" ")[1])
        except OSError:
            st = -1  # cut before an answer: the server may close once it answered 503
        with lock:
            statuses.append(st)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    peak = base
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_kb(pid))
        time.sleep(0.005)
    for t in threads:
        t.join()
    hwm = rss_kb(pid, "VmHWM")
    time.sleep(1)
    after = rss_kb(pid)
    print("# rss before %d kB, peak sampled %d kB, high-water mark %d kB, after %d kB; "
          "statuses %s" % (base, peak, hwm, after, sorted(statuses)))
    ok(all(s in (400, 503, -1) for s in statuses) and 400 in statuses,
          "each body is refused: 400 (the prompt cannot fit the context) or 503 (too many "
          "bodies at once)", "statuses %s" % statuses)
    ok(peak < limit_mb * 1024, "peak resident memory under %d MB" % limit_mb,
          "peak %d kB" % peak)
    ok(after < base + 32 * 1024, "resident memory returns near its level before",
          "before %d kB, after %d kB" % (base, after))
    ok(served(port), "the frontend still serves")


def main():
    what = sys.argv[1]
    port = int(sys.argv[2])
    if what == "deadline":
        cmd_deadline(port, int(sys.argv[3]), float(sys.argv[4]))
    elif what == "per-ip":
        cmd_per_ip(port, int(sys.argv[3]))
    elif what == "crowd":
        cmd_crowd(port, int(sys.argv[3]))
    elif what == "memory":
        cmd_memory(port, int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("unknown check %r" % what)
    sys.exit(done())


if __name__ == "__main__":
    main()
