#!/usr/bin/env bats
# The command line of lora-inspect: help, version and usage errors (exit 100) for every command;
# residency, stats, config, health and events against real engines (one rank, and two ranks)
# started once for the file; the four output formats; decode of good, malformed and truncated
# input; quiet pipes; an engine that does not answer (exit 111); and, against a stand-in for the
# control socket (tests/ref/inspect_fake_control.py), heartbeats while a reply is late, a reply
# for another id, and an unhealthy engine. Processes started in the background are recorded in
# pid files and killed in teardown, whatever happened.

load ../helpers
bats_require_minimum_version 1.5.0

INSPECT="$LORA_BIN/lora-inspect"
ENGINE="$LORA_BIN/lora-engine"
MAN="$ROOT/man/lora-inspect.1"
FAKE="$PYTHON $ROOT/tests/ref/inspect_fake_control.py"
CLIENT="$PYTHON $ROOT/tests/ref/client.py"
COMMANDS="residency events stats config health decode"

# Starts an engine on run directory $1 with extra options "$@" (after $1), its log in $1.err.
start_engine() {
    local run=$1
    shift
    mkdir -p "$run"
    chmod 700 "$run"
    "$ENGINE" --model "$D/m" --run-dir "$run" --max-loras 1 --max-cpu-loras 2 \
        --lora-modules "a=$D/a" --lora-modules "b=$D/b" --publish-interval-ms 200 "$@" \
        > "$run.out" 2> "$run.err" 3>&- &
    echo $! >> "$D/pids"
}

# Starts worker rank $2 on the engine of run directory $1.
start_worker() {
    "$WORKER" serve --engine "ipc://$1/worker.sock" --rank "$2" > "$1.worker$2.log" 2>&1 3>&- &
    echo $! >> "$D/pids"
}

setup_file() {
    export D=$BATS_FILE_TMPDIR
    : > "$D/pids"
    "$WORKER" make-model --out "$D/m"
    "$WORKER" make-adapter --model "$D/m" --out "$D/a" --rank 4 --seed 1
    "$WORKER" make-adapter --model "$D/m" --out "$D/b" --rank 4 --seed 2
    export RUN1=$D/run1 RUN2=$D/run2
    start_engine "$RUN1"
    start_worker "$RUN1" 0
    start_engine "$RUN2" --tensor-parallel-size 2
    start_worker "$RUN2" 0
    start_worker "$RUN2" 1
    wait_for_text "$RUN1.err" "lora-engine: ready: engine 0, 1 rank," 20
    wait_for_text "$RUN2.err" "lora-engine: ready: engine 0, 2 ranks," 20
}

# SIGTERM first: the engines exit 0 and take their workers with them; whatever is left after
# 5 s is killed.
teardown_file() {
    stop_pids "$D/pids"
}

setup() {
    # A mirror variable left in the caller's environment would change what every test sees.
    for v in $(compgen -e); do
        case "$v" in LORA_INSPECT_*) unset "$v" ;; esac
    done
    PIDS=$BATS_TEST_TMPDIR/pids
    : > "$PIDS"
    T=$BATS_TEST_TMPDIR
}

teardown() {
    local pid
    while read -r pid; do
        kill -KILL "$pid" 2> /dev/null || true
    done < "$PIDS"
}

# The options a command's --help lists, one per line, sorted.
help_options() {
    "$INSPECT" "$1" --help | sed -n 's/^  \(--[a-z][a-z-]*\).*/\1/p' | sort
}

# The options the man page's OPTIONS section names for command $1 (in its ".SS $1" part).
man_options() {
    sed 's/\\-/-/g' "$MAN" | awk -v cmd="$1" '
        /^\.SH/ { in_opts = ($2 == "OPTIONS"); sub_ok = 0; next }
        in_opts && /^\.SS/ { sub_ok = index($0, cmd) > 0 || index($0, "every command") > 0; next }
        in_opts && sub_ok && /^\.TP/ { tp = 1; next }
        in_opts && sub_ok && tp {
            tp = 0
            if (match($0, /--[a-z][a-z-]*/))
                print substr($0, RSTART, RLENGTH)
        }
    ' | sort -u
}

