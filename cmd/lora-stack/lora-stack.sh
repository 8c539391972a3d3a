#!/usr/bin/env bash
# lora-stack: starts, watches and stops the whole stack (docs/design.md, "Supervisor"): lora-worker ranks,
# lora-engine, lora-frontend(s) and lora-metrics, with their ipc sockets in one run directory.
#
#   lora-stack up [MODEL] [--run-dir DIR] [--model DIR] [--tp N] [--device DEVICE]
#                 [--frontends N] [--port N] [--metrics-port N] [--lora-modules NAME=PATH...]...
#                 [--unhealthy-timeout S] [any program option]
#   lora-stack status|logs [PROGRAM]|down [--run-dir DIR]
#
# `up` checks the compute device (--device, given to every worker) with `lora-worker device`
# first, so a device no worker could use fails at once (100) with the worker's reason; then it
# starts a supervisor in the background and returns once every program has said it is
# ready (each program's ready line, read from its standard error through a pipe: no sleeps).
# The supervisor restarts what crashes, with a backoff that doubles from 1 s to 30 s: with one
# rank, a dead worker restarts alone and the running engine takes the new process back (setup,
# its adapters, then it serves again); with several ranks (their all-reduce group cannot take a
# newcomer) a dead worker, and a dead engine in any case, restart the engine with all its ranks;
# a dead frontend or exporter restarts alone. A worker the engine declares dead while its process
# lives (stopped, hung) is killed, so that it is restarted as above. An engine that says it is
# unhealthy while every process runs is restarted with its ranks once it has said so for
# --unhealthy-timeout seconds: the supervisor asks it every HEALTH_POLL_S seconds with
# `lora-inspect health`. The engine keeps its adapter registry
# in RUN_DIR/adapters.json, so a restarted engine group comes back with the adapters loaded,
# unloaded and pinned at run time; the supervisor's log says what it restarted and, from the
# engine's "restored:" line, which adapters came back. SIGTERM to the supervisor, or `down`,
# stops the frontends and the exporter, then the engine, then the workers, and removes the
# sockets. Options the supervisor does not know go to every program whose --help lists them.
# vLLM's spellings are taken where they mean the same: `up MODEL`, --tensor-parallel-size (-tp),
# --lora-modules with several values and in its JSON form, --enable-lora (LoRA is always on),
# --disable-log-requests (no program logs requests) and --uvicorn-log-level LEVEL (checked
# against vLLM's choices; the frontends' HTTP server has no log levels).
# The run directory must be the caller's and writable by no one else, and so must be every
# directory above it unless it is root's (a shared one such as /tmp must be sticky): another
# user could otherwise plant the sockets, the registry or the supervisor.pid that `down` signals.
# `down` signals the pid of supervisor.pid only when /proc says it is this run directory's
# supervisor (lora-stack _supervise RUN_DIR, run by the caller).
# Exit codes: 0 ok, 1 not running / not healthy, 100 usage or an unsafe run directory, 111 a
# program did not start.
set -u
shopt -s nullglob

PROG=lora-stack
BIN=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
SELF=$(readlink -f "$0")
READY_TIMEOUT=${LORA_STACK_READY_TIMEOUT:-180}
HEALTH_POLL_S=2 # how often the supervisor asks the engine whether it is healthy

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "fatal: $2"; exit "$1"; }

usage() {
    cat <<'EOF'
usage: lora-stack up [MODEL] [--run-dir DIR] [--model DIR] [--tp N] [--device DEVICE]
                     [--frontends N] [--port N] [--metrics-port N]
                     [--lora-modules NAME=PATH...]... [PROGRAM OPTIONS]
       lora-stack status [--run-dir DIR]
       lora-stack logs [PROGRAM] [--run-dir DIR]
       lora-stack down [--run-dir DIR]

  --run-dir DIR          sockets, logs and pids (default $XDG_RUNTIME_DIR/lora-stack when
                         that is yours, else /tmp/lora-stack-UID); mode 0700; refused when
                         another user owns it or may write to it
  --model DIR, MODEL     Hugging Face model directory (default: the demo model and adapters);
                         as vLLM's `vllm serve MODEL`, it may be the first argument of up
  --tp N, --tensor-parallel-size N, -tp N
                         tensor-parallel ranks: worker processes (default 1)
  --device DEVICE        the workers' compute device: cpu, cuda or cuda:N (default cpu;
                         environment LORA_STACK_DEVICE); checked before anything starts; on
                         GPUs each rank has its own, rank R cuda:R (or cuda:N+R)
  --gpu-memory-utilization F
                         as vLLM's, for the engine: each GPU rank may hold F of its device,
                         the KV cache what is left (default 0.9 with --device cuda unless
                         --kv-cache-bytes or --kv-cache-fraction is given); refused on cpu
  --frontends N          HTTP frontends (default 1), on ports PORT, PORT+1, ...
  --port N               the first frontend's port (default 8000)
  --metrics-port N       lora-metrics' port (default 9100)
  --lora-modules N=P...  adapters loaded before ready: NAME=PATH or vLLM's JSON
                         {"name":..,"path":..}, several after one flag or the flag repeated
                         (default with the demo model: its three adapters); the engine's
                         registry in RUN_DIR/adapters.json, once written, decides what a
                         restart loads (see lora-engine(1))
  --enable-lora          accepted, as vLLM's: LoRA is always on
  --disable-log-requests accepted, as vLLM's: no program logs requests
  --uvicorn-log-level L  accepted, as vLLM's (critical, error, warning, info, debug, trace);
                         the frontends' HTTP server has no log levels
  --generation-config G  checked as vLLM checks it (auto, vllm or a folder), then given to
                         the programs that list it in their --help
  --host ADDR            HTTP address of the frontends and the exporter (default 127.0.0.1)
  --unhealthy-timeout S  restart the engine and its ranks once the engine has said it is
                         unhealthy for S seconds while every process runs (default 30;
                         0: never; environment LORA_STACK_UNHEALTHY_TIMEOUT)
  -h, --help             this help
