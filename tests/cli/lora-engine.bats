#!/usr/bin/env bats
# The command line of lora-engine: help and version, usage errors (exit 100), a bad model or
# adapter (exit 1), system failures (exit 111), environment mirrors, the run directory's
# sockets, start-up with real lora-worker ranks (ready line, SIGTERM, a killed worker), and the
# man page against the options the program lists. Workers and engines started in the background
# are recorded in $BATS_TEST_TMPDIR/pids and killed in teardown, whatever happened.

load ../helpers
bats_require_minimum_version 1.5.0

ENGINE="$LORA_BIN/lora-engine"
MAN="$ROOT/man/lora-engine.1"

setup_file() {
    export D=$BATS_FILE_TMPDIR
    # Defaults are tiny: hidden 64, 2 layers, 4 heads, 2 key/value heads, vocab 320.
    "$WORKER" make-model --out "$D/m"
    "$WORKER" make-adapter --model "$D/m" --out "$D/a" --rank 4 --seed 3
    mkdir -p "$D/empty" "$D/badconf"
    echo '{"hidden_size": 64' > "$D/badconf/config.json"
}

setup() {
    # A mirror variable left in the caller's environment would change what every test sees.
    for v in $(compgen -e); do
        case "$v" in LORA_ENGINE_* | LORA_WORKER_*) unset "$v" ;; esac
    done
    RUN=$BATS_TEST_TMPDIR/run
    mkdir -p "$RUN"
    chmod 700 "$RUN"
    PIDS=$BATS_TEST_TMPDIR/pids
    : > "$PIDS"
}

teardown() {
    local pid
    while read -r pid; do
        kill -KILL "$pid" 2> /dev/null || true
    done < "$PIDS"
    while read -r pid; do
        wait "$pid" 2> /dev/null || true
    done < "$PIDS"
}

# Points RUN at a new, empty run directory. A worker started before its engine on a run directory
# that holds the socket files of an engine that has exited sometimes never gets through its
# hello (seen about once in 20 to 100 tries), so each engine of a test gets a directory of its own.
fresh_run_dir() {
    RUN=$(mktemp -d "$BATS_TEST_TMPDIR/run.XXXXXX")
    chmod 700 "$RUN"
}

# Starts worker rank $1 (default 0) on the run directory's worker socket; its pid in WORKER_PID.
start_worker() {
    local rank=${1:-0}
    "$WORKER" serve --engine "ipc://$RUN/worker.sock" --rank "$rank" \
        > "$BATS_TEST_TMPDIR/worker$rank.log" 2>&1 3>&- &
    WORKER_PID=$!
    echo "$WORKER_PID" >> "$PIDS"
}

# Starts a fake worker rank $1 with room for $2 KV blocks (tests/ref/fake_worker.py: the protocol
# without a model); its pid in WORKER_PID, its lines in fake$1.log.
start_fake_worker() {
    $PYTHON "$ROOT/tests/ref/fake_worker.py" --engine "ipc://$RUN/worker.sock" --rank "$1" \
        --kv-room "$2" >> "$BATS_TEST_TMPDIR/fake$1.log" 2>&1 3>&- &
    WORKER_PID=$!
    echo "$WORKER_PID" >> "$PIDS"
}

# Starts the engine on the test model and the run directory with extra options "$@"; its pid
# in ENGINE_PID, its output in engine.out and engine.err.
start_engine() {
    "$ENGINE" --model "$D/m" --run-dir "$RUN" "$@" \
        > "$BATS_TEST_TMPDIR/engine.out" 2> "$BATS_TEST_TMPDIR/engine.err" 3>&- &
    ENGINE_PID=$!
    echo "$ENGINE_PID" >> "$PIDS"
}

# Whether process $1 has exited (a zombie not yet waited for counts as exited).
has_exited() {
    local state
    [ -r "/proc/$1/stat" ] || return 0
    read -r _ _ state _ < "/proc/$1/stat" || return 0
    [ "$state" = Z ]
}