# Fails unless every line of $1 is a JSON object with "version": 1 and a string "kind".
expect_records() {
    local bad
    bad=$(printf '%s\n' "$1" | jq -c 'select(.version != 1 or (.kind | type) != "string")') || {
        echo "not JSON lines: $1" >&2
        return 1
    }
    [ -z "$bad" ] || {
        echo "records without version 1 and a kind: $bad" >&2
        return 1
    }
}

# ---- help, version, usage errors

@test "--help lists every command on stdout; --version prints one line; both exit 0" {
    run --separate-stderr "$INSPECT" --help
    expect_status 0
    [ -z "$stderr" ]
    [[ "${lines[0]}" == "usage: lora-inspect "* ]]
    for c in $COMMANDS; do
        [[ "$output" == *"  $c "* ]] || { echo "--help lacks $c" >&2; return 1; }
    done
    run --separate-stderr "$INSPECT" --version
    expect_status 0
    [ -z "$stderr" ]
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" =~ ^lora-inspect\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
}

@test "no command, an unknown one, or a leading option that is not a connection option: 100" {
    run --separate-stderr "$INSPECT"
    expect_status 100
    expect_message "usage: lora-inspect"
    run --separate-stderr "$INSPECT" bogus
    expect_status 100
    expect_message "unknown command 'bogus'"
    run --separate-stderr "$INSPECT" --json residency
    expect_status 100
    expect_message "option '--json' must follow the command"
    run --separate-stderr "$INSPECT" --run-dir "$RUN1"
    expect_status 100
    expect_message "no command given"
}

@test "every command: --help and -h print its options on stdout and exit 0" {
    for c in $COMMANDS; do
        for flag in --help -h; do
            run --separate-stderr "$INSPECT" "$c" "$flag"
            expect_status 0
            [ -z "$stderr" ]
            [[ "${lines[0]}" == "usage: lora-inspect $c"* ]]
            for o in --json --tsv --msgpack --table --help; do
                [[ "$output" == *"  $o "* ]] || { echo "$c $flag lacks $o" >&2; return 1; }
            done
        done
    done
    for c in residency stats config health; do
        for o in --run-dir --control-endpoint --timeout-ms; do
            [[ "$("$INSPECT" "$c" --help)" == *"  $o "* ]] || { echo "$c lacks $o" >&2; return 1; }
        done
    done
    for o in --run-dir --publish-endpoint --timeout-ms --follow --topic --publish-interval-ms; do
        [[ "$("$INSPECT" events --help)" == *"  $o "* ]] || {
            echo "events lacks $o" >&2
            return 1
        }
    done
}

@test "every command: an unknown option, a positional argument, two formats: exit 100, no stdout" {
    for c in $COMMANDS; do
        run --separate-stderr "$INSPECT" "$c" --bogus
        expect_status 100
        expect_message "unknown option '--bogus'"
        run --separate-stderr "$INSPECT" "$c" extra
        expect_status 100
        expect_message "unexpected argument 'extra'"
        run --separate-stderr "$INSPECT" "$c" --json --tsv
        expect_status 100
        expect_message "--json and --tsv cannot be used together"
    done
}

@test "usage errors: no endpoint, bad numbers, an unknown topic, a bad mirror variable" {
    export XDG_RUNTIME_DIR=$BATS_TEST_TMPDIR # holds no lora-stack run directory
    for c in residency stats config health; do
        run --separate-stderr "$INSPECT" "$c"
        expect_status 100
        expect_message "needs --run-dir DIR or --control-endpoint EP"
        run --separate-stderr "$INSPECT" "$c" --run-dir "$RUN1" --timeout-ms 0
        expect_status 100
        expect_message "--timeout-ms must be an integer"
    done
    run --separate-stderr "$INSPECT" events
    expect_status 100
    expect_message "needs --run-dir DIR or --publish-endpoint EP"
    run --separate-stderr "$INSPECT" events --run-dir "$RUN1" --topic bogus
    expect_status 100
    expect_message "--topic 'bogus' must be one of"
    run --separate-stderr "$INSPECT" events --run-dir "$RUN1" --publish-interval-ms 5
    expect_status 100
    expect_message "--publish-interval-ms"
    LORA_INSPECT_TIMEOUT_MS=soon run --separate-stderr "$INSPECT" stats --run-dir "$RUN1"
    expect_status 100
    expect_message "LORA_INSPECT_TIMEOUT_MS --timeout-ms must be an integer"
    LORA_INSPECT_JSON=1 LORA_INSPECT_TSV=1 run --separate-stderr "$INSPECT" decode < /dev/null
    expect_status 100
    expect_message "LORA_INSPECT_JSON and LORA_INSPECT_TSV are set together"
}

