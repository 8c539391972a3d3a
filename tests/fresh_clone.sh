#!/usr/bin/env bash
# Does what the README's two commands say, on a fresh clone of this repository's committed tree
# with no build products and no cached demo model: `make demo`, then (with --test) `make test`.
#   tests/fresh_clone.sh [--test] [DEMO_PORT DEMO_METRICS_PORT]
# Exit status: that of the first command that fails.
set -euo pipefail
with_test=0
if [ "${1:-}" = --test ]; then
    with_test=1
    shift
fi
port=${1:-8000} metrics_port=${2:-9100}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/lora-stack-clone.XXXXXX")
trap 'rm -rf "$work"' EXIT
git clone --quiet --no-hardlinks "$repo" "$work/lora-stack"
cd "$work/lora-stack"
export LORA_DEMO_DIR="$work/demo" # the demo model is made from scratch too
make demo DEMO_PORT="$port" DEMO_METRICS_PORT="$metrics_port"
if [ "$with_test" = 1 ]; then
    make test
fi
