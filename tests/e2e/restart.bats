#!/usr/bin/env bats
# Runtime adapter state survives restarts. On a stack started with `lora-stack up` on a tiny model,
# an adapter is loaded at run time (law), a start-up one unloaded (sql) and one pinned (doc); then
# a worker, the engine or a frontend is killed with SIGKILL (a worker also stopped with SIGSTOP).
# Once the supervisor has restarted it (the only worker alone, the engine took it back),
# /v1/models, `lora-inspect residency --json` and the lora-metrics scrape show exactly the runtime
# state, and the supervisor's log says what it restarted and restored. Also: a corrupt registry
# file stops the engine with its path; an adapter whose directory has gone is dropped with a
# warning while the stack still starts; a start-up adapter added later is loaded. The scrape
# counts the start-up loads, which happen before the exporter subscribes. Every stack is
# brought down in teardown.

load ../helpers
bats_require_minimum_version 1.5.0

STACK="$LORA_BIN/lora-stack"
CLIENT="$PYTHON $ROOT/tests/ref/client.py"

setup_file() {
    export D=$BATS_FILE_TMPDIR
    make_model_and_adapters "$D" sql doc chat law new
}

setup() {
    for v in $(compgen -e); do
        case "$v" in LORA_*) [ "$v" = LORA_BIN ] || [ "$v" = LORA_BUILD ] ||
            [ "$v" = LORA_DEMO_DIR ] || unset "$v" ;; esac
    done
    RUNS=()
    # Six ports in a row that nothing listens on now (other test runs may share the host).
    BASE=$($PYTHON -c '
import random, socket, sys
for _ in range(200):
    base = random.randrange(30000, 60000, 10)
    try:
        socks = [socket.create_server(("127.0.0.1", base + i)) for i in range(6)]
    except OSError:
        continue
    for s in socks:
        s.close()
    print(base)
    sys.exit(0)
sys.exit(1)')
    R=$BATS_TEST_TMPDIR/run
}

teardown() {
    for r in "${RUNS[@]}"; do
        "$STACK" down --run-dir "$r" > /dev/null 2>&1 || true
    done
}

# The stack of every test: three start-up adapters, room for all of them in the CPU cache.
up() { # [OPTIONS]
    RUNS+=("$R")
    run --separate-stderr "$STACK" up --run-dir "$R" --port "$BASE" \
        --metrics-port $((BASE + 5)) --model "$D/m" \
        --lora-modules "sql=$D/sql" "doc=$D/doc" "chat=$D/chat" \
        --enable-runtime-lora --lora-root "$D" --max-loras 2 --max-cpu-loras 5 \
        --publish-interval-ms 200 "$@"
}

post() { # PATH BODY: the HTTP status
    curl -s -o "$BATS_TEST_TMPDIR/body" -w '%{http_code}' -m 30 \
        "http://127.0.0.1:$BASE$1" -H 'Content-Type: application/json' -d "$2"
}

complete() { post /v1/completions "{\"model\":\"$1\",\"prompt\":\"hi\",\"max_tokens\":2}"; }

pid_of() { awk -v n="$1" '$1 == n { print $2 }' "$R/pids"; }

# Loads law, unloads sql, pins doc: the runtime state the restarts must keep.
change_at_runtime() {
    [ "$(post /v1/load_lora_adapter "{\"lora_name\":\"law\",\"lora_path\":\"$D/law\"}")" = 200 ]
    [ "$(post /v1/unload_lora_adapter '{"lora_name":"sql"}')" = 200 ]
    $CLIENT control --run-dir "$R" pin doc > /dev/null
}

models() { # the adapters /v1/models lists, sorted, one line
    curl -sf -m 10 "http://127.0.0.1:$BASE/v1/models" |
        jq -r --arg base "$D/m" '[.data[].id | select(. != $base)] | sort | join(",")'
}

residency() { # registered adapters as name:pinned, sorted, one line
    "$LORA_BIN/lora-inspect" --run-dir "$R" residency --json |
        jq -rs '[.[] | select(.kind == "adapter" and .registered) |
                 "\(.adapter):\(.pinned)"] | unique | join(",")'
}

