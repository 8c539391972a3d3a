#!/usr/bin/env bats
# The router's view of lora-stack: tests/ref/router_view.py ranks endpoints for an adapter with
# two scorers of the llm-d router's endpoint picker, from real engines' scrapes, one engine and
# worker per endpoint, each scraped on a frontend's inference port (GET /metrics, where the
# router scrapes), in two meanings of vllm:lora_requests_info: the
# default --lora-info resident and --lora-info inflight (vLLM's meaning; router_view.py
# --as-vllm adds vLLM's habit of writing one list into both labels).
#   - The lora-affinity-scorer (1.0 active, 0.8 room for one more, 0.6 waiting, else 0.0), in
#     the cases where vLLM's sets mislead it: an adapter whose only request is queued, a
#     resident adapter with no requests, and an endpoint whose slots are full.
#   - The lora-load-state-scorer (1.0 in a slot, 0.7 in the CPU cache only, 0.6 a free slot,
#     0.3 an idle unpinned adapter to evict, else 0.0), once per tier.
#
# Endpoints shared by the file, which never get requests: A (2 slots) holds x and y in its
# slots; B (2 slots) holds w only; C (1 slot) holds y in its slot and x in its CPU cache; P (1
# slot) holds x pinned. Q (1 slot, with a frontend) is started by the test that queues requests
# on it. Every process is recorded in a pid file and stopped in teardown.

load ../helpers
bats_require_minimum_version 1.5.0

VIEW="$PYTHON $ROOT/tests/ref/router_view.py"
STEP_MS=20 # slows every step, so that a held-open stream keeps its slot while the test looks

# finish_endpoint DIR PIDFILE, after start_engine_group DIR PIDFILE: waits for the engine,
# starts its two frontends, one per meaning of vllm:lora_requests_info, and writes
# DIR/resident.port and DIR/inflight.port: their inference ports, which the router scrapes.
finish_endpoint() {
    local dir=$1 pids=$2 mode
    wait_for_text "$dir/engine.err" "lora-engine: ready:" 30
    for mode in resident inflight; do
        "$LORA_BIN/lora-frontend" --run-dir "$dir" --lora-info "$mode" --port 0 \
            --publish-endpoint "ipc://$dir/frontend-$mode.sock" 2> "$dir/frontend-$mode.err" 3>&- &
        echo $! >> "$pids"
    done
    for mode in resident inflight; do
        wait_for_text "$dir/frontend-$mode.err" "lora-frontend: ready: http://" 30
        ready_port "$dir/frontend-$mode.err" > "$dir/$mode.port"
        [ -s "$dir/$mode.port" ]
    done
}

# The page the router scrapes for the endpoint whose directory is $dir, in the --lora-info
# meaning $mode: /metrics on the inference port of the endpoint's frontend for that meaning.
SCRAPE_URL='http://127.0.0.1:$(cat "$dir/$mode.port")/metrics'

# For a stack started with lora-stack up --port PORT: the router scrapes PORT itself.
STACK_SCRAPE_OFFSET=0

url() { # DIR MODE
    local dir=$1 mode=$2
    eval "echo \"$SCRAPE_URL\""
}

ep() { # NAME MODE: the endpoint argument of router_view.py for the endpoint whose dir is $NAME
    echo "$1=$(url "${!1}" "$2")"
}

setup_file() {
    for v in $(compgen -e); do
        case "$v" in LORA_METRICS_* | LORA_ENGINE_* | LORA_FRONTEND_*) unset "$v" ;; esac
    done
    export D=$BATS_FILE_TMPDIR
    : > "$D/pids"
    make_model_and_adapters "$D" w x y z
    export A=$D/A B=$D/B C=$D/C P=$D/P
    start_engine_group "$A" "$D/pids" "$D/m" --max-loras 2 --max-cpu-loras 4 \
        --lora-modules "x=$D/x" --lora-modules "y=$D/y"
    start_engine_group "$B" "$D/pids" "$D/m" --max-loras 2 --max-cpu-loras 4 \
        --lora-modules "w=$D/w"
    # One slot for two adapters: the second one loaded takes it, the first stays in the cache.
    start_engine_group "$C" "$D/pids" "$D/m" --max-loras 1 --max-cpu-loras 4 \
        --lora-modules "x=$D/x" --lora-modules "y=$D/y"
    start_engine_group "$P" "$D/pids" "$D/m" --max-loras 1 --max-cpu-loras 4 \
        --lora-modules "x=$D/x"
    for e in "$A" "$B" "$C" "$P"; do
        finish_endpoint "$e" "$D/pids"
    done
    "$PYTHON" -c 'import sys