@test "the man page documents every option of every command, and its sections" {
    for c in $COMMANDS; do
        diff <(help_options "$c") <(man_options "$c") || {
            echo "--help of $c (<) and man page OPTIONS (>) differ" >&2
            return 1
        }
    done
    for s in NAME SYNOPSIS DESCRIPTION COMMANDS OPTIONS OUTPUT "EXIT STATUS" EXAMPLES "SEE ALSO"; do
        grep -q "^\.SH \"\?$s\"\?$" "$MAN" || { echo "no section $s" >&2; return 1; }
    done
}

# ---- residency

@test "residency --json: a record per adapter, gpu in slot 0 and cpu, then rank and engine" {
    run --separate-stderr "$INSPECT" residency --run-dir "$RUN1" --json
    expect_status 0
    [ -z "$stderr" ]
    expect_records "$output"
    [ "$(jq -s '[.[] | select(.kind == "adapter")] | length' <<< "$output")" -eq 2 ]
    local ads
    ads=$(jq -s -c 'map(select(.kind == "adapter"))' <<< "$output")
    [ "$(jq -c 'map(.adapter) | sort' <<< "$ads")" = '["a","b"]' ]
    [ "$(jq -c 'map(.level) | sort' <<< "$ads")" = '["cpu","gpu"]' ]
    [ "$(jq -c 'map(select(.level == "gpu") | .slot)' <<< "$ads")" = '[0]' ]
    [ "$(jq -c 'map(select(.level == "cpu") | .slot)' <<< "$ads")" = '[-1]' ]
    jq -e -s 'map(select(.kind == "adapter")) | all(.engine == 0 and .rank == 0 and .agree == true
        and .pinned == false and .registered == true and (.path | type) == "string"
        and .running == 0 and .waiting == 0 and (.last_used_step | type) == "number")' <<< "$output"
    jq -e -s 'map(select(.kind == "rank")) | length == 1 and .[0].rank == 0 and .[0].slots == 1
        and .[0].slots_used == 1 and .[0].cpu == 2 and .[0].dropped == 0' <<< "$output"
    jq -e -s 'map(select(.kind == "engine")) | length == 1 and .[0].world_size == 1
        and .[0].registered == 2 and .[0].disagreement == 0' <<< "$output"
}

@test "without --run-dir or an endpoint, lora-stack's default run directory is used" {
    mkdir "$BATS_TEST_TMPDIR/xdg"
    ln -s "$RUN1" "$BATS_TEST_TMPDIR/xdg/lora-stack"
    XDG_RUNTIME_DIR=$BATS_TEST_TMPDIR/xdg run --separate-stderr "$INSPECT" residency --json
    expect_status 0
    [ "$output" = "$("$INSPECT" residency --json --run-dir "$RUN1")" ]
    XDG_RUNTIME_DIR=$BATS_TEST_TMPDIR/xdg run --separate-stderr "$INSPECT" config --json
    expect_status 0
    [[ "$output" == *'"kind":"config"'* ]]
}

@test "residency in a pipe writes JSON lines without a flag; the connection option may lead" {
    run --separate-stderr "$INSPECT" --run-dir "$RUN1" residency
    expect_status 0
    expect_records "$output"
    LORA_INSPECT_RUN_DIR=$RUN1 run --separate-stderr "$INSPECT" residency
    expect_status 0
    expect_records "$output"
    # A format flag on the command line wins over the environment's.
    LORA_INSPECT_JSON=1 run --separate-stderr "$INSPECT" residency --run-dir "$RUN1" --tsv
    expect_status 0
    [[ "${lines[0]}" == engine$'\t'rank$'\t'* ]]
}

