#!/usr/bin/env python3
"""Turns the README's shell blocks into one bash script that follows them top to bottom.

A reader is meant to paste the README's sections into one shell in order; this script makes
that exact sequence runnable so a test can check that one section's files never break the next.
It takes the ```sh blocks of the sections named on the command line, in README order, and
rewrites only what a test must move out of the reader's way:
  - build/main-cuda/bin (and build/main/bin) -> the binaries under test;
  - /tmp/ -> a scratch directory (the ports stay the README's: the test checks they are free);
  - a foreground line with `--follow` runs for a few seconds under timeout (a reader stops it
    with Ctrl-C).
Usage: readme_walk.py README BIN SCRATCH SECTION...  (the script is printed on stdout)
"""
import re
import sys


def sections(text):
    """{heading: [block, ...]} for the ```sh blocks under each '## ' heading."""
    out, heading, block = {}, None, None
    for line in text.splitlines():
        if block is not None:
            if line.startswith("```"):
                out.setdefault(heading, []).append("\n".join(block))
                block = None
            else:
                block.append(line)
        elif line.startswith("## "):
            heading = line[3:].strip()
        elif line.strip() == "```sh":
            block = []
    return out


def rewrite(line, bin_dir, scratch):
    # /tmp/ first: the binaries' own path may lie under /tmp (a checkout there).
    line = line.replace("/tmp/", scratch + "/")
    line = re.sub(r"build/main(-cuda)?/bin", bin_dir, line)
    if "--follow" in line and not line.rstrip().endswith(("\\", "&")):
        cmd = line.split("  #")[0].rstrip()
        line = "timeout -s INT 3 %s || [ $? -eq 124 ]" % cmd
    return line


def main():
    if len(sys.argv) < 5:
        sys.exit("usage: readme_walk.py README BIN SCRATCH SECTION...")
    readme, bin_dir, scratch = sys.argv[1:4]
    found = sections(open(readme, encoding="utf-8").read())
    print("set -euo pipefail")
    for name in sys.argv[4:]:
        if name not in found:
            sys.exit("readme_walk: the README has no section '## %s' with a ```sh block" % name)
        for block in found[name]:
            print("echo '>>> %s' >&2" % name.replace("'", ""))
            for line in block.splitlines():
                print(rewrite(line, bin_dir, scratch))


if __name__ == "__main__":
    main()
