#!/usr/bin/env bash
# The demo that `make demo` runs: the whole stack on the demo model (a small generated Llama and
# three adapters), one completion for the base model and one for an adapter, what the exporter
# and the inspector say about the adapters, then the stack goes down again.
#   examples/demo.sh BIN_DIR [PORT] [METRICS_PORT]
set -euo pipefail
BIN=$1 PORT=${2:-8000} METRICS_PORT=${3:-9100}
RUN=$(mktemp -d "${TMPDIR:-/tmp}/lora-stack-demo.XXXXXX")
trap '"$BIN/lora-stack" down --run-dir "$RUN" > /dev/null 2>&1 || true; rm -rf "$RUN"' EXIT

"$BIN/lora-stack" up --run-dir "$RUN" --port "$PORT" --metrics-port "$METRICS_PORT" \
    --max-loras 2 --max-cpu-loras 4
complete() {
    curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$1\",\"prompt\":\"$2\",\"max_tokens\":12,\"temperature\":0}"
    echo
}
echo "== a completion from the base model"
complete "$("$BIN/lora-worker" demo-model)" "Hello"
echo "== a completion from the adapter demo-sql"
complete demo-sql "SELECT"
echo "== the LoRA lines of a scrape of http://127.0.0.1:$METRICS_PORT/metrics"
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^(vllm:)?lora|^vllm:num_(gpu|cpu)_loaded'
echo "== lora-inspect residency"
"$BIN/lora-inspect" residency --run-dir "$RUN" --table
echo "== done: the stack is stopped (lora-stack up leaves one running; see README)"