@test "residency --table: aligned columns under a header, then the engine and rank summary" {
    run --separate-stderr "$INSPECT" residency --run-dir "$RUN1" --table
    expect_status 0
    local names="ENGINE RANK ADAPTER LEVEL SLOT PINNED AGREE LAST_USED_STEP RUNNING WAITING"
    [[ "${lines[0]}" =~ ^${names// /\ +}$ ]]
    [ "${#lines[@]}" -eq 5 ]
    # Every row's fields start where the header's names do.
    local header=${lines[0]} row col
    for row in "${lines[1]}" "${lines[2]}"; do
        for col in RANK ADAPTER LEVEL SLOT PINNED AGREE LAST_USED_STEP RUNNING WAITING; do
            local prefix=${header%%"$col"*} at
            at=${#prefix}
            [ "${row:at-1:1}" = " " ] && [ "${row:at:1}" != " " ] || {
                echo "column $col misaligned in '$row'" >&2
                return 1
            }
        done
    done
    [ "${lines[3]}" = "engine 0: 1 rank, 2 adapters registered, 0 in disagreement between ranks" ]
    [ "${lines[4]}" = "rank 0: 1 of 1 slots used, 2 in the CPU cache, 0 pinned, 0 notifications \
dropped" ]
}

@test "residency --tsv: the header and ten tab-separated fields per adapter" {
    run --separate-stderr "$INSPECT" residency --run-dir "$RUN1" --tsv
    expect_status 0
    local header="engine rank adapter level slot pinned agree last_used_step running waiting"
    [ "${lines[0]}" = "${header// /$'\t'}" ]
    [ "${#lines[@]}" -eq 3 ]
    [ "$(printf '%s\n' "${lines[@]:1}" | awk -F'\t' 'NF == 10' | wc -l)" -eq 2 ]
    [ "$(printf '%s\n' "${lines[@]:1}" | cut -f4 | sort | tr '\n' ' ')" = "cpu gpu " ]
}

@test "residency --msgpack writes the reply's map, which decode reads back" {
    "$INSPECT" residency --run-dir "$RUN1" --msgpack > "$T/res.mp"
    # One msgpack map: fixmap of the reply's four keys.
    [ "$(head -c 1 "$T/res.mp" | od -An -tx1 | tr -d ' ')" = 84 ]
    run --separate-stderr "$INSPECT" decode --json < "$T/res.mp"
    expect_status 0
    [ "${#lines[@]}" -eq 1 ]
    expect_records "$output"
    jq -e '.kind == "message" and .offset == 0 and .type == null
        and (.message.adapters | map(.name) | sort) == ["a", "b"]
        and (.message.ranks | length) == 1 and .message.disagreement == 0' <<< "$output"
}

@test "two ranks: residency gives each adapter on each rank, agreeing; pin shows on both" {
    run --separate-stderr "$INSPECT" residency --run-dir "$RUN2" --json
    expect_status 0
    expect_records "$output"
    jq -e -s 'map(select(.kind == "adapter")) | length == 4
        and (map(.rank) | sort) == [0, 0, 1, 1] and all(.agree)
        and (map(select(.adapter == "a") | .level) | unique | length) == 1' <<< "$output"
    jq -e -s 'map(select(.kind == "rank")) | map(.rank) == [0, 1]' <<< "$output"
    jq -e -s 'map(select(.kind == "engine")) | .[0].world_size == 2' <<< "$output"
    $CLIENT control --run-dir "$RUN2" pin a
    run --separate-stderr "$INSPECT" residency --run-dir "$RUN2" --json
    expect_status 0
    jq -e -s 'map(select(.kind == "adapter" and .adapter == "a")) | length == 2
        and all(.pinned and .level == "gpu" and .slot == 0 and .agree)' <<< "$output"
    jq -e -s 'map(select(.kind == "adapter" and .adapter == "b")) | all(.pinned == false
        and .level == "cpu")' <<< "$output"
    jq -e -s 'map(select(.kind == "rank")) | all(.pinned == 1)' <<< "$output"
    jq -e -s 'map(select(.kind == "engine")) | .[0].disagreement == 0' <<< "$output"
}

# ---- events

@test "events without --follow: exits 0 after a full state publication, records with topic" {
    SECONDS=0
    run --separate-stderr timeout -s KILL 20 "$INSPECT" events --run-dir "$RUN1" --json
    expect_status 0
    [ "$SECONDS" -le 3 ]
    [ -z "$stderr" ]
    expect_records "$output"
    jq -e -s 'all(.kind == "message" and (.topic | type) == "string" and (.time | type) == "number"
        and (.message | type) == "object" and .type == .message.type)' <<< "$output"
    local topics
    topics=$(jq -r -s 'map(.topic) | unique | join(" ")' <<< "$output")
    [ "$topics" = "config registry residency stats" ]
    jq -e -s 'map(select(.topic == "config")) | .[0].message.limits.world_size == 1
        and .[0].type == "ready"' <<< "$output"
}

@test "events on two ranks waits for the residency of both" {
    run --separate-stderr timeout -s KILL 20 "$INSPECT" events --run-dir "$RUN2" --topic residency
    expect_status 0
    jq -e -s 'all(.topic == "residency") and (map(.message.rank) | unique) == [0, 1]' <<< "$output"
}

@test "events --topic narrows to exactly that topic; --tsv and --table have a header" {
    run --separate-stderr timeout -s KILL 20 "$INSPECT" events --run-dir "$RUN1" --topic stats
    expect_status 0
    [ "${#lines[@]}" -ge 1 ]
    jq -e -s 'all(.topic == "stats" and .message.type == "stats")' <<< "$output"
    run --separate-stderr timeout -s KILL 20 "$INSPECT" events --run-dir "$RUN1" --tsv
    expect_status 0
    [ "${lines[0]}" = "$(printf 'time\ttopic\ttype\tsummary')" ]
    [[ "${lines[1]}" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$'\t'[a-z]+$'\t'[a-z_]+$'\t' ]]
    run --separate-stderr timeout -s KILL 20 "$INSPECT" events --run-dir "$RUN1" --table \
        --topic residency
    expect_status 0
    [[ "${lines[0]}" =~ ^TIME\ +TOPIC\ +TYPE\ +SUMMARY$ ]]
    [[ "${lines[1]}" == *"residency      residency_reply  rank 0 slots ["?"] cpu [a,b] pinned []" ]]
}

@test "events --follow: request events as they happen; SIGTERM and SIGINT exit 0" {
    "$INSPECT" events --run-dir "$RUN1" --follow > "$T/ev.out" 2> "$T/ev.err" 3>&- &
    local pid=$!
    echo "$pid" >> "$PIDS"
    # Subscribed once the first state publication arrives; events before that would be lost.
    wait_for_text "$T/ev.out" '"topic":"config"' 10
    echo '{"prompt_ids":[1,2,3],"max_tokens":3,"lora":"a"}' > "$T/batch.jsonl"
    $CLIENT generate --run-dir "$RUN1" --batch "$T/batch.jsonl" > /dev/null
    wait_for_text "$T/ev.out" '"FINISHED"' 10
    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ]
    [ ! -s "$T/ev.err" ]
    local events
    events=$(jq -r -s 'map(select(.topic == "event") | .message.event) | join(" ")' "$T/ev.out")
    [ "$events" = "QUEUED SCHEDULED FINISHED" ]
    jq -e -s 'map(select(.topic == "event")) | all(.type == "event" and .message.lora == "a")' \
        "$T/ev.out"
    "$INSPECT" events --run-dir "$RUN1" --follow > "$T/ev2.out" 2> "$T/ev2.err" 3>&- &
    pid=$!
    echo "$pid" >> "$PIDS"
    wait_for_text "$T/ev2.out" '"topic":"config"' 10
    kill -INT "$pid"
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ]
    [ ! -s "$T/ev2.err" ]
}

