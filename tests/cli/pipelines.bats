#!/usr/bin/env bats
# The shell pipelines of examples/pipelines (lora-inspect and jq) against a real engine of two
# ranks, one of which is told to ignore adding adapter "c" (LORA_WORKER_TEST_IGNORE_ADD), so that
# the disagreement alert has something to find. Expected values come from the test's own reading
# of `lora-inspect residency --json` in Python and from the requests it sends itself.

load ../helpers
bats_require_minimum_version 1.5.0

EX="$ROOT/examples/pipelines"
CLIENT="$PYTHON $ROOT/tests/ref/client.py"
export LORA_INSPECT="$LORA_BIN/lora-inspect"

setup_file() {
    export D=$BATS_FILE_TMPDIR RUN=$BATS_FILE_TMPDIR/run
    : > "$D/pids"
    make_model_and_adapters "$D" a b c
    mkdir -m 700 "$RUN"
    "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$RUN" --tensor-parallel-size 2 \
        --max-loras 1 --max-cpu-loras 3 --lora-modules "a=$D/a" --lora-modules "b=$D/b" \
        --publish-interval-ms 200 > "$D/engine.out" 2> "$D/engine.err" 3>&- &
    echo $! >> "$D/pids"
    "$WORKER" serve --engine "ipc://$RUN/worker.sock" --rank 0 > "$D/w0.log" 2>&1 3>&- &
    echo $! >> "$D/pids"
    LORA_WORKER_TEST_IGNORE_ADD=c "$WORKER" serve --engine "ipc://$RUN/worker.sock" --rank 1 \
        > "$D/w1.log" 2>&1 3>&- &
    echo $! >> "$D/pids"
    wait_for_text "$D/engine.err" "lora-engine: ready: engine 0, 2 ranks," 30
}

teardown_file() {
    stop_pids "$D/pids"
}

# The report's lines (without the header) as Python computes them from lora-inspect's records.
expected_report() {
    "$LORA_INSPECT" residency --run-dir "$RUN" --json | "$PYTHON" -c '
import json, sys
recs = [json.loads(l) for l in sys.stdin]
by = {}
for r in recs:
    if r["kind"] == "adapter":
        by.setdefault((r["engine"], r["adapter"]), []).append(r)
for (e, a), rs in sorted(by.items()):
    rs.sort(key=lambda r: r["rank"])
    b = lambda v: "true" if v else "false"
    print("\t".join(map(str, [e, a, ",".join(r["level"] for r in rs), b(all(r["agree"] for r in rs)),
                              b(all(r["pinned"] for r in rs)), rs[0]["running"], rs[0]["waiting"]])))'
}

@test "residency-report.sh: a header, then one line per adapter with its level on each rank" {
    run "$EX/residency-report.sh" --run-dir "$RUN"
    expect_status 0
    [ "${lines[0]}" = "$(printf 'ENGINE\tADAPTER\tLEVELS\tAGREE\tPINNED\tRUNNING\tWAITING')" ]
    [ "${#lines[@]}" -eq 3 ]
    [[ "${lines[1]}" == "0"$'\t'"a"$'\t'* && "${lines[2]}" == "0"$'\t'"b"$'\t'* ]]
    # One adapter slot: one of a and b is in it on both ranks, the other in the CPU cache.
    [[ "${lines[1]}${lines[2]}" == *"gpu,gpu"*"cpu,cpu"* || "${lines[1]}${lines[2]}" == *"cpu,cpu"*"gpu,gpu"* ]]
    [ "$(printf '%s\n' "${lines[@]:1}")" = "$(expected_report)" ]
}

@test "residency-report.sh: a pin shows on every rank; an unreachable engine fails the pipeline" {
    run $CLIENT control --run-dir "$RUN" pin b
    expect_status 0
    run "$EX/residency-report.sh" --run-dir "$RUN"
    expect_status 0
    [[ "$output" == *"b"$'\t'"gpu,gpu"$'\t'"true"$'\t'"true"* ]]
    $CLIENT control --run-dir "$RUN" unpin b > /dev/null
    run "$EX/residency-report.sh" --run-dir "$D/no-such-run" --timeout-ms 300
    [ "$status" -ne 0 ]
}

@test "alert-disagreement.sh: ok while the ranks agree, exit 1 naming the adapter when not" {
    run "$EX/alert-disagreement.sh" --run-dir "$RUN"
    expect_status 0
    [ "$output" = "ok: every rank agrees" ]
    run $CLIENT control --run-dir "$RUN" load c "$D/c"
    expect_status 0
    run "$EX/alert-disagreement.sh" --run-dir "$RUN"
    expect_status 1
    # c is on rank 0 only; rank 0 made room for it in its one slot, so whatever held the slot
    # there may now sit lower than on rank 1: every line names a real difference.
    [[ "$output" =~ (^|$'\n')"engine 0: c: rank 0 "(gpu|cpu)", rank 1 registered"($|$'\n') ]]
    local line
    for line in "${lines[@]}"; do
        [[ "$line" =~ ^"engine 0: "[abc]": rank 0 "([a-z]+)", rank 1 "([a-z]+)$ ]]
        [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ]
    done
    run "$EX/alert-disagreement.sh" --run-dir "$D/no-such-run" --timeout-ms 300
    expect_status 111
}

@test "watch-adapter.sh: the adapter's request events and level changes, nothing about others" {
    "$EX/watch-adapter.sh" a --run-dir "$RUN" > "$D/watch.out" 2> "$D/watch.err" &
    local watch=$!
    wait_for_text "$D/watch.out" '"level"' 10
    printf '%s\n' '{"prompt_ids":[1,2,3],"max_tokens":2,"lora":"a","id":"ra"}' \
        '{"prompt_ids":[1,2,3],"max_tokens":2,"lora":"b","id":"rb"}' > "$D/batch"
    run $CLIENT generate --run-dir "$RUN" --batch "$D/batch"
    expect_status 0
    wait_for_text "$D/watch.out" '"FINISHED"' 10
    kill -TERM "$watch"
    pkill -TERM -f "lora-inspect events --follow --json --run-dir $RUN" || true
    wait "$watch" || true
    run "$PYTHON" -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert all(r["adapter"] == "a" for r in recs), recs
events = [r["event"] for r in recs if "event" in r]
assert events == ["QUEUED", "SCHEDULED", "FINISHED"], events
assert all(r["request_id"] == "ra" for r in recs if "event" in r), recs
levels = [(r["rank"], r["level"]) for r in recs if "level" in r]
# Each rank reported once at the start, and then only when its level changed.
assert sorted(set(r for r, _ in levels)) == [0, 1], levels
for i in range(1, len(levels)):
    prev = [l for r, l in levels[:i] if r == levels[i][0]]
    assert not prev or prev[-1] != levels[i][1], levels
' "$D/watch.out"
    expect_status 0
}

@test "watch-adapter.sh: no adapter name is a usage error" {
    run "$EX/watch-adapter.sh"
    expect_status 100
    [[ "$output" == *usage:* ]]
}
