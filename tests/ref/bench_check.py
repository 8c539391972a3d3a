#!/usr/bin/env python3
"""Independent checks of lora-bench's output, for tests/cli/lora-bench.bats and
tests/e2e/lora-bench.bats.

  bench_check.py percentiles RESULT
      Recomputes, from the result's own per-request arrays (ttfts, itls, latencies,
      output_lens, errors), every mean_/median_/std_/pNN_ of ttft, tpot, itl and e2el the
      result holds, with numpy (the definitions `vllm bench serve` uses), and compares.
  bench_check.py tokens RESULT BEFORE AFTER
      BEFORE and AFTER are scrapes of the server's /metrics around the run: the server's
      counters must have moved by what the result counts (total_output_tokens,
      total_input_tokens, and per adapter by the result's models list where the server has
      lora-stack's per-adapter counters).
  bench_check.py concurrency RESULT C
      No more than C requests were in flight at once (from start_times and end_times), and
      exactly C at some moment when there were at least C requests.
  bench_check.py share RESULT NAME FRACTION
      NAME got FRACTION of the requests.
Exit 0 with one line saying what was checked, 1 with what differs.
"""
import json
import math
import re
import sys

import numpy as np


def load(path):
    with open(path) as f:
        return json.load(f)


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def percentiles(path):
    r = load(path)
    ok = [i for i, e in enumerate(r["errors"]) if e == ""]
    if len(ok) != r["completed"]:
        fail("completed %d but %d requests without an error" % (r["completed"], len(ok)))
    series = {
        "ttft": [r["ttfts"][i] for i in ok],
        "tpot": [(r["latencies"][i] - r["ttfts"][i]) / (r["output_lens"][i] - 1)
                 for i in ok if r["output_lens"][i] > 1],
        "itl": [x for i in ok for x in r["itls"][i]],
        "e2el": [r["latencies"][i] for i in ok],
    }
    checked, bad = 0, []
    for key, value in r.items():
        m = re.fullmatch(r"(mean|median|std|p([0-9.]+))_(ttft|tpot|itl|e2el)_ms", key)
        if not m:
            continue
        v = np.array(series[m.group(3)] or [0.0])
        if m.group(1) == "mean":
            want = np.mean(v)
        elif m.group(1) == "median":
            want = np.median(v)
        elif m.group(1) == "std":
            want = np.std(v)
        else:
            want = np.percentile(v, float(m.group(2)))
        want *= 1000
        checked += 1
        if not math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-9):
            bad.append("%s: %r, numpy says %r" % (key, value, want))
    if bad:
        fail("\n".join(bad))
    if checked < 16:
        fail("only %d statistics in the result" % checked)
    print("percentiles: %d statistics equal numpy's over %d requests" % (checked, len(ok)))


def scrape(path):
    """{(family, adapter_name or None): summed value} of a text exposition."""
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        k = (m.group(1), labels.get("adapter_name"))
        out[k] = out.get(k, 0.0) + float(m.group(4))
    return out


def tokens(path, before, after):
    r, b, a = load(path), scrape(before), scrape(after)

    def moved(family, adapter=None):
        return a.get((family, adapter), 0.0) - b.get((family, adapter), 0.0)

    checks = [("vllm:generation_tokens_total", moved("vllm:generation_tokens_total"),
               r["total_output_tokens"]),
              ("vllm:prompt_tokens_total", moved("vllm:prompt_tokens_total"),
               r["total_input_tokens"])]
    per = {}
    for i, model in enumerate(r["models"]):
        if r["errors"][i] == "" and model in (r.get("lora_modules") or []):
            g, p = per.get(model, (0, 0))
            per[model] = (g + r["output_lens"][i], p + r["input_lens"][i])
    has_per_adapter = any(k[0] == "lora_adapter_generation_tokens_total" for k in a)
    for name, (g, p) in sorted(per.items()) if has_per_adapter else []:
        checks.append(("lora_adapter_generation_tokens_total{%s}" % name,
                       moved("lora_adapter_generation_tokens_total", name), g))
        checks.append(("lora_adapter_prompt_tokens_total{%s}" % name,
                       moved("lora_adapter_prompt_tokens_total", name), p))
    bad = ["%s moved by %g, the result counts %d" % c for c in checks if c[1] != c[2]]
    if bad:
        fail("\n".join(bad))
    print("tokens: the server's counters moved by the result's counts: " +
          ", ".join("%s %d" % (c[0], c[2]) for c in checks))


def concurrency(path, c):
    r = load(path)
    events = sorted([(s, 1) for s in r["start_times"]] + [(e, -1) for e in r["end_times"]],
                    key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    if peak > c or (len(r["start_times"]) >= c and peak < c):
        fail("at most %d requests in flight, asked for %d" % (peak, c))
    print("concurrency: at most %d in flight" % peak)


def share(path, name, fraction):
    r = load(path)
    got = r["models"].count(name) / len(r["models"])
    if abs(got - fraction) > 1e-9:
        fail("%s got %.4f of the requests, not %.4f" % (name, got, fraction))
    print("share: %s got %.2f of %d requests" % (name, got, len(r["models"])))


def main():
    a = sys.argv[1:]
    if a[:1] == ["percentiles"] and len(a) == 2:
        percentiles(a[1])
    elif a[:1] == ["tokens"] and len(a) == 4:
        tokens(*a[1:])
    elif a[:1] == ["concurrency"] and len(a) == 3:
        concurrency(a[1], int(a[2]))
    elif a[:1] == ["share"] and len(a) == 4:
        share(a[1], a[2], float(a[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
