#!/usr/bin/python3
"""What a LoRA-aware router makes of endpoints' scrapes: the LoRA affinity scorer of the Gateway
API Inference Extension's endpoint picker (the "lora-affinity-scorer" plugin that llm-d's
inference scheduler runs), re-implemented from its published rules to rank endpoints for one
adapter. Written for the tests, independently of lora-metrics.

    router_view.py score ADAPTER NAME=SOURCE... [--as-vllm]
        One line per endpoint, best first: "RANK NAME SCORE" (score with one decimal). Endpoints
        with equal scores share a rank, since the router has no reason to prefer either.
    router_view.py sets NAME=SOURCE... [--as-vllm]
        One line per endpoint: "NAME running=A,B waiting=C max_lora=N", the sets as the router
        reads them.

SOURCE is an http:// URL of a /metrics page or a file holding a scrape.
--as-vllm reads the two lists as vLLM writes them, every tracked adapter in both (see
lora-stack-metrics(7)): both become the union of what the scrape lists.

The rules, from the published scorer and its metrics extractor
(kubernetes-sigs/gateway-api-inference-extension, pkg/epp/scheduling/framework/plugins/scorer/
lora_affinity.go and pkg/epp/backend/metrics/metrics.go):
  - the endpoint's sets come from its vllm:lora_requests_info series with the largest value (the
    value is the time the series was written): running_lora_adapters is the active set,
    waiting_lora_adapters the waiting set, each split at commas, and max_lora an integer;
  - per endpoint, the first case that holds gives the score: 1.0 when the adapter is in the
    active set; 0.8 when the active and the waiting set together hold fewer than max_lora
    adapters (room to load one more); 0.6 when the adapter is in the waiting set; else 0.0.
Later llm-d releases count the union of the two sets rather than the sum of their sizes; for
lora-metrics' default (resident) sets, which never share an adapter, the two are the same.

Exit 0, 1 when a source has no vllm:lora_requests_info or cannot be read, 100 on usage errors.
"""

import re
import sys
import urllib.request

FAMILY = "vllm:lora_requests_info"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class Unreadable(Exception):
    pass


def read_source(src):
    if src.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(src, timeout=10) as r:
                return r.read().decode("utf-8", "replace")
        except OSError as e:
            raise Unreadable("%s: %s" % (src, e))
    try:
        with open(src, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise Unreadable("%s: %s" % (src, e.strerror))


def labels_of(text):
    out = {}
    for m in LABEL.finditer(text or ""):
        out[m.group(1)] = re.sub(r'\\[\\"n]', lambda e: UNESCAPE[e.group(0)], m.group(2))
    return out


def split_list(value):
    return {a.strip() for a in value.split(",") if a.strip()}


def endpoint_view(text, as_vllm=False):
    """(active set, waiting set, max_lora) from the latest vllm:lora_requests_info series."""
    best = None
    for line in text.splitlines():
        if not line.startswith(FAMILY):
            continue
        m = SAMPLE.match(line)
        if not m or m.group(1) != FAMILY:
            continue
        v = float(m.group(3))
        if best is None or v > best[0]:
            best = (v, labels_of(m.group(2)))
    if best is None:
        raise Unreadable("no %s series" % FAMILY)
    lab = best[1]
    active = split_list(lab.get("running_lora_adapters", ""))
    waiting = split_list(lab.get("waiting_lora_adapters", ""))
    if as_vllm:
        active = waiting = active | waiting
    try:
        max_lora = int(lab.get("max_lora", "0") or "0")
    except ValueError:
        raise Unreadable("max_lora %r is not an integer" % lab.get("max_lora"))
    return active, waiting, max_lora


def score(adapter, active, waiting, max_lora):
    if adapter in active:
        return 1.0
    if len(active) + len(waiting) < max_lora:
        return 0.8
    if adapter in waiting:
        return 0.6
    return 0.0


def parse_endpoints(args):
    eps = []
    for a in args:
        name, sep, src = a.partition("=")
        if not sep or not name or not src:
            usage("'%s' is not NAME=SOURCE" % a)
        eps.append((name, src))
    if not eps:
        usage("no endpoint")
    return eps


def usage(msg):
    sys.stderr.write("router_view: fatal: %s\n%s\n" % (msg, __doc__.split("\n\n")[1]))
    sys.exit(100)


def main(argv):
    as_vllm = "--as-vllm" in argv
    args = [a for a in argv if a != "--as-vllm"]
    if not args or args[0] not in ("score", "sets"):
        usage("give score or sets")
    cmd, args = args[0], args[1:]
    if cmd == "score":
        if not args:
            usage("score needs an adapter")
        adapter, args = args[0], args[1:]
    eps = parse_endpoints(args)
    views = []
    try:
        for name, src in eps:
            views.append((name,) + endpoint_view(read_source(src), as_vllm))
    except Unreadable as e:
        sys.stderr.write("router_view: %s: %s\n" % (name, e))
        return 1
    if cmd == "sets":
        for name, active, waiting, max_lora in views:
            print("%s running=%s waiting=%s max_lora=%d" % (
                name, ",".join(sorted(active)), ",".join(sorted(waiting)), max_lora))
        return 0
    scored = [(score(adapter, a, w, m), name) for name, a, w, m in views]
    # Best first; equal scores keep the order given and share a rank.
    scored.sort(key=lambda s: -s[0])
    rank, last = 0, None
    for s, name in scored:
        if s != last:
            rank, last = rank + 1, s
        print("%d %s %.1f" % (rank, name, s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
