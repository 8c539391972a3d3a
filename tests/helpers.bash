# Shared set-up for the bats tests: where the binaries and the reference interpreter are.
# tests/run exports LORA_BIN and PYTHON; running one file by hand falls back to the defaults.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${LORA_BIN:=$ROOT/build/main/bin}"
: "${PYTHON:=/usr/bin/python3}"
REF="$PYTHON $ROOT/tests/ref/hf_reference.py"
FIXTURE="$PYTHON $ROOT/tests/ref/make_fixture.py"
WORKER="$LORA_BIN/lora-worker"
export LORA_DEMO_DIR=${LORA_DEMO_DIR:-$BATS_RUN_TMPDIR/demo}

# Fails the test with the output when the last `run` did not exit with the given code.
expect_status() {
    if [ "$status" -ne "$1" ]; then
        echo "expected exit $1, got $status; output:" >&2
        echo "$output" >&2
        if [ -n "${stderr-}" ]; then
            echo "stderr:" >&2
            echo "$stderr" >&2
        fi
        return 1
    fi
}

# Fails unless the last `run --separate-stderr` printed nothing on stdout and named $1 on stderr.
expect_message() {
    if [ -n "$output" ]; then
        echo "expected no stdout, got: $output" >&2
        return 1
    fi
    if [[ "$stderr" != *"$1"* ]]; then
        echo "expected stderr to name '$1', got: $stderr" >&2
        return 1
    fi
}

# The options a man page ($1) defines in its OPTIONS section: the first option on the line after
# each .TP, sorted.
man_page_options() {
    sed 's/\\-/-/g' "$1" | awk '
        /^\.SH/ { inside = ($2 == "OPTIONS"); next }
        inside && /^\.TP/ { tp = 1; next }
        inside && tp { tp = 0; if (match($0, /--[a-z][a-z-]*/)) print substr($0, RSTART, RLENGTH) }
    ' | sort
}

# Waits up to $3 seconds for file $1 to contain $2; fails showing the file.
wait_for_text() {
    local deadline=$((SECONDS + $3))
    while ! grep -qF -- "$2" "$1" 2> /dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "'$2' did not appear in $1 within $3 s; it holds:" >&2
            cat "$1" >&2 2> /dev/null
            return 1
        fi
        sleep 0.05
    done
}

# Whether process $1 still runs (a zombie not yet waited for has exited).
is_running() {
    local state
    [ -r "/proc/$1/stat" ] && read -r _ _ state _ < "/proc/$1/stat" && [ "$state" != Z ]
}

# start_logged NAME CMD...: runs CMD in the background with its output in $D/NAME.log (without
# bats' descriptor 3, which a program left running would hold open); its pid goes to
# $D/NAME.pid and is appended to $D/pids, for stop_pids.
start_logged() {
    local name=$1
    shift
    "$@" > "$D/$name.log" 2>&1 3>&- &
    echo $! > "$D/$name.pid"
    echo $! >> "$D/pids"
}

# wait_frontend NAME: waits up to 60 s for the frontend logging to $D/NAME.log to say it is
# ready, then writes its port to $D/port_NAME. Fails showing every log in $D.
wait_frontend() {
    wait_for_text "$D/$1.log" "ready: http://" 60 || { cat "$D"/*.log >&2; return 1; }
    ready_port "$D/$1.log" > "$D/port_$1"
}

# Stops the processes listed in pid file $1: SIGTERM in reverse order of start (an engine
# before its workers), SIGKILL for whatever is left after 5 s.
stop_pids() {
    local pid deadline=$((SECONDS + 5))
    [ -f "$1" ] || return 0
    for pid in $(tac "$1"); do
        kill -TERM "$pid" 2> /dev/null || true
    done
    for pid in $(tac "$1"); do
        while is_running "$pid" && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.05
        done
        kill -KILL "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    done
}

# The port of the ready line "PROGRAM: ready: http://HOST:PORT" in file $1.
ready_port() {
    sed -n 's/^[a-z-]*: ready: http:\/\/[^ ]*:\([0-9][0-9]*\)$/\1/p' "$1"
}

# Fails unless promtool parses the scrape in $1 and lints nothing but what vLLM's names bring:
# the colon of every vllm: name, and the _total of the histogram vllm:iteration_tokens_total
# (promtool then exits 3). Its remarks go to $1.lint.
promtool_clean() {
    local rc=0
    promtool check metrics < "$1" > "$1.lint" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || { cat "$1.lint"; return 1; }
    if grep -v -e "^vllm:[a-z0-9_]* metric names should not contain ':'$" \
            -e '^vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix$' \
            "$1.lint"; then
        return 1
    fi
}

# A tiny model in $1/m and, for each further argument NAME, a rank-4 adapter in $1/NAME, with
# the seeds 1, 2, ... in order.
make_model_and_adapters() {
    local dir=$1 seed=1 a
    shift
    "$WORKER" make-model --out "$dir/m" > /dev/null
    for a in "$@"; do
        "$WORKER" make-adapter --model "$dir/m" --out "$dir/$a" --rank 4 --seed $((seed++)) \
            > /dev/null
    done
}

# Starts, without waiting for it, one worker rank (each step held $STEP_MS longer) and an engine
# on model $3 with options "${@:4}" and a 200 ms publish interval, in run directory $1 (made,
# mode 0700; the logs go there too); their pids are appended to file $2.
start_engine_group() {
    local dir=$1 pids=$2 model=$3
    shift 3
    mkdir -m 700 "$dir"
    LORA_WORKER_TEST_STEP_DELAY_MS=${STEP_MS:-0} OMP_WAIT_POLICY=passive "$WORKER" serve \
        --engine "ipc://$dir/worker.sock" --rank 0 > "$dir/worker.log" 2>&1 3>&- &
    echo $! >> "$pids"
    "$LORA_BIN/lora-engine" --model "$model" --run-dir "$dir" --publish-interval-ms 200 "$@" \
        > "$dir/engine.out" 2> "$dir/engine.err" 3>&- &
    echo $! >> "$pids"
}
