#!/usr/bin/env bats
# examples/: the Prometheus files and the dashboard parse, and the systemd unit drives lora-stack
# up and down. The Kubernetes manifests have tests/cli/kubernetes.bats.

load ../helpers

EX="$ROOT/examples"

@test "examples: the Prometheus configuration and rules parse as YAML" {
    for f in "$EX"/prometheus/*.yml; do
        run "$PYTHON" -c 'import sys, yaml; docs = list(yaml.safe_load_all(open(sys.argv[1]))); assert docs and all(docs), sys.argv[1]' "$f"
        [ "$status" -eq 0 ] || { echo "$f: $output"; return 1; }
    done
}

@test "examples: the Grafana dashboard is JSON with a query per panel" {
    run "$PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["panels"] and all(p["targets"] and p["targets"][0]["expr"] for p in d["panels"])' \
        "$EX/grafana/lora-stack-dashboard.json"
    expect_status 0
}

@test "examples: the systemd unit names lora-stack up and down with a run directory" {
    grep -q '^ExecStart=.*lora-stack up --run-dir' "$EX/systemd/lora-stack@.service"
    grep -q '^ExecStop=.*lora-stack down --run-dir' "$EX/systemd/lora-stack@.service"
    if command -v systemd-analyze > /dev/null; then
        run systemd-analyze verify --man=no "$EX/systemd/lora-stack@.service"
        [[ "$output" != *"Unknown key"* && "$output" != *"Invalid"* ]]
    fi
}