sys.path.insert(0, sys.argv[1])
import client
r = client.control(sys.argv[2], "pin", "x")
sys.exit(0 if r.get("ok") else "pin x: %r" % r)' "$ROOT/tests/ref" "$P"
}

teardown_file() {
    stop_pids "$D/pids"
}

setup() {
    T=$BATS_TEST_TMPDIR
    : > "$T/pids"
}

teardown() {
    stop_pids "$T/pids"
    if [ -n "${STACK_RUN:-}" ]; then
        "$LORA_BIN/lora-stack" down --run-dir "$STACK_RUN" > /dev/null 2>&1 || true
    fi
}

# Scrapes URL $1 into $T/scrape until every further argument, an extended regular expression,
# matches a line of it (15 s at most).
until_scrape() {
    local u=$1 deadline=$((SECONDS + 15)) re ok
    shift
    while :; do
        ok=0
        if curl -sf "$u" > "$T/scrape"; then
            ok=1
            for re in "$@"; do grep -qE -- "$re" "$T/scrape" || { ok=0; break; }; done
        fi
        [ "$ok" = 1 ] && return 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "$u never matched all of: $*" >&2
            grep -e '^vllm:lora' -e '^lora_adapter_requests' -e '^vllm:num_requests' "$T/scrape" >&2
            return 1
        fi
        sleep 0.05
    done
}

# view WANT ARGS...: router_view.py ARGS must print the lines of WANT, joined there by ';'.
view() {
    local want=$1 got
    shift
    got=$($VIEW "$@" | paste -sd ';') || { echo "failed: router_view.py $*" >&2; return 1; }
    [ "$got" = "$want" ] ||
        { echo "router_view.py $*: expected '$want', got '$got'" >&2; return 1; }
}

@test "the endpoints as set up: A holds x and y in its 2 slots, B holds w in 1 of 2, no requests" {
    for mode in resident inflight; do
        until_scrape "$(url "$A" $mode)" \
            '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="gpu"' \
            '^vllm:lora_adapter_loaded\{.*adapter_name="y",level="gpu"' \
            '^vllm:num_gpu_loaded_lora_adapters\{.*\} 2\.0$' \
            '^vllm:num_requests_running\{.*\} 0\.0$'
        until_scrape "$(url "$B" $mode)" \
            '^vllm:lora_adapter_loaded\{.*adapter_name="w",level="gpu"' \
            '^vllm:num_gpu_loaded_lora_adapters\{.*\} 1\.0$' \
            '^vllm:num_requests_running\{.*\} 0\.0$'
    done
    # What the router reads in each meaning: resident lists the adapters in slots; inflight
    # (vLLM's) lists none, since nothing runs.
    view "A running=x,y waiting= max_lora=2;B running=w waiting= max_lora=2" \
        sets "$(ep A resident)" "$(ep B resident)"
    view "A running= waiting= max_lora=2;B running= waiting= max_lora=2" \
        sets "$(ep A inflight)" "$(ep B inflight)"
}