# Waits up to $2 seconds for child $1 to exit and puts its exit status in rc.
wait_exit() {
    local deadline=$((SECONDS + $2))
    while ! has_exited "$1"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "process $1 still runs after $2 s" >&2
            return 1
        fi
        sleep 0.05
    done
    rc=0
    wait "$1" || rc=$?
}

# The options listed by --help, one per line, sorted.
help_options() {
    "$ENGINE" --help | sed -n 's/^  \(--[a-z][a-z-]*\).*/\1/p' | sort
}


# ---- help and version

@test "--help and -h print every option on stdout and exit 0" {
    for flag in --help -h; do
        run --separate-stderr "$ENGINE" "$flag"
        expect_status 0
        [ -z "$stderr" ]
        [[ "${lines[0]}" == "usage: lora-engine --model DIR"* ]]
        for o in --model --run-dir --frontend-endpoint --worker-endpoint --control-endpoint \
            --publish-endpoint --tensor-parallel-size --engine-index --max-loras \
            --max-cpu-loras --max-lora-rank --lora-modules --block-size --num-kv-blocks \
            --kv-cache-bytes --max-num-batched-tokens --max-num-seqs --max-model-len \
            --max-requests --idle-notify-ms --startup-timeout-ms --registry-file --seed \
            --help --version; do
            [[ "$output" == *"  $o "* ]] || { echo "$flag lacks $o" >&2; return 1; }
        done
    done
}

@test "--version prints one version line and exits 0" {
    run --separate-stderr "$ENGINE" --version
    expect_status 0
    [ -z "$stderr" ]
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" =~ ^lora-engine\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
}

# ---- usage errors: exit 100, a message naming the option, nothing on stdout

@test "without --model: exit 100, and the message asks for it" {
    run --separate-stderr "$ENGINE" --run-dir "$RUN"
    expect_status 100
    expect_message "--model"
    [[ "$stderr" == "lora-engine: fatal: "* ]]
}

@test "an unknown option or a positional argument exits 100 and names it" {
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --frobnicate
    expect_status 100
    expect_message "'--frobnicate'"
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --frobnicate=3
    expect_status 100
    expect_message "'--frobnicate'"
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" stray
    expect_status 100
    expect_message "'stray'"
    [ -z "$(ls -A "$RUN")" ]
}

@test "an option without its value exits 100 and names it" {
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --max-loras
    expect_status 100
    expect_message "--max-loras"
    run --separate-stderr "$ENGINE" --run-dir "$RUN" --model
    expect_status 100
    expect_message "--model"
}

