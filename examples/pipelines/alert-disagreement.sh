#!/usr/bin/env bash
# Exits 1 and names every adapter whose level differs between the ranks of an engine, 0 when all
# ranks agree, and lora-inspect's own status when it cannot tell (111: no engine answered): for
# cron, a health probe or `watch`. Arguments go to lora-inspect.
#   alert-disagreement.sh --run-dir /run/lora-stack || mail -s "lora ranks disagree" ops
set -euo pipefail
inspect=${LORA_INSPECT:-lora-inspect}
bad=$("$inspect" residency --json "$@" | jq -r -s '
    map(select(.kind == "adapter" and (.agree | not)))
    | group_by([.engine, .adapter])[]
    | "engine \(.[0].engine): \(.[0].adapter): "
      + (sort_by(.rank) | map("rank \(.rank) \(.level)") | join(", "))')
if [ -n "$bad" ]; then
    printf '%s\n' "$bad"
    exit 1
fi
echo "ok: every rank agrees"
