#!/usr/bin/env bash
# Which adapters each engine holds, one line per adapter: its level on every rank (gpu, cpu, or
# registered when that rank does not hold it; comma-joined in rank order), whether the ranks agree, and its running and waiting
# requests. Arguments go to lora-inspect (--run-dir DIR or --control-endpoint EP).
#   residency-report.sh --run-dir /run/lora-stack
set -euo pipefail
inspect=${LORA_INSPECT:-lora-inspect}
"$inspect" residency --json "$@" | jq -r -s '
    ["ENGINE", "ADAPTER", "LEVELS", "AGREE", "PINNED", "RUNNING", "WAITING"],
    (map(select(.kind == "adapter"))
     | group_by([.engine, .adapter])[]
     | sort_by(.rank)
     | [.[0].engine, .[0].adapter, (map(.level) | join(",")), all(.agree),
        all(.pinned), .[0].running, .[0].waiting])
    | @tsv'
