#!/usr/bin/env bash
# Which adapters each engine holds, one line per adapter: its level on every rank in rank order
# (gpu, cpu, or registered where that rank does not hold it), whether the ranks agree, whether
# every rank pins it, and its running and waiting requests. Arguments go to lora-inspect.
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