@test "(a) an adapter with only a queued request is waiting, not running: 0.6, ranked below room" {
    Q=$T/Q
    start_engine_group "$Q" "$T/pids" "$D/m" --max-loras 1 --max-cpu-loras 2 \
        --lora-modules "x=$D/x" --lora-modules "y=$D/y"
    finish_endpoint "$Q" "$T/pids"
    "$LORA_BIN/lora-frontend" --run-dir "$Q" --port 0 > "$Q/frontend.out" \
        2> "$Q/frontend.err" 3>&- &
    echo $! >> "$T/pids"
    wait_for_text "$Q/frontend.err" "lora-frontend: ready: http://" 30
    port=$(ready_port "$Q/frontend.err")
    hold() { # ADAPTER: a streaming completion held open until teardown
        local body='"prompt":"hello","max_tokens":3000,"ignore_eos":true,"stream":true'
        curl -sN "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"model\":\"$1\",$body}" > "$T/stream-$1" 2>&1 3>&- &
        echo $! >> "$T/pids"
    }
    # x's long request takes the only slot; y's request then has to queue behind it.
    hold x
    until_scrape "$(url "$Q" resident)" \
        '^lora_adapter_requests\{.*adapter_name="x",state="running"\} 1\.0$' \
        '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="gpu"'
    hold y
    for mode in resident inflight; do
        until_scrape "$(url "$Q" $mode)" \
            '^lora_adapter_requests\{.*adapter_name="y",state="waiting"\} 1\.0$' \
            '^lora_adapter_requests\{.*adapter_name="y",state="running"\} 0\.0$' \
            '^lora_adapter_requests\{.*adapter_name="x",state="running"\} 1\.0$' \
            '^vllm:num_requests_running\{.*\} 1\.0$' '^vllm:num_requests_waiting\{.*\} 1\.0$'
    done
    grep -q '^vllm:lora_adapter_loaded{.*adapter_name="y",level="cpu"' "$T/scrape"

    # Both meanings keep y out of the running set.
    for mode in resident inflight; do
        view "Q running=x waiting=y max_lora=1" sets "$(ep Q $mode)"
    done
    # For y, B (room for one more) beats Q, where y waits for the slot: 0.8 over 0.6.
    view "1 B 0.8;2 Q 0.6" score y "$(ep Q resident)" "$(ep B resident)"
    view "1 B 0.8;2 Q 0.6" score y "$(ep Q inflight)" "$(ep B inflight)"
    # For x, Q, where it is active, comes first.
    view "1 Q 1.0;2 B 0.8" score x "$(ep Q resident)" "$(ep B resident)"
    # vLLM writes every tracked adapter into both lists: y then looks active on Q, and the
    # router sends y's requests to the endpoint where they queue.
    view "Q running=x,y waiting=x,y max_lora=1" sets --as-vllm "$(ep Q inflight)"
    view "1 Q 1.0;2 B 0.8" score y --as-vllm "$(ep Q inflight)" "$(ep B inflight)"
    # The waiting set counts towards max_lora: Q's one slot is taken by x and y wants it, so a
    # third adapter scores 0.0 there.
    view "1 B 0.8;2 Q 0.0" score z "$(ep Q resident)" "$(ep B resident)"
    # The load-state scorer: Q's one slot holds x, busy with a request, so a third adapter finds
    # Q saturated in either meaning.
    for mode in resident inflight; do
        view "1 B 0.6 free-slot;2 Q 0.0 saturated" load-state z "$(ep Q $mode)" "$(ep B $mode)"
    done
    # y sits in Q's CPU cache, and the scorer prices activating it there (0.7) above a load into
    # B's free slot (0.6), although Q's slot is busy: its tiers look at residency alone.
    view "1 Q 0.7 cpu-resident;2 B 0.6 free-slot" load-state y "$(ep B inflight)" "$(ep Q inflight)"
}

@test "(b) a resident adapter with no requests is active by default: 1.0; inflight hides it" {
    until_scrape "$(url "$A" resident)" \
        '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="gpu"' \
        '^lora_adapter_requests\{.*adapter_name="x",state="running"\} 0\.0$' \
        '^lora_adapter_requests\{.*adapter_name="x",state="waiting"\} 0\.0$'
    # Default: x sits in a slot on A, so A serves it without a load and ranks first.
    view "1 A 1.0;2 B 0.8" score x "$(ep A resident)" "$(ep B resident)"
    # vLLM's meaning: x has no request, so it is in neither list; A and B both look like room
    # for one more and the router has no reason to prefer the endpoint that holds x.
    view "1 A 0.8;1 B 0.8" score x "$(ep A inflight)" "$(ep B inflight)"
    view "1 A 0.8;1 B 0.8" score x --as-vllm "$(ep A inflight)" "$(ep B inflight)"
}

@test "(c) a full endpoint gets no 0.8: running+waiting >= max_lora scores a new adapter 0.0" {
    # A: 2 adapters in 2 slots, full; B: 1 in 2, room. z is resident on neither.
    view "1 B 0.8;2 A 0.0" score z "$(ep A resident)" "$(ep B resident)"
    view "1 B 0.8;2 A 0.0" score z "$(ep B resident)" "$(ep A resident)"
    # vLLM's meaning hides that A's slots are taken: z would evict x or y there.
    view "1 A 0.8;1 B 0.8" score z "$(ep A inflight)" "$(ep B inflight)"
}

# Waits until both of the endpoint's scrapes show its residency as set up.
until_resident() { # DIR REGEX...
    local dir=$1 mode
    shift
    for mode in resident inflight; do
        until_scrape "$(url "$dir" $mode)" "$@"
    done
}

@test "the load-state scorer's view: residency, slots and the adapters in flight, per endpoint" {
    until_resident "$A" '^vllm:num_gpu_loaded_lora_adapters\{.*\} 2\.0$'
    until_resident "$C" '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="cpu"' \
        '^vllm:lora_adapter_loaded\{.*adapter_name="y",level="gpu"'
    until_resident "$P" '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="gpu",pinned="true"'
    local a="A loaded=x:gpu,y:gpu gpu=2 max=2" b="B loaded=w:gpu gpu=1 max=2"
    local c="C loaded=x:cpu,y:gpu gpu=1 max=1" p="P loaded=x:gpu:pinned gpu=1 max=1"
    view "$a active=x,y;$b active=w;$c active=y;$p active=x" \
        residency "$(ep A resident)" "$(ep B resident)" "$(ep C resident)" "$(ep P resident)"
    # In vLLM's meaning nothing is in flight, so no resident is busy.
    view "$a active=;$b active=;$c active=;$p active=" \
        residency "$(ep A inflight)" "$(ep B inflight)" "$(ep C inflight)" "$(ep P inflight)"
}