@test "events --follow: a silent engine is reported once on stderr, and its return noted" {
    "$INSPECT" events --run-dir "$RUN1" --follow --publish-interval-ms 200 --topic config \
        > "$T/ev.out" 2> "$T/ev.err" 3>&- &
    local pid=$! engine
    echo "$pid" >> "$PIDS"
    wait_for_text "$T/ev.out" '"topic":"config"' 10
    # Frozen for 1.2 s: over 3 intervals of 200 ms, under the workers' 3 s liveness limit.
    engine=$(head -1 "$D/pids")
    kill -STOP "$engine"
    sleep 1.2
    kill -CONT "$engine"
    wait_for_text "$T/ev.err" "again after" 5
    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ]
    local warning="lora-inspect: warning: no message from 'ipc://$RUN1/publish.sock' for"
    [ "$(grep -c "$warning" "$T/ev.err")" -eq 1 ]
    grep -q "still waiting" "$T/ev.err"
    grep -q "lora-inspect: note: messages from 'ipc://$RUN1/publish.sock' again after" "$T/ev.err"
    run "$INSPECT" health --run-dir "$RUN1"
    expect_status 0
}

@test "events --msgpack writes only the maps; decode reads them back and passes them on" {
    timeout -s KILL 20 "$INSPECT" events --run-dir "$RUN1" --msgpack > "$T/cap.mp"
    # Nothing but msgpack maps: decode accounts for every byte.
    run --separate-stderr "$INSPECT" decode < "$T/cap.mp"
    expect_status 0
    expect_records "$output"
    jq -e -s 'all(.kind == "message") and (map(.type) | index("ready") != null)
        and (map(.type) | index("residency_reply") != null) and .[0].offset == 0' <<< "$output"
    [ "$(jq -s 'length' <<< "$output")" -ge 4 ]
    "$INSPECT" decode --msgpack < "$T/cap.mp" > "$T/again.mp"
    cmp "$T/cap.mp" "$T/again.mp"
    run bash -c "'$INSPECT' events --run-dir '$RUN1' --msgpack | '$INSPECT' decode --tsv"
    expect_status 0
    [ "${lines[0]}" = "$(printf 'offset\ttype\tsummary')" ]
    [[ "$output" == *$'\t'ready$'\t'* ]]
}