Any other option goes to every program that lists it in its --help (for example --max-loras 2
--max-cpu-loras 3 to the engine, --enable-runtime-lora --lora-root DIR to the frontends).
EOF
}

# ---- options ---------------------------------------------------------------------------------

UID_SELF=$(id -u)
# The default run directory: under XDG_RUNTIME_DIR when that is a directory of ours, else one
# per user in /tmp, which check_run_dir refuses when someone else made it first.
if [ -n "${XDG_RUNTIME_DIR:-}" ] && [ -d "$XDG_RUNTIME_DIR" ] && [ ! -L "$XDG_RUNTIME_DIR" ] &&
    [ "$(stat -c %u "$XDG_RUNTIME_DIR")" = "$UID_SELF" ]; then
    RUN_DIR=$XDG_RUNTIME_DIR/lora-stack
else
    RUN_DIR=/tmp/lora-stack-$UID_SELF
fi
MODEL="" TP=1 FRONTENDS=1 PORT=8000 METRICS_PORT=9100 HOST=127.0.0.1
DEVICE=${LORA_STACK_DEVICE:-cpu} DEVICE_DESC=""
UNHEALTHY_TIMEOUT=${LORA_STACK_UNHEALTHY_TIMEOUT:-30} UNHEALTHY_FROM=--unhealthy-timeout
[ -z "${LORA_STACK_UNHEALTHY_TIMEOUT:-}" ] || UNHEALTHY_FROM=LORA_STACK_UNHEALTHY_TIMEOUT
MODULES=() PASS=()

is_number() { [[ $1 =~ ^[0-9]+$ ]]; }