@test "load-state: an adapter in a slot (1.0) beats a free slot (0.6)" {
    until_resident "$A" '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="gpu"'
    for mode in resident inflight; do
        view "1 A 1.0 gpu-resident;2 B 0.6 free-slot" load-state x "$(ep B $mode)" "$(ep A $mode)"
    done
}

@test "load-state: an adapter in the CPU cache only (0.7) beats a free slot (0.6)" {
    until_resident "$C" '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="cpu"'
    for mode in resident inflight; do
        view "1 C 0.7 cpu-resident;2 B 0.6 free-slot" load-state x "$(ep B $mode)" "$(ep C $mode)"
    done
}

@test "load-state: a free slot (0.6) beats evicting an idle adapter (0.3), in vLLM's meaning" {
    until_resident "$A" '^vllm:num_gpu_loaded_lora_adapters\{.*\} 2\.0$'
    view "1 B 0.6 free-slot;2 A 0.3 evictable" load-state z "$(ep A inflight)" "$(ep B inflight)"
    # The default meaning lists every adapter in a slot as running, so the scorer takes A's
    # idle x and y for busy ones: A is saturated, and still below B.
    view "1 B 0.6 free-slot;2 A 0.0 saturated" load-state z "$(ep A resident)" "$(ep B resident)"
}

@test "load-state: evicting an idle adapter (0.3) beats a slot held by a pinned one (0.0)" {
    until_resident "$P" '^vllm:lora_adapter_loaded\{.*adapter_name="x",level="gpu",pinned="true"'
    view "1 A 0.3 evictable;2 P 0.0 saturated" load-state z "$(ep P inflight)" "$(ep A inflight)"
    # In the default meaning both look saturated, and the scorer cannot tell them apart.
    view "1 P 0.0 saturated;1 A 0.0 saturated" load-state z "$(ep P resident)" "$(ep A resident)"
}

@test "a stack started with lora-stack up: the router reads its scrape as the engine holds it" {
    local port=$((21000 + ($$ % 400) * 20)) levels
    STACK_RUN=$T/stack
    "$LORA_BIN/lora-stack" up --run-dir "$STACK_RUN" --model "$D/m" --port "$port" \
        --metrics-port $((port + 1)) --max-loras 2 --max-cpu-loras 4 --lora-modules "x=$D/x" \
        --lora-modules "y=$D/y" --lora-modules "z=$D/z" > "$T/up.out" 2> "$T/up.err" 3>&- ||
        { cat "$T/up.err" >&2; return 1; }
    local u="http://127.0.0.1:$((port + STACK_SCRAPE_OFFSET))/metrics"
    # Three adapters, two slots: one of them waits in the CPU cache.
    until_scrape "$u" '^vllm:num_gpu_loaded_lora_adapters\{.*\} 2\.0$' \
        '^vllm:lora_adapter_loaded\{.*level="cpu"'
    # The engine's own account of every rank, independently of the scrape.
    levels=$("$LORA_BIN/lora-inspect" residency --run-dir "$STACK_RUN" --json |
        jq -r 'select(.kind == "adapter") | "\(.adapter):\(.level)"' | sort | paste -sd ,)
    [[ "$levels" =~ ^x:(gpu|cpu),y:(gpu|cpu),z:(gpu|cpu)$ ]] ||
        { echo "levels: $levels" >&2; return 1; }
    local in_slots on_cpu
    in_slots=$(echo "$levels" | tr , '\n' | sed -n 's/:gpu$//p' | paste -sd ,)
    on_cpu=$(echo "$levels" | tr , '\n' | sed -n 's/:cpu$//p')
    view "S loaded=$levels gpu=2 max=2 active=$in_slots" residency "S=$u"
    view "S running=$in_slots waiting= max_lora=2" sets "S=$u"
    # For the adapter in S's CPU cache, the load-state scorer prefers S, which holds it; the
    # affinity scorer, which sees no CPU cache, prefers B's free slot over S's full ones.
    view "1 S 0.7 cpu-resident;2 B 0.6 free-slot" load-state "$on_cpu" "$(ep B resident)" "S=$u"
    view "1 B 0.8;2 S 0.0" score "$on_cpu" "$(ep B resident)" "S=$u"
}
