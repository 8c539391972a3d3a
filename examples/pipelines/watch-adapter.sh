#!/usr/bin/env bash
# Follows one adapter: each request event that names it, and each change of its level on a rank,
# as one JSON line, until interrupted. Arguments after the name go to lora-inspect.
#   watch-adapter.sh sql-expert --run-dir /run/lora-stack
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: watch-adapter.sh ADAPTER [LORA-INSPECT OPTIONS]" >&2; exit 100; }
name=$1
shift
inspect=${LORA_INSPECT:-lora-inspect}
# The engine republishes its whole residency every --publish-interval-ms: keep each rank's last
# level and print only the changes.
"$inspect" events --follow --json "$@" | jq -n --unbuffered -c --arg a "$name" '
    foreach (inputs | select(.topic == "event" or .type == "residency_reply")) as $m ({levels: {}};
        if $m.topic == "event" then .out = (if $m.message.lora == $a then
                {time: $m.message.time, adapter: $a, request_id: $m.message.request_id,
                 event: $m.message.event} else null end)
        else
            ($m.message.state) as $s
            | (if ($s.slots | index($a)) != null then "gpu"
               elif ($s.cpu | index($a)) != null then "cpu" else "none" end) as $lv
            | ("\($m.message.engine // 0)/\($m.message.rank)") as $k
            | .out = (if .levels[$k] != $lv then {time: $m.time, adapter: $a,
                        engine: ($m.message.engine // 0), rank: $m.message.rank, level: $lv}
                      else null end)
            | .levels[$k] = $lv
        end;
        .out | select(. != null))'
