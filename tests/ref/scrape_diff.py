#!/usr/bin/python3
"""Compares two Prometheus text expositions sample by sample.

    scrape_diff.py A B [--skip FAMILY ...]

Every sample of A must be in B with the same value and the other way round, except the
families named by --skip (a histogram family covers its _bucket, _sum and _count) and the
value of vllm:lora_requests_info (the time of the scrape; its labels are compared). HELP and
TYPE lines are compared too. Prints the differences; exits 0 when there are none, 1 otherwise.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metrics_truth import parse_scrape  # noqa: E402


def family_of(name, skip):
    for s in skip:
        if name == s or (name.startswith(s) and name[len(s):] in ("_bucket", "_sum", "_count")):
            return s
    return None


def samples(path, skip):
    text = open(path, encoding="utf-8").read()
    out = {}
    for name, labels, v in parse_scrape(text):
        if family_of(name, skip):
            continue
        key = name + "{" + ",".join("%s=%r" % kv for kv in sorted(labels.items())) + "}"
        out[key] = None if name == "vllm:lora_requests_info" else v
    meta = {ln for ln in text.splitlines() if ln.startswith("# ")}
    return out, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--skip", nargs="*", default=[])
    a = ap.parse_args()
    sa, ma = samples(a.a, a.skip)
    sb, mb = samples(a.b, a.skip)
    bad = 0
    for k in sorted(set(sa) | set(sb)):
        if k not in sb:
            print("only in %s: %s %s" % (a.a, k, sa[k]))
        elif k not in sa:
            print("only in %s: %s %s" % (a.b, k, sb[k]))
        elif sa[k] != sb[k]:
            print("differs: %s %s against %s" % (k, sa[k], sb[k]))
        else:
            continue
        bad += 1
    for line in sorted(ma ^ mb):
        print("HELP or TYPE only in %s: %s" % (a.a if line in ma else a.b, line))
        bad += 1
    print("%d samples compared, %d differences" % (len(sa), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