scraped() { # the adapters of vllm:lora_adapter_loaded as name:pinned, sorted, one line
    curl -sf -m 10 "http://127.0.0.1:$((BASE + 5))/metrics" |
        sed -n 's/^vllm:lora_adapter_loaded{.*adapter_name="\([^"]*\)".*pinned="\([a-z]*\)".*/\1:\2/p' |
        sort | paste -sd, -
}

# Waits up to 30 s until every view shows exactly the runtime state; fails showing them.
expect_runtime_state() {
    local m="" r="" s="" c=""
    for _ in $(seq 1 150); do
        m=$(models) r=$(residency) s=$(scraped) c=$(complete law)
        [ "$m" = "chat,doc,law" ] && [ "$r" = "chat:false,doc:true,law:false" ] &&
            [ "$s" = "chat:false,doc:true,law:false" ] && [ "$c" = 200 ] && break
        sleep 0.2
    done
    echo "models: $m; residency: $r; scrape: $s; completion for law: $c" >&2
    cat "$BATS_TEST_TMPDIR/body" >&2
    [ "$m" = "chat,doc,law" ]
    [ "$r" = "chat:false,doc:true,law:false" ]
    [ "$s" = "chat:false,doc:true,law:false" ]
    [ "$c" = 200 ]
    [ "$(complete sql)" = 404 ]
}

# Waits up to 20 s until the scrape counts $1 loads from disk in vllm:lora_adapter_load_seconds
# (one per rank) and $2 in lora_adapter_loads_total{level="cpu"} (one per adapter).
expect_load_counts() {
    local h="" c=""
    for _ in $(seq 1 100); do
        curl -sf -m 10 "http://127.0.0.1:$((BASE + 5))/metrics" > "$BATS_TEST_TMPDIR/scrape"
        h=$(sed -n 's/^vllm:lora_adapter_load_seconds_count{.*transition="load"} \(.*\)/\1/p' \
            "$BATS_TEST_TMPDIR/scrape")
        c=$(sed -n 's/^lora_adapter_loads_total{.*level="cpu"} \(.*\)/\1/p' "$BATS_TEST_TMPDIR/scrape")
        [ "$h" = "$1.0" ] && [ "$c" = "$2.0" ] && return 0
        sleep 0.2
    done
    echo "load_seconds_count{load} is '$h' (want $1), loads_total{cpu} '$c' (want $2)" >&2
    return 1
}

wait_restarted() { # TEXT: waits up to 60 s for the supervisor's log to say it
    wait_for_text "$R/supervisor.log" "$1" 60
}

# Seconds from now until a completion on adapter law answers 200 (at most 60 s).
seconds_to_serving() {
    local t0 t1
    t0=$(date +%s.%N)
    for _ in $(seq 1 1200); do
        [ "$(complete law)" = 200 ] && break
        sleep 0.05
    done
    t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{ printf "%.2f\n", $2 - $1 }'
}

@test "SIGKILL of the only worker: it restarts alone, the engine takes it back with the adapters" {
    up
    expect_status 0
    # The exporter subscribed after the engine's start-up loads and counts them all the same.
    expect_load_counts 3 3
    change_at_runtime
    expect_runtime_state
    expect_load_counts 4 4
    local engine
    engine=$(pid_of engine)
    kill -KILL "$(pid_of worker-0)"
    s=$(seconds_to_serving)
    echo "SIGKILL of worker-0: serving again after $s s" >&3
    awk -v s="$s" 'BEGIN { exit !(s < 10) }'
    wait_restarted "restarted worker-0 alone; the engine took it back: restored 3 adapters: "
    expect_runtime_state
    # The same engine: no group restart.
    [ "$(pid_of engine)" = "$engine" ]
    ! grep -q "restarted the engine" "$R/supervisor.log"
}

