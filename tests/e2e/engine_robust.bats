#!/usr/bin/env bats
# lora-engine under a hostile or unlucky peer (one rank, real workers, ipc sockets in temporary
# run directories): a second worker for a rank that is taken is refused and the engine serves on;
# an unload during a stream on an otherwise idle engine is answered when the stream ends;
# malformed control messages are logged a bounded number of times and heartbeats not at all; a
# killed or stopped worker is replaced by a new process without restarting the engine, with the
# adapters it held. The checks that talk the protocol are in tests/ref/engine_robust.py.

load ../helpers
bats_require_minimum_version 1.5.0

CHECK="$PYTHON $ROOT/tests/ref/engine_robust.py"

setup_file() {
    export D=$BATS_FILE_TMPDIR
    make_model_and_adapters "$D" a1 a2
}

setup() {
    R=$BATS_TEST_TMPDIR/run
    PIDS=$BATS_TEST_TMPDIR/pids
}

teardown() {
    stop_pids "$PIDS"
}

# Starts one rank and an engine with a1 and a2 (a2 pinned by the caller if wanted); waits ready.
up() { # [ENGINE OPTIONS]
    start_engine_group "$R" "$PIDS" "$D/m" --lora-modules "a1=$D/a1" --lora-modules "a2=$D/a2" "$@"
    wait_for_text "$R/engine.err" "lora-engine: ready" 60
}

engine_pid() { sed -n 2p "$PIDS"; }
worker_pid() { sed -n 1p "$PIDS"; }

@test "a second worker for a rank that is taken is refused; the engine serves on (10 trials)" {
    up
    for i in $(seq 1 10); do
        run -1 timeout 30 "$WORKER" serve --engine "ipc://$R/worker.sock" --rank 0
        [[ "$output" == *"lora-worker: fatal: rank 0: the engine refused this worker: rank 0 is taken by a live worker (pid $(worker_pid))"* ]] ||
            { echo "trial $i: $output"; false; }
        is_running "$(engine_pid)"
        run $CHECK serve "$R" a1
        [ "$status" -eq 0 ] || { echo "trial $i: $output"; cat "$R/engine.err"; false; }
    done
    grep -q "lora-engine: warning: refused a second worker for rank 0 (pid [0-9]*): rank 0 is taken by a live worker (pid $(worker_pid))" \
        "$R/engine.err"
    ! grep -q "Assertion" "$R/engine.err"
    # The live rank kept its place.
    is_running "$(worker_pid)"
}

@test "a connection that takes a live worker's routing id is refused; the worker keeps its rank" {
    up
    for i in 1 2 3; do
        run $CHECK impostor "$R" "worker-0-$(worker_pid)"
        [ "$status" -eq 0 ] || { echo "trial $i: $output"; false; }
        is_running "$(engine_pid)"
        run $CHECK serve "$R" a1
        [ "$status" -eq 0 ] || { echo "trial $i: $output"; cat "$R/engine.err"; false; }
    done
    ! grep -q "Assertion\|is dead\|replaced" "$R/engine.err"
}

@test "an unload during a stream on an idle engine is answered when the stream ends" {
    STEP_MS=60 up
    run $CHECK unload-idle "$R" a1
    echo "$output"
    [ "$status" -eq 0 ]
    # Not half-gone: it loads again, and serves.
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$R" load a1 "$D/a1"
    [ "$status" -eq 0 ]
    [[ "$output" != *"already loaded"* ]]
    run $CHECK serve "$R" a1
    [ "$status" -eq 0 ]
}

@test "10,000 malformed control messages give a bounded number of log lines; heartbeats none" {
    LORA_ENGINE_TEST_LOG_WINDOW_MS=500 up
    run $CHECK flood "$R" 10000
    echo "$output"
    [ "$status" -eq 0 ]
    # The summary of the held-back lines comes once the window is over; a flood that outlasts
    # a window is summarised once per window, the last one when it is over.
    wait_for_text "$R/engine.err" "more malformed control messages in the last" 20
    local deadline=$((SECONDS + 5))
    while :; do
        n=$(grep -c "dropping a control message" "$R/engine.err")
        # Every message is counted: the logged and the summarised add up to 10,000.
        total=$(( n + $(sed -n 's/.*warning: \([0-9]*\) more malformed control messages.*/\1/p' \
            "$R/engine.err" | awk '{ t += $1 } END { print t + 0 }') ))
        [ "$total" -lt 10000 ] && [ "$SECONDS" -lt "$deadline" ] || break
        sleep 0.1
    done
    echo "10,000 malformed control messages: $n lines of them logged" >&3
    [ "$n" -ge 1 ]
    [ "$n" -le 100 ]
    ! grep -q "heartbeat" "$R/engine.err"
    [ "$total" -eq 10000 ]
}

# Kills the worker with SIGNAL, starts a new one at once (as the supervisor does), and checks
# that a request on a1 completes within 5 s plus the detection time of the signal.
replace_worker() { # SIGNAL BOUND_S
    up
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$R" pin a2
    [ "$status" -eq 0 ]
    local old
    old=$(worker_pid)
    kill "-$1" "$old"
    if [ "$1" = STOP ]; then
        # A stopped rank is declared dead after 3 s; then the supervisor kills it.
        wait_for_text "$R/engine.err" "worker rank 0 (pid $old) is dead (silent for 3000 ms)" 20
        kill -KILL "$old"
    fi
    LORA_WORKER_TEST_STEP_DELAY_MS=0 OMP_WAIT_POLICY=passive "$WORKER" serve \
        --engine "ipc://$R/worker.sock" --rank 0 >> "$R/worker.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    run $CHECK first-ok "$R" a1 "$2"
    echo "$1: first completion after ${output} s" >&3
    [ "$status" -eq 0 ]
    grep -q "lora-engine: rank 0 is back: pid $! took over from pid $old in [0-9]* ms; restored 2 adapters: a1, a2; serving again" \
        "$R/engine.err"
    is_running "$(engine_pid)"
    # The registry and the pin are kept, on the new process too.
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$R" residency
    echo "$output"
    [[ "$output" == *'"pinned": ["a2"]'* ]]
    run $CHECK serve "$R" a2
    [ "$status" -eq 0 ]
}

@test "a SIGKILLed worker: a new process takes the rank, the engine serves again with its adapters" {
    replace_worker KILL 15
}

@test "a SIGSTOPped worker is declared dead after 3 s and replaced" {
    replace_worker STOP 15
}