# ---- stats, config, health

@test "stats and config: one record each, as JSON, TSV and a key/value table" {
    run --separate-stderr "$INSPECT" stats --run-dir "$RUN1"
    expect_status 0
    [ "${#lines[@]}" -eq 1 ]
    expect_records "$output"
    jq -e '.kind == "stats" and .running == 0 and .waiting == 0 and .num_kv_blocks > 0
        and .free_blocks == .num_kv_blocks and .num_preemptions == 0' <<< "$output"
    run --separate-stderr "$INSPECT" stats --run-dir "$RUN1" --tsv
    expect_status 0
    [ "${#lines[@]}" -eq 2 ]
    [ "${lines[0]}" = "$(printf 'running\twaiting\tfree_blocks\tnum_kv_blocks\tnum_preemptions')" ]
    run --separate-stderr "$INSPECT" config --run-dir "$RUN2" --json
    expect_status 0
    jq -e '.kind == "config" and .world_size == 2 and .max_loras == 1 and .max_cpu_loras == 2
        and (.model | endswith("/m")) and .engine_index == 0' <<< "$output"
    run --separate-stderr "$INSPECT" config --run-dir "$RUN1" --table
    expect_status 0
    [[ "${lines[0]}" =~ ^KEY\ +VALUE$ ]]
    [[ "$output" == *$'\n'"max_loras               1"$'\n'* ]]
    "$INSPECT" config --run-dir "$RUN1" --msgpack | "$INSPECT" decode |
        jq -e '.message.max_cpu_loras == 2'
}

@test "health: exit 0 and a healthy record; exit 111 when no engine answers in time" {
    run --separate-stderr "$INSPECT" health --run-dir "$RUN1"
    expect_status 0
    [ -z "$stderr" ]
    jq -e '.version == 1 and .kind == "health" and .healthy == true and .reason == ""
        and .workers == 1' <<< "$output"
    mkdir -m 700 "$T/none"
    SECONDS=0
    for c in health residency stats config; do
        run --separate-stderr "$INSPECT" "$c" --run-dir "$T/none" --timeout-ms 200
        expect_status 111
        expect_message "unable to reach the engine at 'ipc://$T/none/control.sock' within 200 ms"
    done
    run --separate-stderr "$INSPECT" events --run-dir "$T/none" --timeout-ms 200
    expect_status 111
    expect_message "unable to hear from the engine at 'ipc://$T/none/publish.sock' within 200 ms"
    run --separate-stderr "$INSPECT" events --run-dir "$T/none" --timeout-ms 200 --follow
    expect_status 111
    [ "$SECONDS" -le 8 ]
}

