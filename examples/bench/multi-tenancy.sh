#!/usr/bin/env bash
# The multi-tenancy cost study on this machine, start to end: writes a generated Qwen2-shaped
# model (hidden 512, 8 layers, vocab 2048) and eight rank-16 adapters, starts lora-stack on it
# with a slot for every adapter, runs `lora-bench campaign` with
# examples/bench/multi-tenancy.json, writes the report, and stops the stack.
#   examples/bench/multi-tenancy.sh OUT_DIR [CAMPAIGN OPTIONS, e.g. --quick]
# The programs come from $LORA_BIN (default build/main/bin); the stack listens on
# $BENCH_PORT (default 8300) and $BENCH_PORT + 1. OUT_DIR/model holds the model and adapters
# (kept for the next run), OUT_DIR/campaign the cells, report.md and the figures. A campaign
# that stopped half-way goes on where it stopped when run again with the same OUT_DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${LORA_BIN:-$ROOT/build/main/bin}
PORT=${BENCH_PORT:-8300}
[ $# -ge 1 ] || { echo "usage: $0 OUT_DIR [CAMPAIGN OPTIONS]" >&2; exit 100; }
OUT=$1
shift
mkdir -p "$OUT/model"
M=$OUT/model/m
if [ ! -f "$M/config.json" ]; then
    "$BIN/lora-worker" make-model --out "$M" --arch qwen2 --hidden 512 --layers 8 --heads 8 \
        --kv-heads 2 --intermediate 1536 --vocab 2048 > /dev/null
fi
mods=()
for i in 1 2 3 4 5 6 7 8; do
    [ -f "$OUT/model/a$i/adapter_config.json" ] ||
        "$BIN/lora-worker" make-adapter --model "$M" --out "$OUT/model/a$i" --rank 16 \
            --seed "$i" > /dev/null
    mods+=(--lora-modules "a$i=$OUT/model/a$i")
done

RUN=$(mktemp -d "${TMPDIR:-/tmp}/lora-bench-run.XXXXXX")
trap '"$BIN/lora-stack" down --run-dir "$RUN" > /dev/null 2>&1 || true; rm -rf "$RUN"' EXIT
"$BIN/lora-stack" up --model "$M" --run-dir "$RUN" --port "$PORT" \
    --metrics-port $((PORT + 1)) --max-loras 8 --max-cpu-loras 8 "${mods[@]}" > /dev/null

rc=0
"$BIN/lora-bench" campaign "$ROOT/examples/bench/multi-tenancy.json" \
    --output-dir "$OUT/campaign" --base-url "http://127.0.0.1:$PORT" --run-dir "$RUN" "$@" ||
    rc=$?
"$BIN/lora-bench" report "$OUT/campaign" > /dev/null || rc=$?
echo "report: $OUT/campaign/report.md"
exit "$rc"