parse() {
    while [ $# -gt 0 ]; do
        local opt=$1 val=""
        case $opt in
        --*=*) val=${opt#*=}; opt=${opt%%=*}; set -- "$opt" "$val" "${@:2}" ;;
        esac
        case $opt in
        -h | --help) usage; exit 0 ;;
        --enable-lora | --disable-log-requests) shift; continue ;;
        --no-enable-lora) die 100 "--no-enable-lora: LoRA is always on in lora-stack" ;;
        --uvicorn-log-level)
            [ $# -ge 2 ] || die 100 "$opt needs a value"
            case $2 in
            critical | error | warning | info | debug | trace) ;;
            *) die 100 "--uvicorn-log-level '$2' must be one of critical, error, warning, info, debug, trace" ;;
            esac
            shift 2; continue ;;
        --generation-config)
            # Checked here as vLLM checks it; the programs that list it in --help get it.
            [ $# -ge 2 ] || die 100 "$opt needs a value"
            case $2 in
            auto | vllm) ;;
            *) [ -d "$2" ] || die 100 "--generation-config '$2' must be auto, vllm or a folder" ;;
            esac
            PASS+=("$1" "$2"); shift 2; continue ;;
        --lora-modules)
            # vLLM's nargs='+': every value up to the next option.
            [ $# -ge 2 ] && [[ $2 != -* ]] || die 100 "$opt needs a value"
            shift
            while [ $# -gt 0 ] && [[ $1 != -* ]]; do MODULES+=("$1"); shift; done
            continue ;;
        --run-dir | --model | --tp | --tensor-parallel-size | -tp | --device | --frontends | --port | --metrics-port | --host | --unhealthy-timeout)
            [ $# -ge 2 ] || die 100 "$opt needs a value"
            case $opt in
            --run-dir) RUN_DIR=$2 ;;
            --unhealthy-timeout) UNHEALTHY_TIMEOUT=$2 UNHEALTHY_FROM=$opt ;;
            --model) MODEL=$2 ;;
            --tp | --tensor-parallel-size | -tp) TP=$2 ;;
            --device) DEVICE=$2 ;;
            --frontends) FRONTENDS=$2 ;;
            --port) PORT=$2 ;;
            --metrics-port) METRICS_PORT=$2 ;;
            --host) HOST=$2 ;;
            esac
            shift 2 ;;
        --*) PASS+=("$1"); shift ;;
        *) PASS+=("$1"); shift ;;
        esac
    done
    for n in "$TP" "$FRONTENDS" "$PORT" "$METRICS_PORT"; do
        is_number "$n" || die 100 "'$n' is not a number"
    done
    is_number "$UNHEALTHY_TIMEOUT" && [ "${#UNHEALTHY_TIMEOUT}" -le 6 ] ||
        die 100 "$UNHEALTHY_FROM '$UNHEALTHY_TIMEOUT' must be a number of seconds (0 to 999999)"
    UNHEALTHY_TIMEOUT=$((10#$UNHEALTHY_TIMEOUT))
    [ -n "$RUN_DIR" ] || die 100 "--run-dir is empty"
    check_links "$RUN_DIR"
    # One spelling of the run directory, whatever the working directory: the supervisor's
    # command line carries it, and down compares it.
    RUN_DIR=$(realpath -m -- "$RUN_DIR")
    [ "$TP" -ge 1 ] && [ "$FRONTENDS" -ge 0 ] || die 100 "--tp must be 1 or more, --frontends 0 or more"
    [ "$PORT" -ge 1 ] && [ "$((PORT + FRONTENDS))" -le 65536 ] && [ "$METRICS_PORT" -ge 1 ] &&
        [ "$METRICS_PORT" -le 65535 ] || die 100 "ports must be 1 to 65535"
}

# The options a program lists in its --help: "name 1" (takes a value) or "name 0".
options_of() {
    "$@" --help 2> /dev/null | sed -n 's/^  \(--[a-z][a-z0-9-]*\)\( [A-Z][A-Z=_]*\)\{0,1\} .*/\1 \2/p' |
        awk '{ print $1, (NF > 1 ? 1 : 0) }'
}

# Splits PASS into the options of each program: ENGINE_ARGS, WORKER_ARGS, FRONTEND_ARGS,
# METRICS_ARGS. An option no program knows is a usage error.
route_options() {
    local -A takes=() owner=()
    local p line name arg
    for p in engine worker frontend metrics; do
        local cmd=("$BIN/lora-$p")
        [ "$p" = worker ] && cmd=("$BIN/lora-worker" serve)
        [ -x "$BIN/lora-$p" ] || continue
        while read -r name arg; do
            takes[$name]=$arg
            owner[$name]="${owner[$name]:-} $p"
        done < <(options_of "${cmd[@]}")
    done
    ENGINE_ARGS=() WORKER_ARGS=() FRONTEND_ARGS=() METRICS_ARGS=()
    local i=0
    while [ $i -lt ${#PASS[@]} ]; do
        name=${PASS[$i]}
        [ -n "${owner[$name]:-}" ] || die 100 "no program of the stack takes '$name'"
        local vals=("$name")
        if [ "${takes[$name]}" = 1 ]; then
            [ $((i + 1)) -lt ${#PASS[@]} ] || die 100 "$name needs a value"
            vals+=("${PASS[$((i + 1))]}")
            i=$((i + 1))
        fi
        for p in ${owner[$name]}; do
            case $p in
            engine) ENGINE_ARGS+=("${vals[@]}") ;;
            worker) WORKER_ARGS+=("${vals[@]}") ;;
            frontend) FRONTEND_ARGS+=("${vals[@]}") ;;
            metrics) METRICS_ARGS+=("${vals[@]}") ;;
            esac
        done
        i=$((i + 1))
    done
}

# ---- the run directory -----------------------------------------------------------------------

# check_links PATH: refuses (exit 100) a symbolic link on the way to PATH that neither the caller
# nor root owns, since its owner could point it elsewhere at any moment.
check_links() {
    local abs=$1 p="" part owner parts=()
    [[ $abs == /* ]] || abs=$PWD/$abs
    IFS=/ read -r -a parts <<< "$abs"
    for part in "${parts[@]}"; do
        [ -n "$part" ] || continue
        p=$p/$part
        [ -L "$p" ] || continue
        owner=$(stat -c %u -- "$p") || die 111 "unable to examine '$p'"
        [ "$owner" = 0 ] || [ "$owner" = "$UID_SELF" ] ||
            die 100 "run directory '$1': '$p' is a symbolic link owned by uid $owner"
    done
}

# check_run_dir DIR (resolved, existing): refuses (exit 100, with the reason) a directory that
# another user owns or may write to, or below a directory that someone other than the caller and
# root owns, or that others may write to without the sticky bit (as /tmp has): whoever can write
# there can move DIR away and put their own in its place.
check_run_dir() {
    local dir=$1 p owner mode
    [ -d "$dir" ] || die 100 "run directory '$dir' is not a directory"
    read -r owner mode < <(stat -c '%u %a' -- "$dir") && [ -n "$mode" ] ||
        die 111 "unable to examine run directory '$dir'"
    [ "$owner" = "$UID_SELF" ] ||
        die 100 "run directory '$dir' is owned by uid $owner, not by you (uid $UID_SELF); choose another with --run-dir"
    [ $((8#$mode & 8#022)) = 0 ] ||
        die 100 "run directory '$dir' is writable by group or others (mode $(printf %04o $((8#$mode)))); chmod go-w it or choose another with --run-dir"
    p=$dir
    while [ "$p" != / ]; do
        p=$(dirname -- "$p")
        read -r owner mode < <(stat -c '%u %a' -- "$p") && [ -n "$mode" ] ||
            die 111 "unable to examine '$p'"
        [ "$owner" = 0 ] || [ "$owner" = "$UID_SELF" ] ||
            die 100 "run directory '$dir' lies in '$p', which uid $owner owns"
        [ $((8#$mode & 8#022)) = 0 ] || [ $((8#$mode & 8#1000)) != 0 ] ||
            die 100 "run directory '$dir' lies in '$p', which group or others may write to (mode $(printf %04o $((8#$mode))), not sticky)"
    done
}

# is_supervisor PID: whether PID is this run directory's supervisor: a process of the caller's
# whose command line is this script's name, _supervise and the run directory. A supervisor.pid
# left by a crash may name a process that has since reused the number; that one is not signalled.
is_supervisor() {
    local p=$1 i args=()
    [[ $p =~ ^[1-9][0-9]{0,9}$ ]] && [ -d "/proc/$p" ] || return 1
    [ "$(stat -c %u "/proc/$p" 2> /dev/null)" = "$UID_SELF" ] || return 1
    mapfile -d '' args < "/proc/$p/cmdline" 2> /dev/null || return 1
    for ((i = 0; i + 2 < ${#args[@]}; i++)); do
        [ "${args[i]##*/}" = "${SELF##*/}" ] && [ "${args[i + 1]}" = _supervise ] &&
            [ "${args[i + 2]}" = "$RUN_DIR" ] && return 0
    done
    return 1
}

# ---- the supervisor --------------------------------------------------------------------------

declare -A PID=() STARTED=() BACKOFF=()
STOPPING=0
TICK="" UNHEALTHY_SINCE="" # the health ticker's pid; since when the engine is not healthy

# start NAME CMD...: runs CMD with its stderr through a reader that appends it to logs/NAME.log
# and writes one line into ready/NAME (a FIFO) when the program says it is ready.
start() {
    local name=$1
    shift
    local log="$RUN_DIR/logs/$name.log" fifo="$RUN_DIR/ready/$name"
    rm -f "$fifo"
    mkfifo -m 0600 "$fifo"
    # The reader holds the FIFO open for writing while it lives, so the waiting side sees
    # end of file, not a hang, when the program dies before its ready line.
    "$@" < /dev/null > >(cat >> "$log") 2> >(
        exec 9<> "$fifo"
        while IFS= read -r line; do
            printf '%s\n' "$line" >> "$log"
            case $line in
            *": ready"*) printf 'ready\n' >&9 ;;
            "lora-engine: error: worker rank "*" (pid "*") is dead"*) kill_dead_worker "$line" ;;
            esac
        done
    ) &
    PID[$name]=$!
    STARTED[$name]=$SECONDS
}

# kill_dead_worker LINE: the engine declared a worker dead ("worker rank R (pid P) is dead")
# although its process may live on (stopped, hung): kill it, so that it exits and is restarted.
# Only a lora-worker of this run directory is killed, whatever pid the line names.
kill_dead_worker() {
    local p=${1#*"(pid "}
    p=${p%%")"*}
    [[ $p =~ ^[0-9]+$ ]] || return 0
    local cmd
    cmd=$(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null) || return 0
    [[ $cmd == *"lora-worker serve "*"ipc://$RUN_DIR/worker.sock"* ]] || return 0
    kill -KILL "$p" 2> /dev/null || true
}

# alive PID: the process runs (exited but not yet reaped counts as exited).
alive() {
    local s
    [ -n "$1" ] && read -r s 2> /dev/null < "/proc/$1/stat" || return 1
    s=${s##*") "}
    [ "${s%% *}" != Z ]
}

# wait_ready NAME [OTHER...]: 0 once NAME said it is ready; 1 when the timeout passed or as soon
# as NAME or one of OTHER exited (a worker rank that dies before its hello would leave the engine
# waiting out the whole timeout), with its name in NOT_READY.
wait_ready() {
    local line="" part="" deadline=$((SECONDS + READY_TIMEOUT)) n fd rc=1
    NOT_READY=$1
    # Read-write: opening a FIFO only for reading blocks until a writer opens it, and a program
    # that dies at once takes its reader (the writer) with it before this opens; the loop below
    # sees its exit instead.
    exec {fd}<> "$RUN_DIR/ready/$1"
    while :; do
        # A read that times out keeps what it had read of the line (bash reads a pipe a byte at
        # a time, and a busy machine can stop it mid-line): the next read completes it.
        if read -r -t 0.2 -u "$fd" line; then
            line=$part$line part=""
            if [ "$line" = ready ]; then
                alive "${PID[$1]}" && rc=0
                break
            fi
        else
            part=$part$line
        fi
        for n in "$@"; do
            if ! alive "${PID[$n]}"; then
                NOT_READY=$n
                break 2
            fi
        done
        [ $SECONDS -lt $deadline ] || break
    done
    exec {fd}<&-
    return $rc
}

write_pids() {
    : > "$RUN_DIR/pids.new"
    local n
    for n in "${!PID[@]}"; do printf '%s %s\n' "$n" "${PID[$n]}" >> "$RUN_DIR/pids.new"; done
    mv "$RUN_DIR/pids.new" "$RUN_DIR/pids"
}

stop_pids() { # NAMES...: SIGTERM, then SIGKILL after 10 s
    local n p pids=()
    for n in "$@"; do
        p=${PID[$n]:-}
        [ -n "$p" ] && kill -TERM "$p" 2> /dev/null && pids+=("$p")
        # A stopped program (a hung rank someone stopped) acts on the SIGTERM only once continued.
        [ -n "$p" ] && kill -CONT "$p" 2> /dev/null
    done
    local deadline=$((SECONDS + 10))
    for p in "${pids[@]}"; do
        # Bounded: a program that ignores SIGTERM is killed after 10 s.
        while kill -0 "$p" 2> /dev/null && [ $SECONDS -lt $deadline ]; do
            timeout 0.2 tail --pid="$p" -f /dev/null
        done
        kill -KILL "$p" 2> /dev/null
        wait "$p" 2> /dev/null || true
    done
    for n in "$@"; do unset "PID[$n]"; done
}

names_of() { # PREFIX: the running names that start with it
    local n
    for n in "${!PID[@]}"; do [[ $n == "$1"* ]] && printf '%s\n' "$n"; done | sort
}

start_engine_group() {
    local r
    # The worker ranks connect first; the engine waits for every hello.
    for ((r = 0; r < TP; r++)); do start_worker "$r"; done
    local mods=()
    for m in "${MODULES[@]}"; do mods+=(--lora-modules "$m"); done
    start engine "$BIN/lora-engine" --model "$MODEL" --run-dir "$RUN_DIR" \
        --tensor-parallel-size "$TP" "${mods[@]}" "${ENGINE_ARGS[@]}"
    wait_ready engine $(names_of worker-)
}

start_frontend() { # K
    start "frontend-$1" "$BIN/lora-frontend" --run-dir "$RUN_DIR" --host "$HOST" \
        --port "$((PORT + $1))" --publish-endpoint "ipc://$RUN_DIR/frontend-$1.sock" \
        "${FRONTEND_ARGS[@]}"
    wait_ready "frontend-$1"
}

start_metrics() {
    local fes=() k
    for ((k = 0; k < FRONTENDS; k++)); do fes+=(--frontend "ipc://$RUN_DIR/frontend-$k.sock"); done
    start metrics "$BIN/lora-metrics" --engine "ipc://$RUN_DIR/publish.sock" "${fes[@]}" \
        --listen "$HOST:$METRICS_PORT" "${METRICS_ARGS[@]}"
    wait_ready metrics
}

# rank_device RANK: the CPU for every rank, or one GPU per rank: with cuda (or cuda:K) rank R
# computes on cuda:R (cuda:K+R), as vLLM's ranks take the GPUs in order.
rank_device() {
    case $DEVICE in
    cuda) echo "cuda:$1" ;;
    cuda:*) echo "cuda:$((10#${DEVICE#cuda:} + $1))" ;;
    *) echo "$DEVICE" ;;
    esac
}