@test "SIGSTOP of the only worker: declared dead after 3 s, killed, restarted alone" {
    up
    expect_status 0
    change_at_runtime
    expect_runtime_state
    local engine old
    engine=$(pid_of engine) old=$(pid_of worker-0)
    kill -STOP "$old"
    s=$(seconds_to_serving)
    echo "SIGSTOP of worker-0: serving again after $s s" >&3
    awk -v s="$s" 'BEGIN { exit !(s < 15) }'
    wait_restarted "restarted worker-0 alone; the engine took it back"
    ! is_running "$old"
    expect_runtime_state
    [ "$(pid_of engine)" = "$engine" ]
}

@test "SIGKILL of a worker of two ranks: the engine group comes back with the runtime adapters" {
    up --tp 2
    expect_status 0
    change_at_runtime
    expect_runtime_state
    kill -KILL "$(pid_of worker-1)"
    s=$(seconds_to_serving)
    echo "SIGKILL of worker-1 of 2: serving again after $s s" >&3
    awk -v s="$s" 'BEGIN { exit !(s < 15) }'
    wait_restarted "restarted the engine and its 2 ranks after worker-1 exited; restored: 3 adapters from '$R/adapters.json': doc (pinned), chat, law"
    expect_runtime_state
}

@test "SIGKILL of the engine: it restores the registry before it reports ready" {
    up --tp 2
    expect_status 0
    change_at_runtime
    kill -KILL "$(pid_of engine)"
    wait_restarted "restarted the engine and its 2 ranks after engine exited; restored: 3 adapters"
    expect_runtime_state
    expect_load_counts 6 3
    # Every rank holds the restored adapters.
    [ "$("$LORA_BIN/lora-inspect" --run-dir "$R" residency --json |
        jq -s '[.[] | select(.kind == "adapter" and .agree)] | length')" -eq 6 ]
}

@test "SIGKILL of a frontend: the new one learns the runtime registry from the engine" {
    up
    expect_status 0
    change_at_runtime
    kill -KILL "$(pid_of frontend-0)"
    wait_restarted "restarted frontend-0"
    expect_runtime_state
}

@test "a corrupt registry file: the engine refuses to start and names it" {
    mkdir -m 700 "$R"
    echo '{"version": 1, "adapters": [' > "$R/adapters.json"
    up
    expect_status 111
    grep -q "lora-engine: fatal: unable to restore the adapter registry: $R/adapters.json: invalid JSON" \
        "$R/logs/engine.log"
    # Never replaced by the start-up adapters.
    [ "$(cat "$R/adapters.json")" = '{"version": 1, "adapters": [' ]
}

@test "down and up again: runtime state kept, a vanished adapter dropped, a new start-up one added" {
    cp -r "$D/law" "$D/law-copy"
    up
    expect_status 0
    [ "$(post /v1/load_lora_adapter "{\"lora_name\":\"gone\",\"lora_path\":\"$D/law-copy\"}")" = 200 ]
    change_at_runtime
    run "$STACK" down --run-dir "$R"
    expect_status 0
    rm -r "$D/law-copy"
    up --lora-modules "new=$D/new"
    expect_status 0
    [ "$(models)" = "chat,doc,law,new" ]
    grep -q "lora-stack: started the engine; restored: 3 adapters from '$R/adapters.json': doc (pinned), chat, law" \
        "$R/supervisor.log"
    grep -q "adapter 'gone' at '$D/law-copy' cannot be restored and is dropped from the registry" \
        "$R/logs/engine.log"
    grep -q "start-up adapter 'sql' stays unloaded" "$R/logs/engine.log"
    # The file says what the engine holds now, in the order of registration.
    [ "$(jq -r '[.adapters[] | .name] | join(",")' "$R/adapters.json")" = "doc,chat,law,new" ]
}