@test "a late reply: heartbeats while waiting, a reply for another id skipped, escaped TSV" {
    mkdir -m 700 "$T/fake"
    $FAKE --endpoint "ipc://$T/fake/control.sock" --report "$T/report.json" --delay-s 1.2 \
        --wrong-id-first 2> "$T/fake.err" 3>&- &
    echo $! >> "$PIDS"
    wait_for_text "$T/fake.err" ready 10
    run --separate-stderr "$INSPECT" stats --run-dir "$T/fake" --tsv
    expect_status 0
    [ "${lines[1]}" = "$(printf '0\t0\ttab\\there\\nnewline')" ]
    wait_for_text "$T/report.json" heartbeats 5
    jq -e '.op == "stats" and .heartbeats >= 2 and .frames_ok' "$T/report.json"
}

@test "an unhealthy engine: exit 1, the reason on stderr and in the record" {
    mkdir -m 700 "$T/fake"
    $FAKE --endpoint "ipc://$T/fake/control.sock" --report "$T/report.json" \
        --unhealthy "worker 1 is gone" 2> "$T/fake.err" 3>&- &
    echo $! >> "$PIDS"
    wait_for_text "$T/fake.err" ready 10
    run --separate-stderr "$INSPECT" health --run-dir "$T/fake"
    expect_status 1
    [[ "$stderr" == *"is unhealthy: worker 1 is gone"* ]]
    jq -e '.kind == "health" and .healthy == false and .reason == "worker 1 is gone"' <<< "$output"
    wait_for_text "$T/report.json" heartbeats 5
    jq -e '.op == "health" and .frames_ok' "$T/report.json"
}

# ---- decode

@test "decode: a bad byte, a map cut short, a non-map, a huge header: exit 1 naming the offset" {
    "$INSPECT" config --run-dir "$RUN1" --msgpack > "$T/one.mp"
    local n
    n=$(stat -c %s "$T/one.mp")
    { cat "$T/one.mp"; printf '\x81\xa1k\xc1'; } > "$T/bad.mp"
    run --separate-stderr "$INSPECT" decode < "$T/bad.mp"
    expect_status 1
    [ "${#lines[@]}" -eq 1 ]
    jq -e '.offset == 0 and .message.max_loras == 1' <<< "$output"
    local prefix="lora-inspect: fatal: unable to decode standard input"
    [ "$stderr" = "$prefix: message 2 at byte $n: byte 0xc1 at byte $((n + 3)) is not msgpack" ]
    { cat "$T/one.mp"; head -c 10 "$T/one.mp"; } > "$T/cut.mp"
    run --separate-stderr "$INSPECT" decode < "$T/cut.mp"
    expect_status 1
    [ "${#lines[@]}" -eq 1 ]
    [[ "$stderr" == *"message 2 at byte $n: truncated: the input ends after 10 of its bytes" ]]
    run --separate-stderr "$INSPECT" decode < <(printf '\x93\x01\x02\x03')
    expect_status 1
    expect_message "message 1 at byte 0: not a msgpack map (it starts with byte 0x93)"
    # A map that declares 2^32-1 entries in five bytes: refused without allocating for them.
    run --separate-stderr "$INSPECT" decode < <(printf '\xdf\xff\xff\xff\xff')
    expect_status 1
    expect_message "message 1 at byte 0: larger than 16777216 bytes (LORA_MSG_MAX_BODY)"
    run --separate-stderr "$INSPECT" decode < /dev/null
    expect_status 0
    [ -z "$output" ] && [ -z "$stderr" ]
}