start_worker() { # RANK
    OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} start "worker-$1" "$BIN/lora-worker" serve \
        --engine "ipc://$RUN_DIR/worker.sock" --rank "$1" --device "$(rank_device "$1")" \
        "${WORKER_ARGS[@]}"
}

# readmit_worker NAME: restarts worker NAME alone and waits until the running engine has taken
# it back (its log says "rank R is back"); 1 when it did not within the ready timeout.
readmit_worker() {
    local r=${1#worker-} log="$RUN_DIR/logs/engine.log" from line deadline
    from=$(($(stat -c %s "$log" 2> /dev/null || echo 0) + 1))
    start_worker "$r"
    deadline=$((SECONDS + READY_TIMEOUT))
    while [ $SECONDS -lt $deadline ] && kill -0 "${PID[engine]:-0}" 2> /dev/null &&
        kill -0 "${PID[$1]:-0}" 2> /dev/null; do
        line=$(tail -c +"$from" "$log" | grep -a -m 1 "^lora-engine: rank $r is back: ")
        if [ -n "$line" ]; then
            say "restarted $1 alone; the engine took it back: ${line#*"; "}"
            return 0
        fi
        sleep 0.05
    done
    return 1
}

# What a restart of NAME means: the whole engine group, or NAME alone.
restart() {
    local name=$1 group=$1
    case $name in worker-* | engine) group=engine ;; esac
    # One rank: the running engine takes a new worker process back.
    if [[ $name == worker-* ]] && [ "$TP" = 1 ] && kill -0 "${PID[engine]:-0}" 2> /dev/null; then
        group=$name
    fi
    local ran=$((SECONDS - ${STARTED[$name]:-0}))
    # A worker the engine takes back costs no other program anything: its first restart is
    # immediate (then 1, 2, 4 ... s), so that the engine serves again within a few seconds.
    local first=1
    [[ $group == worker-* ]] && first=0
    local delay=${BACKOFF[$group]:-$first}
    [ "$ran" -ge 60 ] && delay=$first
    local what=$group
    case $group in engine) what="the engine and its ranks" ;; worker-*) what="$name alone" ;; esac
    say "warning: $name exited; restarting $what in $delay s"
    BACKOFF[$group]=$((delay * 2 > 30 ? 30 : delay < 1 ? 1 : delay * 2))
    sleep "$delay" & # the backoff itself; a SIGTERM meanwhile still stops the stack at once
    wait $! 2> /dev/null
    [ "$STOPPING" = 1 ] && return
    case $group in
    worker-*)
        if ! readmit_worker "$name"; then
            say "warning: the engine did not take $name back; restarting the engine and its ranks"
            restart_engine_group "after $name exited"
        fi
        ;;
    engine)
        restart_engine_group "after $name exited"
        ;;
    frontend-*)
        if start_frontend "${name#frontend-}"; then
            say "restarted $name; it learns the adapter registry from the engine"
        else
            say "warning: $name did not come back"
        fi
        ;;
    metrics)
        if start_metrics; then
            say "restarted lora-metrics"
        else
            say "warning: lora-metrics did not come back"
        fi
        ;;
    esac
    write_pids
}

