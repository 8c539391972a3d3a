#!/usr/bin/python3
"""What a LoRA-aware router makes of endpoints' scrapes: two scorers of the llm-d router's
endpoint picker, re-implemented from their published code to rank endpoints for one adapter.
Written for the tests, independently of lora-metrics.

    router_view.py score ADAPTER NAME=SOURCE... [--as-vllm]
        The lora-affinity-scorer. One line per endpoint, best first: "RANK NAME SCORE" (score
        with one decimal). Endpoints with equal scores share a rank, since the router has no
        reason to prefer either.
    router_view.py sets NAME=SOURCE... [--as-vllm]
        One line per endpoint: "NAME running=A,B waiting=C max_lora=N", the sets as the router
        reads them.
    router_view.py load-state ADAPTER NAME=SOURCE...
        The lora-load-state-scorer. One line per endpoint, best first: "RANK NAME SCORE TIER",
        the tier's score with one decimal and its name (gpu-resident, cpu-resident, free-slot,
        evictable, saturated). Within a tier the endpoint with the larger share of free slots
        comes first, as the scorer's headroom bonus orders them; endpoints equal in both share
        a rank.
    router_view.py residency NAME=SOURCE...
        One line per endpoint: "NAME loaded=A:gpu,B:cpu:pinned gpu=N max=M active=C,D", what
        the lora-load-state-scorer reads (loaded=- when the scrape reports no residency).

SOURCE is an http:// URL of a /metrics page or a file holding a scrape.
--as-vllm reads the two lists as vLLM writes them, every tracked adapter in both (see
lora-stack-metrics(7)): both become the union of what the scrape lists.

The lora-affinity-scorer's rules, from llm-d/llm-d-router (pkg/epp/framework/plugins/datalayer/
extractor/metrics/loraspec.go and extractor.go, pkg/epp/framework/plugins/scheduling/scorer/
loraaffinity/lora_affinity.go):
  - the endpoint's sets come from its vllm:lora_requests_info series with the largest value (the
    value is the time the series was written): running_lora_adapters is the active set,
    waiting_lora_adapters the waiting set, each split at commas, and max_lora an integer;
  - per endpoint, the first case that holds gives the score: 1.0 when the adapter is in the
    active set; 0.8 when the active and the waiting set together hold fewer than max_lora
    adapters (the sum of their sizes: room to load one more); 0.6 when the adapter is in the
    waiting set; else 0.0.

The lora-load-state-scorer's rules, from its pull request to the same repository (#2792:
pkg/epp/framework/plugins/scheduling/scorer/loraloadstate/lora_load_state.go and the
extractor's tests), with its default parameters:
  - residency: every vllm:lora_adapter_loaded series with a non-zero value and an adapter_name,
    keyed by adapter_name across series (any engine or rank label): level gpu outranks cpu, and
    pinned="true" marks it unevictable. The scrape reports residency when it has that family or
    vllm:num_gpu_loaded_lora_adapters; otherwise every endpoint falls to the capacity tiers;
  - adapters in slots: the largest vllm:num_gpu_loaded_lora_adapters series, else the count of
    gpu-level adapters; slots: the largest vllm:max_gpu_lora_adapters series, else max_lora of
    vllm:lora_requests_info; the adapters with requests in flight: its running_lora_adapters;
  - per endpoint, the first case that holds gives the tier: 1.0 when the adapter is at level
    gpu; 0.7 at level cpu; 0.6 when fewer adapters than slots are in slots; 0.3 when some
    unpinned gpu-level adapter is not in running_lora_adapters (an eviction nobody waits on);
    else 0.0.
  The scorer scales the tiers into [0, 0.94] and adds two bonuses of at most 0.03 each that
  reorder endpoints within a tier and never across one: headroom (the share of free slots),
  modelled here as the order within a tier, and placement (a hash of the adapter and the pod's
  name in the cluster), which depends on the pod's identity and is left out.

Exit 0, 1 when a source cannot be read or (score, sets) has no vllm:lora_requests_info, 100 on
usage errors.
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


LOADED = "vllm:lora_adapter_loaded"
GPU_LOADED = "vllm:num_gpu_loaded_lora_adapters"
GPU_SLOTS = "vllm:max_gpu_lora_adapters"
TIERS = (("gpu-resident", 1.0), ("cpu-resident", 0.7), ("free-slot", 0.6), ("evictable", 0.3),
         ("saturated", 0.0))


def series(text, family):
    """(labels, value) of every sample of family in the scrape."""
    out = []
    for line in text.splitlines():
        if not line.startswith(family):
            continue
        m = SAMPLE.match(line)
        if m and m.group(1) == family:
            try:
                out.append((labels_of(m.group(2)), float(m.group(3))))
            except ValueError:
                continue
    return out


class Residency:
    """What the lora-load-state-scorer reads of one endpoint."""

    def __init__(self, text):
        loaded_series = series(text, LOADED)
        counts = series(text, GPU_LOADED)
        # adapter -> [level, pinned]; None when the scrape reports no residency.
        self.loaded = {} if (loaded_series or counts) else None
        for lab, v in loaded_series:
            name, level = lab.get("adapter_name", ""), lab.get("level")
            if v == 0 or not name or level not in ("gpu", "cpu"):
                continue
            cur = self.loaded.get(name)
            pinned = lab.get("pinned") == "true"
            if cur is None or (cur[0] == "cpu" and level == "gpu"):
                self.loaded[name] = [level, pinned]
            elif cur[0] == level:
                cur[1] = cur[1] or pinned
        if counts:
            self.gpu = int(max(v for _, v in counts))
        else:
            self.gpu = sum(1 for lv, _ in (self.loaded or {}).values() if lv == "gpu")
        slots = series(text, GPU_SLOTS)
        self.active = set()
        self.max = 0
        try:
            self.active, _, self.max = endpoint_view(text)
        except Unreadable:
            pass
        if slots:
            self.max = int(max(v for _, v in slots))

    def tier(self, adapter):
        state = (self.loaded or {}).get(adapter)
        if state and state[0] == "gpu":
            return TIERS[0]
        if state:
            return TIERS[1]
        if self.gpu < self.max:
            return TIERS[2]
        idle = [a for a, (lv, pin) in (self.loaded or {}).items()
                if lv == "gpu" and not pin and a not in self.active]
        return TIERS[3] if idle else TIERS[4]

    def headroom(self):
        if self.max > 0 and self.gpu < self.max:
            return (self.max - self.gpu) / self.max
        return 0.0

    def line(self, name):
        if self.loaded is None:
            loaded = "-"
        else:
            loaded = ",".join("%s:%s%s" % (a, lv, ":pinned" if pin else "")
                              for a, (lv, pin) in sorted(self.loaded.items()))
        return "%s loaded=%s gpu=%d max=%d active=%s" % (
            name, loaded, self.gpu, self.max, ",".join(sorted(self.active)))


def print_ranked(scored):
    """scored: (sort key, name, text) in the order given; best first, equal keys share a rank."""
    scored.sort(key=lambda s: s[0], reverse=True)
    rank, last = 0, None
    for key, name, text in scored:
        if key != last:
            rank, last = rank + 1, key
        print("%d %s %s" % (rank, name, text))


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
    if not args or args[0] not in ("score", "sets", "load-state", "residency"):
        usage("give score, sets, load-state or residency")
    cmd, args = args[0], args[1:]
    if cmd in ("score", "load-state"):
        if not args:
            usage("%s needs an adapter" % cmd)
        adapter, args = args[0], args[1:]
    eps = parse_endpoints(args)
    texts = []
    try:
        for name, src in eps:
            texts.append((name, read_source(src)))
        if cmd in ("load-state", "residency"):
            views = [(name, Residency(text)) for name, text in texts]
        else:
            views = [(name,) + endpoint_view(text, as_vllm) for name, text in texts]
    except Unreadable as e:
        sys.stderr.write("router_view: %s: %s\n" % (name, e))
        return 1
    if cmd == "residency":
        for name, r in views:
            print(r.line(name))
    elif cmd == "load-state":
        scored = []
        for name, r in views:
            tier, value = r.tier(adapter)
            scored.append(((value, r.headroom()), name, "%.1f %s" % (value, tier)))
        print_ranked(scored)
    elif cmd == "sets":
        for name, active, waiting, max_lora in views:
            print("%s running=%s waiting=%s max_lora=%d" % (
                name, ",".join(sorted(active)), ",".join(sorted(waiting)), max_lora))
    else:
        scored = []
        for name, a, w, m in views:
            value = score(adapter, a, w, m)
            scored.append((value, name, "%.1f" % value))
        print_ranked(scored)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