@test "decode: maps nested as map keys are refused in linear time, a NUL key reads back, depth past 32 is an error" {
    # 77 bytes: 30 maps of one entry, each the key of the one before, then a 16-byte string
    # key and the values. Each level's key is the JSON text of the next, escaped once more, so
    # the text doubles with every level unless container keys inside container keys are refused.
    { for i in $(seq 30); do printf '\x81'; done
      printf '\xb00123456789abcdef'
      for i in $(seq 30); do printf '\x00'; done; } > "$T/keys.mp"
    [ "$(stat -c %s "$T/keys.mp")" -eq 77 ]
    # A generous bound for a loaded machine; the exponential version ran for 30 s and 2.6 GB.
    run --separate-stderr timeout 20 bash -c 'ulimit -v 1000000; "$0" decode --json' \
        "$INSPECT" < "$T/keys.mp"
    expect_status 1
    [ -z "$output" ]
    local why="a map or array as a map key inside a map or array key"
    [[ "$stderr" == *"message 1 at byte 0: message: body: $why"* ]]
    # one level of map keys decodes, its key written as JSON text
    printf '\x82\xa4type\xa1x\x81\x01\x02\x03' > "$T/key1.mp"
    run --separate-stderr "$INSPECT" decode --json < "$T/key1.mp"
    expect_status 0
    jq -e '.message["{\"1\":2}"] == 3' <<< "$output"
    # a NUL in a key (found by fuzzing): it used to end decode with "out of memory"
    printf '\x82\xa4type\xa1x\xa3a\x00b\x01' > "$T/nul.mp"
    run --separate-stderr "$INSPECT" decode --json < "$T/nul.mp"
    expect_status 0
    jq -e '.message["a\ufffdb"] == 1' <<< "$output"
    # 33 nested arrays under a map: one level past the bound
    { printf '\x81\xa1k'; for i in $(seq 32); do printf '\x91'; done; printf '\x00'; } > "$T/deep.mp"
    run --separate-stderr "$INSPECT" decode --json < "$T/deep.mp"
    expect_status 1
    [[ "$stderr" == *"nested too deeply (more than 32 levels)"* ]]
}

@test "decode --tsv and --table escape tabs and newlines in values" {
    # {"type": "a<TAB>b<LF>c"}
    printf '\x81\xa4type\xa5a\tb\nc' > "$T/esc.mp"
    run --separate-stderr "$INSPECT" decode --tsv < "$T/esc.mp"
    expect_status 0
    [ "${#lines[@]}" -eq 2 ]
    [ "${lines[1]}" = "$(printf '0\ta\\tb\\nc\t')" ]
    run --separate-stderr "$INSPECT" decode --table < "$T/esc.mp"
    expect_status 0
    [ "${#lines[@]}" -eq 2 ]
    [[ "${lines[1]}" == '0           a\tb\nc'* ]]
    run --separate-stderr "$INSPECT" decode --json < "$T/esc.mp"
    jq -e '.type == "a\tb\nc" and .message.type == "a\tb\nc"' <<< "$output"
}

# ---- pipes

@test "| head -1 ends quietly: residency, events --follow and decode" {
    run bash -c "'$INSPECT' residency --run-dir '$RUN2' 2> '$T/err1' | head -1
        echo \"\${PIPESTATUS[0]}\""
    [ "${#lines[@]}" -eq 2 ]
    jq -e '.kind == "adapter"' <<< "${lines[0]}"
    [ "${lines[1]}" -eq 0 ]
    [ ! -s "$T/err1" ]
    run timeout -s KILL 20 bash -c "'$INSPECT' events --run-dir '$RUN1' --follow 2> '$T/err2' |
        head -1; echo \"\${PIPESTATUS[0]}\""
    [ "${#lines[@]}" -eq 2 ]
    [ "${lines[1]}" -eq 0 ]
    [ ! -s "$T/err2" ]
    "$INSPECT" events --run-dir "$RUN1" --msgpack > "$T/cap.mp"
    run bash -c "for i in 1 2 3 4 5 6 7 8; do cat '$T/cap.mp'; done |
        '$INSPECT' decode --table 2> '$T/err3' | head -1; echo \"\${PIPESTATUS[1]}\""
    [ "${lines[0]}" = "OFFSET      TYPE              SUMMARY" ]
    [ "${lines[1]}" -eq 0 ]
    [ ! -s "$T/err3" ]
}
