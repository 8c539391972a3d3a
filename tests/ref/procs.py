"""The processes a test script or a benchmark starts: each in its own process group, its output
in WORK/NAME.log, waited for by a line it prints, and stopped whatever happens (stop_all() in a
finally). Shared by tests/ref/metrics_truth.py and tests/bench/metrics_scrape.py."""

import os
import re
import signal
import subprocess
import time


class Failure(Exception):
    pass


class Procs:
    def __init__(self, work):
        self.work = work
        self.procs = []

    def start(self, name, argv, env=None, stdin=subprocess.DEVNULL):
        """Starts argv with env (a dict) added to this environment; p.log is its log."""
        path = os.path.join(self.work, name + ".log")
        with open(path, "w") as log:
            p = subprocess.Popen(argv, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, **(env or {})), start_new_session=True)
        p.name, p.log = name, path
        self.procs.append(p)
        return p

    def log(self, p):
        with open(p.log) as f:
            return f.read()

    def wait_line(self, p, pattern, timeout_s=30):
        """The first match of pattern in p's log; Failure when p exits or time runs out first."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            m = re.search(pattern, self.log(p))
            if m:
                return m
            if p.poll() is not None:
                raise Failure("%s exited (%s) before '%s':\n%s" % (
                    p.name, p.returncode, pattern, self.log(p)[-3000:]))
            time.sleep(0.01)
        raise Failure("%s did not print '%s' within %d s:\n%s" % (
            p.name, pattern, timeout_s, self.log(p)[-3000:]))

    def stop(self, p, sig=signal.SIGTERM):
        """sig to p's group (after SIGCONT, in case a test stopped it); SIGKILL after 5 s."""
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, sig)
                p.wait(5)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        if p.stdin:
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        """Every process still running, the last started first."""
        for p in reversed(list(self.procs)):
            self.stop(p)