# start_ticker: a child that the main loop waits for like the others, so that the supervisor
# never blocks in a command of its own (a stop or a program's exit is seen at once): it sleeps
# HEALTH_POLL_S, then, with --unhealthy-timeout, asks the engine whether it is healthy (bounded)
# and exits with the answer; with --unhealthy-timeout 0 it only sleeps (its exit still makes the
# loop sweep for exits it missed).
start_ticker() {
    if [ "$UNHEALTHY_TIMEOUT" -gt 0 ] && [ -x "$BIN/lora-inspect" ]; then
        (sleep "$HEALTH_POLL_S" && exec timeout -k 1 10 "$BIN/lora-inspect" health \
            --run-dir "$RUN_DIR" --timeout-ms 3000 --json > /dev/null 2> "$RUN_DIR/health.err") &
    else
        sleep "$HEALTH_POLL_S" &
    fi
    TICK=$!
}

# sweep: restarts every program that is gone although no wait reported it. `wait -n` reports
# each child once, and a child that exits while the supervisor is busy (a restart's backoff, a
# readmission) can be reaped without being reported to the loop. 1 when it restarted one.
sweep() {
    local n rc=0
    for n in "${!PID[@]}"; do
        [ "$STOPPING" = 1 ] && return 1
        kill -0 "${PID[$n]}" 2> /dev/null && continue
        unset "PID[$n]"
        restart "$n"
        UNHEALTHY_SINCE="" rc=1
    done
    return $rc
}