@test "out-of-range and malformed values exit 100 naming the option and the value" {
    for ov in max-loras:0 max-loras:1025 max-loras:abc tensor-parallel-size:99 \
        tensor-parallel-size:0 engine-index:-1 max-cpu-loras:65537 max-lora-rank:0 \
        block-size:0 num-kv-blocks:-1 kv-cache-bytes:0 max-num-batched-tokens:0 \
        max-num-seqs:4097 max-model-len:x max-requests:0 idle-notify-ms:0 \
        startup-timeout-ms:99 max-loras:2.5 max-loras: seed:-1 seed:x seed:1e17; do
        o=${ov%%:*} v=${ov#*:}
        run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" "--$o" "$v"
        expect_status 100
        expect_message "--$o"
        [[ "$stderr" == *"'$v'"* ]] || { echo "the message lacks '$v': $stderr" >&2; return 1; }
    done
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --help=yes
    expect_status 100
    expect_message "--help"
    [ -z "$(ls -A "$RUN")" ]
}

@test "--max-cpu-loras below --max-loras, or a token budget below --max-num-seqs, exits 100" {
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --max-loras 4 \
        --max-cpu-loras 2
    expect_status 100
    expect_message "--max-cpu-loras (2) must be at least --max-loras (4)"
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --max-num-seqs 16 \
        --max-num-batched-tokens 8
    expect_status 100
    expect_message "--max-num-batched-tokens"
    [ -z "$(ls -A "$RUN")" ]
}

@test "--max-cpu-loras 0 means as many as --max-loras" {
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --max-loras 8 \
        --max-cpu-loras 0 --startup-timeout-ms 100
    expect_status 111
    expect_message "workers said hello"
}

@test "usage errors are reported before the model is read" {
    run --separate-stderr "$ENGINE" --model "$BATS_TEST_TMPDIR/none" --run-dir "$RUN" \
        --max-loras 0
    expect_status 100
    expect_message "--max-loras"
}

# ---- bad model: exit 1, before any socket is bound

@test "a model directory without config.json exits 1 naming config.json" {
    for m in "$D/empty" "$BATS_TEST_TMPDIR/none"; do
        run --separate-stderr "$ENGINE" --model "$m" --run-dir "$RUN"
        expect_status 1
        expect_message "config.json"
    done
    [ -z "$(ls -A "$RUN")" ]
}

@test "a malformed config.json exits 1 naming the file" {
    run --separate-stderr "$ENGINE" --model "$D/badconf" --run-dir "$RUN"
    expect_status 1
    expect_message "config.json"
}

# ---- environment mirrors

@test "a bad value in a mirror variable exits 100 and names the variable" {
    LORA_ENGINE_MAX_LORAS=abc run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN"
    expect_status 100
    expect_message "LORA_ENGINE_MAX_LORAS"
    LORA_ENGINE_TENSOR_PARALLEL_SIZE=99 run --separate-stderr "$ENGINE" --model "$D/m" \
        --run-dir "$RUN"
    expect_status 100
    expect_message "LORA_ENGINE_TENSOR_PARALLEL_SIZE"
    LORA_ENGINE_SEED=-3 run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN"
    expect_status 100
    expect_message "LORA_ENGINE_SEED"
}

@test "mirror variables set options, and the command line overrides them" {
    LORA_ENGINE_MAX_LORAS=8 run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --max-cpu-loras 4
    expect_status 100
    expect_message "--max-cpu-loras"
    LORA_ENGINE_MAX_LORAS=8 run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --max-cpu-loras 4 --max-loras 2 --startup-timeout-ms 100
    expect_status 111
    expect_message "within 100 ms"
    LORA_ENGINE_MODEL="$D/m" LORA_ENGINE_RUN_DIR="$RUN" LORA_ENGINE_STARTUP_TIMEOUT_MS=100 \
        LORA_ENGINE_TENSOR_PARALLEL_SIZE=2 run --separate-stderr "$ENGINE"
    expect_status 111
    expect_message "only 0 of 2 workers said hello within 100 ms"
    [ -S "$RUN/worker.sock" ]
}

# ---- sockets and start-up without workers: exit 111

@test "without workers: exit 111 after --startup-timeout-ms, saying how many said hello" {
    local t0=$SECONDS
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 300
    expect_status 111
    expect_message "only 0 of 1 workers said hello within 300 ms"
    [ $((SECONDS - t0)) -le 5 ]
    for s in frontend worker control publish; do
        [ -S "$RUN/$s.sock" ] || { echo "no $s.sock in the run directory" >&2; return 1; }
    done
}

@test "a run directory that does not exist exits 111 naming the endpoint" {
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN/none"
    expect_status 111
    expect_message "unable to bind 'ipc://$RUN/none/"
}

@test "an endpoint option replaces one socket of the run directory" {
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --worker-endpoint "ipc://$RUN/w.sock" --startup-timeout-ms 100
    expect_status 111
    [ -S "$RUN/w.sock" ] && [ ! -e "$RUN/worker.sock" ] && [ -S "$RUN/control.sock" ]
}

@test "a second engine on a run directory in use exits 111; stale sockets are replaced" {
    start_engine --startup-timeout-ms 10000
    local deadline=$((SECONDS + 5))
    until [ -S "$RUN/publish.sock" ]; do
        [ "$SECONDS" -lt "$deadline" ] || { cat "$BATS_TEST_TMPDIR/engine.err" >&2; return 1; }
        sleep 0.05
    done
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 100
    expect_status 111
    expect_message "a live process is listening there"
    kill -KILL "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 5
    # Its socket files stay behind; nobody listens on them now.
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 100
    expect_status 111
    expect_message "workers said hello"
}

# ---- with real workers

@test "with its worker: the ready line on stderr, nothing on stdout, SIGTERM exits 0" {
    start_worker 0
    local first=$WORKER_PID
    start_engine --lora-modules "a=$D/a"
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: ready: engine 0, 1 rank," 15
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 5
    [ "$rc" -eq 0 ]
    [ ! -s "$BATS_TEST_TMPDIR/engine.out" ]
    # The engine tells its workers to shut down.
    wait_exit "$first" 5
    [ "$rc" -eq 0 ] || {
        echo "worker exited $rc" >&2
        cat "$BATS_TEST_TMPDIR/worker0.log" "$BATS_TEST_TMPDIR/engine.err" >&2
        false
    }
}

@test "two ranks, adapters from LORA_ENGINE_LORA_MODULES, and an engine index" {
    start_worker 0
    start_worker 1
    LORA_ENGINE_LORA_MODULES="x=$D/a,y=$D/a" start_engine --tensor-parallel-size 2 \
        --max-loras 1 --max-cpu-loras 2 --engine-index 3 --num-kv-blocks 64
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: ready: engine 3, 2 ranks, 64 KV blocks of 16" 15
    kill -INT "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 5
    [ "$rc" -eq 0 ]
}

# ---- the KV capacity: each rank sizes its cache, the engine uses the smallest

@test "ranks with room for 100 and 64 KV blocks: the engine uses 64, and says so" {
    start_fake_worker 0 100
    start_fake_worker 1 64
    start_engine --tensor-parallel-size 2
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: ready: engine 0, 2 ranks, 64 KV blocks of 16" 15
    grep -q "lora-engine: note: the ranks have room for 100, 64 KV blocks; the engine uses 64, the smallest" \
        "$BATS_TEST_TMPDIR/engine.err"
    # Each rank was sent no cap and reported what it has room for.
    grep -q "rank 0: set up with 100 KV blocks (room for 100, cap 0)" "$BATS_TEST_TMPDIR/fake0.log"
    grep -q "rank 1: set up with 64 KV blocks (room for 64, cap 0)" "$BATS_TEST_TMPDIR/fake1.log"
    # The block manager has 64, and the engine says 64 wherever it says its limits.
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" config
    [ "$status" -eq 0 ]
    jq -e '.data.num_kv_blocks == 64' <<< "$output"
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" stats
    [ "$status" -eq 0 ]
    jq -e '.data.num_kv_blocks == 64 and .data.free_blocks == 64' <<< "$output"
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 5
    [ "$rc" -eq 0 ]
}

@test "--num-kv-blocks caps the blocks of a rank with more room; the smallest count wins" {
    start_fake_worker 0 100
    start_fake_worker 1 80
    start_engine --tensor-parallel-size 2 --num-kv-blocks 90
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: ready: engine 0, 2 ranks, 80 KV blocks of 16" 15
    grep -q "rank 0: set up with 90 KV blocks (room for 100, cap 90)" "$BATS_TEST_TMPDIR/fake0.log"
    grep -q "rank 1: set up with 80 KV blocks (room for 80, cap 90)" "$BATS_TEST_TMPDIR/fake1.log"
}

@test "a rank that rejoins must hold the engine's count: one with room for fewer is refused" {
    start_fake_worker 0 64
    start_engine --idle-notify-ms 50
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: ready: engine 0, 1 rank, 64 KV blocks of 16" 15
    kill -KILL "$WORKER_PID"
    start_fake_worker 0 32
    local small=$WORKER_PID
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: error: the new worker for rank 0 (pid $small) has room for 32 KV blocks, not the 64 the engine runs with; it is refused and told to stop" 15
    grep -q "rank 0: set up with 32 KV blocks (room for 32, cap 64)" "$BATS_TEST_TMPDIR/fake0.log"
    wait_exit "$small" 5
    [ "$rc" -eq 0 ]
    # One with more room takes the rank, holding exactly the engine's 64.
    start_fake_worker 0 100
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: rank 0 is back: pid $WORKER_PID took over from pid $small" 15
    grep -q "rank 0: set up with 64 KV blocks (room for 100, cap 64)" "$BATS_TEST_TMPDIR/fake0.log"
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" health
    [ "$status" -eq 0 ]
}

@test "a real rank takes as many KV blocks as --kv-cache-bytes holds; none at all exits 1" {
    # A block of the test model: 2 x 4 bytes x 2 layers x 16 positions x 2 heads x 16 = 8192.
    start_worker 0
    start_engine --kv-cache-bytes 819300
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" \
        "lora-engine: ready: engine 0, 1 rank, 100 KV blocks of 16" 15
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 5
    [ "$rc" -eq 0 ]
    wait_exit "$WORKER_PID" 5
    fresh_run_dir
    start_worker 0
    start_engine --kv-cache-bytes 8191
    wait_exit "$ENGINE_PID" 20
    [ "$rc" -eq 1 ]
    grep -q "lora-engine: fatal: rank 0: the KV cache budget of 8191 bytes holds no block of 8192 bytes" \
        "$BATS_TEST_TMPDIR/engine.err"
}

@test "every malformed --lora-modules value is a usage error, before any worker joins" {
    for v in noequals "=$D/a" "x="; do
        run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
            --startup-timeout-ms 10000 --lora-modules "$v"
        expect_status 100
        expect_message "--lora-modules '$v' must be NAME=PATH"
    done
}

@test "a model whose weights a rank cannot read: exit 1 naming the file" {
    mkdir "$BATS_TEST_TMPDIR/noweights"
    cp "$D/m/config.json" "$BATS_TEST_TMPDIR/noweights/"
    start_worker 0
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$BATS_TEST_TMPDIR/noweights" \
        --run-dir "$RUN" --startup-timeout-ms 10000
    expect_status 1
    expect_message "model.safetensors"
    wait_exit "$WORKER_PID" 5
}

@test "an adapter that cannot be loaded, a name given twice, or no room: exit 1 naming it" {
    start_worker 0
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 10000 --lora-modules "x=$D/none"
    expect_status 1
    expect_message "adapter 'x'"
    [[ "$stderr" == *adapter_config.json* ]]
    wait_exit "$WORKER_PID" 5
    fresh_run_dir
    start_worker 0
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 10000 --lora-modules "x=$D/a" --lora-modules "x=$D/a"
    expect_status 1
    expect_message "adapter 'x' is already loaded"
    wait_exit "$WORKER_PID" 5
    # With the default --max-cpu-loras, the CPU cache holds no more adapters than the slots.
    fresh_run_dir
    start_worker 0
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 10000 --max-loras 1 --lora-modules "x=$D/a" --lora-modules "y=$D/a"
    expect_status 1
    expect_message "adapter 'y': CPU adapter cache is full"
    wait_exit "$WORKER_PID" 5
}

@test "a killed worker makes the engine unhealthy; it runs on until SIGTERM (exit 0)" {
    start_worker 0
    start_engine --idle-notify-ms 50
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: ready:" 15
    kill -KILL "$WORKER_PID"
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "the engine is unhealthy" 6
    grep -q "^lora-engine: error: worker rank 0 " "$BATS_TEST_TMPDIR/engine.err"
    if has_exited "$ENGINE_PID"; then
        echo "the engine exited when its worker died" >&2
        return 1
    fi
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 5
    [ "$rc" -eq 0 ]
}

# ---- option errors found before anything starts, and signals during start-up

@test "without --run-dir and with an endpoint missing: exit 100" {
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" \
        --worker-endpoint "ipc://$RUN/w.sock"
    expect_status 100
    expect_message "--run-dir"
}

@test "--max-requests below --max-num-seqs: exit 100 naming both" {
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --max-requests 8 --max-num-seqs 16
    expect_status 100
    expect_message "--max-requests"
    [[ "$stderr" == *--max-num-seqs* ]]
}

@test "--tensor-parallel-size above the model's key/value heads is refused, not a crash" {
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --tensor-parallel-size 4 --startup-timeout-ms 100
    [ "$status" -eq 1 ] || [ "$status" -eq 100 ]
    expect_message "--tensor-parallel-size"
}

@test "SIGTERM while waiting for the workers exits 0 at once" {
    start_engine --startup-timeout-ms 20000
    sleep 0.3
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 3
    [ "$rc" -eq 0 ]
}

# ---- the man page

@test "the man page documents exactly the options --help lists" {
    diff <(help_options) <(man_page_options "$MAN") ||
        { echo "man page options differ from --help (< help, > man)" >&2; return 1; }
}

@test "every option listed by --help appears in the man page, with its mirror variable" {
    for o in $(help_options); do
        grep -qF -- "$(printf '%s' "$o" | sed 's/-/\\-/g')" "$MAN" ||
            { echo "$o is not in the man page" >&2; return 1; }
        var=LORA_ENGINE_$(printf '%s' "${o#--}" | tr 'a-z-' 'A-Z_')
        grep -qw -- "$var" "$MAN" || { echo "$var is not in the man page" >&2; return 1; }
    done
}

@test "the man page renders without warnings" {
    command -v groff > /dev/null || skip "groff is not installed"
    run groff -man -ww -z "$MAN"
    expect_status 0
    [ -z "$output" ]
    command -v man > /dev/null || return 0
    run env MANWIDTH=80 man -l "$MAN"
    expect_status 0
    [[ "$output" == *"EXIT STATUS"* ]]
}

# ---- --generation-config

@test "--generation-config: auto, vllm or a directory; anything else exits 100 naming it" {
    run --separate-stderr "$ENGINE" --help
    [[ "$output" == *"  --generation-config SRC "* ]]
    for v in bogus "$D/m/config.json" "$BATS_TEST_TMPDIR/none"; do
        run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" --generation-config "$v"
        expect_status 100
        expect_message "--generation-config '$v' must be auto, vllm or a directory"
    done
    LORA_ENGINE_GENERATION_CONFIG=bogus run --separate-stderr "$ENGINE" --model "$D/m" \
        --run-dir "$RUN"
    expect_status 100
    expect_message "--generation-config 'bogus'"
    [ -z "$(ls -A "$RUN")" ]
}

@test "--generation-config: a default the engine cannot honour, or a broken file, exits 1" {
    mkdir -p "$BATS_TEST_TMPDIR/rp" "$BATS_TEST_TMPDIR/bad" "$BATS_TEST_TMPDIR/nofile"
    echo '{"min_p": 0.1}' > "$BATS_TEST_TMPDIR/rp/generation_config.json"
    echo '{"top_p": 2}' > "$BATS_TEST_TMPDIR/bad/generation_config.json"
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --generation-config "$BATS_TEST_TMPDIR/rp"
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/rp/generation_config.json: 'min_p' is 0.1"
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --generation-config "$BATS_TEST_TMPDIR/bad"
    expect_status 1
    expect_message "'top_p' must be between"
    run --separate-stderr "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --generation-config "$BATS_TEST_TMPDIR/nofile"
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/nofile/generation_config.json: unable to open"
    [ -z "$(ls -A "$RUN")" ]
}

# ---- the adapter registry file, --seed, waiting for ranks

@test "a corrupt or unreadable registry file: exit 1 naming it, before any socket is bound" {
    echo '{"version": 1, "adapters": [{"name": "x"}]}' > "$RUN/adapters.json"
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --startup-timeout-ms 10000
    expect_status 1
    expect_message "unable to restore the adapter registry: $RUN/adapters.json: adapters[0].path"
    [ ! -e "$RUN/worker.sock" ]
    mkdir "$BATS_TEST_TMPDIR/a-dir"
    LORA_ENGINE_REGISTRY_FILE=$BATS_TEST_TMPDIR/a-dir run --separate-stderr timeout -s KILL 20 \
        "$ENGINE" --model "$D/m" --run-dir "$RUN" --startup-timeout-ms 10000
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/a-dir: unable to read: is a directory"
    # An empty --registry-file keeps no file: the corrupt one is not read.
    run --separate-stderr timeout -s KILL 20 "$ENGINE" --model "$D/m" --run-dir "$RUN" \
        --registry-file '' --startup-timeout-ms 100
    expect_status 111
    expect_message "workers said hello"
}

@test "the registry file follows loads, unloads and pins; a restart keeps an unloaded start-up adapter out" {
    local reg=$BATS_TEST_TMPDIR/registry.json
    start_worker 0
    start_engine --registry-file "$reg" --max-loras 2 --max-cpu-loras 3 \
        --lora-modules "{\"name\":\"j\",\"path\":\"$D/a\"}" --lora-modules "k=$D/a"
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: ready:" 15
    [ "$(jq -c '[.adapters[] | [.name, .pinned]]' "$reg")" = '[["j",false],["k",false]]' ]
    $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" load r "$D/a" > /dev/null
    $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" unload j > /dev/null
    $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" pin k > /dev/null
    [ "$(jq -c '[.adapters[] | [.name, .pinned]]' "$reg")" = '[["k",true],["r",false]]' ]
    [ "$(jq -c '.startup_modules' "$reg")" = '["j","k"]' ]
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 10
    fresh_run_dir
    start_worker 0
    start_engine --registry-file "$reg" --max-loras 2 --max-cpu-loras 3 --lora-modules "j=$D/a" \
        --lora-modules "k=$D/./a"
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: ready:" 15
    grep -q "lora-engine: restored: 2 adapters from '$reg': k (pinned), r" \
        "$BATS_TEST_TMPDIR/engine.err"
    grep -q "start-up adapter 'j' stays unloaded" "$BATS_TEST_TMPDIR/engine.err"
    grep -q "start-up adapter 'k' keeps the registry's path '$D/a', not '$D/./a'" \
        "$BATS_TEST_TMPDIR/engine.err"
    [ "$($PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$RUN" residency |
        jq -c '[.data.adapters[] | [.name, .pinned]]')" = '[["k",true],["r",false]]' ]
}

@test "waiting for ranks, the engine says which ones every few seconds" {
    start_engine --tensor-parallel-size 2 --startup-timeout-ms 60000
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: waiting for ranks 0, 1 of 2" 15
    start_worker 1
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: waiting for rank 0 of 2" 15
}

# The tokens of one request without a seed, temperature 1, on a fresh engine with options "$@".
unseeded_tokens() {
    fresh_run_dir
    start_worker 0
    start_engine "$@"
    wait_for_text "$BATS_TEST_TMPDIR/engine.err" "lora-engine: ready:" 15
    echo '{"prompt_ids": [5, 6, 7], "max_tokens": 16, "lora": null, "temperature": 1.0, "ignore_eos": true}' \
        > "$BATS_TEST_TMPDIR/batch"
    $PYTHON "$ROOT/tests/ref/client.py" generate --run-dir "$RUN" --batch "$BATS_TEST_TMPDIR/batch" |
        jq -c .tokens
    kill -TERM "$ENGINE_PID"
    wait_exit "$ENGINE_PID" 10
}

@test "--seed: unseeded requests sample the same on engines with the same seed, not with another" {
    a=$(unseeded_tokens --seed 5)
    b=$(unseeded_tokens --seed 5)
    c=$(unseeded_tokens --seed 6)
    echo "seed 5: $a; again: $b; seed 6: $c" >&2
    [ -n "$a" ] && [ "$a" != null ]
    [ "$a" = "$b" ]
    [ "$a" != "$c" ]
}