# health RC: the ticker's answer (lora-inspect health's exit status); once the engine has not been
# healthy for UNHEALTHY_TIMEOUT seconds, restarts the engine group. An engine that does not answer
# at all counts as unhealthy: a live engine that cannot answer its control socket for that long
# is hung.
health() {
    local rc=$1 why
    [ "$UNHEALTHY_TIMEOUT" -gt 0 ] || return 0
    if [ "$rc" = 0 ]; then
        [ -z "$UNHEALTHY_SINCE" ] || say "the engine is healthy again"
        UNHEALTHY_SINCE=""
        return 0
    fi
    why=$(tail -n 1 "$RUN_DIR/health.err" 2> /dev/null)
    why=${why#lora-inspect: }
    why=${why#*is unhealthy: }
    [ -n "$why" ] || why="lora-inspect health exited $rc"
    if [ -z "$UNHEALTHY_SINCE" ]; then
        UNHEALTHY_SINCE=$SECONDS
        say "warning: the engine is not healthy ($why); it restarts with its ranks if it stays so for $UNHEALTHY_TIMEOUT s"
    fi
    [ $((SECONDS - UNHEALTHY_SINCE)) -ge "$UNHEALTHY_TIMEOUT" ] || return 0
    local cause="as it was not healthy for $((SECONDS - UNHEALTHY_SINCE)) s while every process ran"
    say "warning: the engine is still not healthy ($why); restarting the engine and its ranks"
    restart_engine_group "$cause"
    UNHEALTHY_SINCE=""
    write_pids
}

# restart_engine_group CAUSE: stops the engine and its ranks, starts them again at once (the
# registry file brings the adapters back), and says why ("after worker-1 exited", "as it was not
# healthy for 15 s ...") and what the engine restored.
restart_engine_group() {
    # What the new engine writes to its log starts after this byte.
    local log="$RUN_DIR/logs/engine.log" from restored dropped
    from=$(($(stat -c %s "$log" 2> /dev/null || echo 0) + 1))
    stop_pids engine $(names_of worker-)
    rm -f "$RUN_DIR"/worker.sock "$RUN_DIR"/frontend.sock "$RUN_DIR"/control.sock \
        "$RUN_DIR"/publish.sock
    if start_engine_group; then
        restored=$(tail -c +"$from" "$log" | grep -a '^lora-engine: restored: ' | tail -n 1)
        restored=${restored#lora-engine: }
        dropped=$(tail -c +"$from" "$log" | grep -ac 'cannot be restored')
        [ "$dropped" = 0 ] || restored="$restored; $dropped adapter(s) dropped, see $log"
        say "restarted the engine and its $TP rank$([ "$TP" = 1 ] || echo s) $1;" \
            "${restored:-no adapter registry to restore}"
    else
        say "warning: the engine did not come back; retrying"
    fi
}

shutdown() {
    STOPPING=1
    [ -z "$TICK" ] || kill "$TICK" 2> /dev/null
    stop_pids $(names_of frontend-) metrics
    stop_pids engine
    stop_pids $(names_of worker-)
    rm -f "$RUN_DIR"/*.sock "$RUN_DIR/pids" "$RUN_DIR/supervisor.pid" "$RUN_DIR/health.err"
    rm -rf "$RUN_DIR/ready"
    say "stopped"
    exit 0
}

supervise() {
    trap shutdown TERM INT
    mkdir -p "$RUN_DIR/logs" "$RUN_DIR/ready"
    : > "$RUN_DIR/pids.new"
    local urls="" k
    local from
    from=$(($(stat -c %s "$RUN_DIR/logs/engine.log" 2> /dev/null || echo 0) + 1))
    if ! start_engine_group; then
        if [ "$NOT_READY" = engine ]; then
            say "fatal: lora-engine did not become ready; see $RUN_DIR/logs/engine.log"
        else
            say "fatal: $NOT_READY exited before lora-engine was ready; see" \
                "$RUN_DIR/logs/$NOT_READY.log"
        fi
        printf 'failed %s\n' "$NOT_READY" > "$RUN_DIR/up.fifo"
        shutdown
    fi
    # A run directory used before: say what the engine's registry brought back.
    local restored
    restored=$(tail -c +"$from" "$RUN_DIR/logs/engine.log" | grep -a '^lora-engine: restored: ' |
        tail -n 1)
    [ -z "$restored" ] || say "started the engine; ${restored#lora-engine: }"
    for ((k = 0; k < FRONTENDS; k++)); do
        if ! start_frontend "$k"; then
            printf 'failed frontend-%s\n' "$k" > "$RUN_DIR/up.fifo"
            shutdown
        fi
        urls="$urls http://$HOST:$((PORT + k))/v1"
    done
    if [ -x "$BIN/lora-metrics" ]; then
        if ! start_metrics; then
            printf 'failed metrics\n' > "$RUN_DIR/up.fifo"
            shutdown
        fi
        urls="$urls metrics=http://$HOST:$METRICS_PORT/metrics"
    fi
    write_pids
    printf 'ready%s\n' "$urls" > "$RUN_DIR/up.fifo"
    local exited rc n
    start_ticker
    while :; do
        exited=""
        wait -n -p exited 2> /dev/null
        rc=$?
        [ "$STOPPING" = 1 ] && break
        [ -n "$exited" ] || continue
        if [ "$exited" = "$TICK" ]; then
            # An answer from before a restart says nothing about the new engine.
            sweep && [ "$STOPPING" = 0 ] && health "$rc"
            start_ticker
            continue
        fi
        for n in "${!PID[@]}"; do
            if [ "${PID[$n]}" = "$exited" ]; then
                unset "PID[$n]"
                restart "$n"
                UNHEALTHY_SINCE=""
                break
            fi
        done
        # The ticker's own exit can be reaped during a restart too: a new one if it is gone.
        [ "$STOPPING" = 1 ] || kill -0 "$TICK" 2> /dev/null || start_ticker
    done
}

supervisor_pid() {
    local p
    p=$(cat "$RUN_DIR/supervisor.pid" 2> /dev/null) || return 1
    is_supervisor "$p" && printf '%s\n' "$p"
}

# in_run_dir: refuses a run directory that exists and is not safe (status, logs, down).
in_run_dir() {
    [ ! -e "$RUN_DIR" ] || check_run_dir "$RUN_DIR"
}

# ---- commands --------------------------------------------------------------------------------

# check_device: opens --device as a worker would (lora-worker device, given the workers'
# precision flags), and the last rank's GPU when each rank has its own, and keeps the first
# one's description for the ready line; a device no worker could use, or a precision flag the
# workers would refuse, fails here with the worker's reason (100), before a run directory is
# touched.
check_device() {
    local line rc i dev prec=()
    for ((i = 0; i < ${#WORKER_ARGS[@]}; i++)); do
        case ${WORKER_ARGS[$i]} in
        --dtype | --quantization | --lora-dtype | --kv-cache-dtype | --matmul-precision)
            prec+=("${WORKER_ARGS[$i]}" "${WORKER_ARGS[$((i + 1))]}") ;;
        esac
    done
    local devs=("$DEVICE")
    [ "$TP" = 1 ] || [[ $DEVICE != cuda* ]] || devs+=("$(rank_device $((TP - 1)))")
    for dev in "${devs[@]}"; do
        line=$("$BIN/lora-worker" device --device "$dev" "${prec[@]}" 2>&1)
        rc=$?
        line=${line#lora-worker: fatal: }
        [ "$rc" = 0 ] || die "$([ "$rc" = 100 ] && echo 100 || echo 111)" "$line"
        [ -n "$DEVICE_DESC" ] || DEVICE_DESC=${line%%: *}
    done
    [ ${#devs[@]} = 1 ] || DEVICE_DESC="$DEVICE_DESC to ${devs[1]}"
}

# kv_budget: as vLLM, a GPU rank's KV cache takes what --gpu-memory-utilization (default 0.9)
# of its device leaves after weights, adapter slots and activations, unless the engine is given
# another budget; on the CPU the flag is refused (100): there it is --kv-cache-bytes or
# --kv-cache-fraction.
kv_budget() {
    local a has_util=0 has_other=0
    for a in "${ENGINE_ARGS[@]}"; do
        case $a in
        --gpu-memory-utilization) has_util=1 ;;
        --kv-cache-bytes | --kv-cache-fraction) has_other=1 ;;
        esac
    done
    if [[ $DEVICE == cpu ]]; then
        [ "$has_util" = 0 ] || die 100 "--gpu-memory-utilization sizes a GPU's KV cache and the workers compute on the CPU: give --kv-cache-bytes or --kv-cache-fraction instead"
    elif [ "$has_util" = 0 ] && [ "$has_other" = 0 ]; then
        ENGINE_ARGS+=(--gpu-memory-utilization 0.9)
    fi
}

cmd_up() {
    # vLLM's `vllm serve MODEL`: the model as the first argument.
    local positional=""
    if [ $# -gt 0 ] && [[ $1 != -* ]]; then
        positional=$1
        shift
    fi
    parse "$@"
    if [ -n "$positional" ]; then
        [ -z "$MODEL" ] || [ "$MODEL" = "$positional" ] ||
            die 100 "the model is given twice: '$positional' and --model '$MODEL'"
        MODEL=$positional
    fi
    route_options
    check_device
    kv_budget
    # Made with mode 0700 by this call, or there before: either way checked before any use, so
    # a directory someone else made first (say /tmp/lora-stack-UID) is refused.
    if [ ! -e "$RUN_DIR" ]; then
        mkdir -p -- "$(dirname -- "$RUN_DIR")" && mkdir -m 0700 -- "$RUN_DIR" ||
            [ -d "$RUN_DIR" ] || die 111 "unable to create '$RUN_DIR'"
    fi
    check_run_dir "$RUN_DIR"
    chmod 0700 "$RUN_DIR" || die 111 "unable to make '$RUN_DIR' mode 0700"
    if supervisor_pid > /dev/null; then
        die 1 "a stack is already running in '$RUN_DIR' (lora-stack down --run-dir $RUN_DIR)"
    fi
    if [ -z "$MODEL" ]; then
        MODEL=$("$BIN/lora-worker" demo-model) || die 111 "unable to write the demo model"
        if [ ${#MODULES[@]} -eq 0 ]; then
            for a in "$MODEL"/adapters/*; do MODULES+=("$(basename "$a")=$a"); done
        fi
    fi
    [ -f "$MODEL/config.json" ] || die 100 "--model '$MODEL' has no config.json"
    rm -f "$RUN_DIR/up.fifo"
    mkfifo -m 0600 "$RUN_DIR/up.fifo"
    # The supervisor gets the resolved settings through its environment.
    # Its command line names the run directory: down checks it before it signals the pid.
    LORA_STACK_STATE=$(declare -p RUN_DIR MODEL TP DEVICE FRONTENDS PORT METRICS_PORT HOST \
        MODULES UNHEALTHY_TIMEOUT ENGINE_ARGS WORKER_ARGS FRONTEND_ARGS METRICS_ARGS) \
        setsid "$SELF" _supervise "$RUN_DIR" < /dev/null >> "$RUN_DIR/supervisor.log" 2>&1 &
    echo $! > "$RUN_DIR/supervisor.pid"
    local answer="" fd
    # Read-write, as wait_ready: the timeout bounds the read, and it could not bound the open of a
    # FIFO no supervisor ever opened for writing.
    exec {fd}<> "$RUN_DIR/up.fifo"
    read -r -t "$((READY_TIMEOUT * 3))" -u "$fd" answer || true
    exec {fd}<&-
    rm -f "$RUN_DIR/up.fifo"
    case $answer in
    ready*)
        say "ready in $RUN_DIR (model $MODEL, $TP rank$([ "$TP" = 1 ] || echo s)) on $DEVICE_DESC"
        for u in ${answer#ready}; do printf '%s\n' "$u"; done
        ;;
    *)
        say "fatal: the stack did not start (${answer:-no answer}); logs in $RUN_DIR/logs"
        tail -n 5 "$RUN_DIR"/logs/*.log >&2 2> /dev/null
        exit 111
        ;;
    esac
}

cmd_status() {
    parse "$@"
    in_run_dir
    local sup rc=0
    sup=$(supervisor_pid) || { say "no stack runs in '$RUN_DIR'"; exit 1; }
    printf '%-12s %-8s %s\n' PROGRAM PID STATE
    printf '%-12s %-8s %s\n' supervisor "$sup" running
    while read -r name pid; do
        if kill -0 "$pid" 2> /dev/null; then
            printf '%-12s %-8s %s\n' "$name" "$pid" running
        else
            printf '%-12s %-8s %s\n' "$name" "$pid" restarting
            rc=1
        fi
    done < <(sort "$RUN_DIR/pids" 2> /dev/null)
    exit $rc
}

cmd_logs() {
    local which=""
    if [ $# -gt 0 ] && [[ $1 != --* ]]; then which=$1; shift; fi
    parse "$@"
    in_run_dir
    local f found=0
    for f in "$RUN_DIR"/logs/*.log "$RUN_DIR/supervisor.log"; do
        local base
        base=$(basename "$f" .log)
        [ -z "$which" ] || [[ $base == "$which"* ]] || [[ lora-$base == "$which"* ]] || continue
        found=1
        [ -n "$which" ] || printf '==> %s <==\n' "$base"
        cat "$f"
    done
    [ $found = 1 ] || die 1 "no logs for '${which:-any program}' in '$RUN_DIR'"
}

cmd_down() {
    parse "$@"
    in_run_dir
    local sup p
    if ! sup=$(supervisor_pid); then
        p=$(cat "$RUN_DIR/supervisor.pid" 2> /dev/null)
        [[ ! $p =~ ^[0-9]+$ ]] || [ ! -d "/proc/$p" ] ||
            say "warning: '$RUN_DIR/supervisor.pid' names pid $p, which is not this run directory's supervisor; not signalling it"
        say "no stack runs in '$RUN_DIR'"
        exit 0
    fi
    kill -TERM "$sup"
    # Not our child: wait for it through /proc, bounded.
    timeout 60 tail --pid="$sup" -f /dev/null
    kill -0 "$sup" 2> /dev/null && { kill -KILL "$sup"; die 111 "the supervisor did not stop"; }
    say "down: '$RUN_DIR'"
}

[ $# -ge 1 ] || { usage >&2; exit 100; }
command=$1
shift
case $command in
up) cmd_up "$@" ;;
status) cmd_status "$@" ;;
logs) cmd_logs "$@" ;;
down) cmd_down "$@" ;;
_supervise)
    eval "$LORA_STACK_STATE"
    supervise
    ;;
-h | --help) usage ;;
--version) echo "lora-stack 0.1.0" ;;
*) usage >&2; die 100 "unknown command '$command'" ;;
esac
