#!/usr/bin/env bats
# lora-metrics as Prometheus sees it: promtool checks the example configuration and rules and runs
# the rules' unit tests (tests/e2e/lora-rules.test.yml); promtool check metrics lints a scrape
# taken while streams for 16 adapters are held open on a real worker, engine and frontend; and a
# real Prometheus server scrapes the exporter every second and answers PromQL over its HTTP API
# with the values of a workload the test makes itself. Every process started is recorded in a pid
# file and stopped in teardown.

load ../helpers
bats_require_minimum_version 1.5.0

EX="$ROOT/examples/prometheus"
STEP_MS=20 # slows every step, so that held-open streams stay running while the test looks

setup() {
    for v in $(compgen -e); do
        case "$v" in LORA_METRICS_* | LORA_ENGINE_* | LORA_FRONTEND_*) unset "$v" ;; esac
    done
    T=$BATS_TEST_TMPDIR
    PIDS=$T/pids
    : > "$PIDS"
}

# SIGTERM in reverse order of start (streams, servers, then the engine before its worker);
# whatever is left after 5 s is killed.
teardown() {
    stop_pids "$PIDS"
}

# A worker (its steps slowed), an engine with options "$@", a frontend on any free port and
# lora-metrics subscribed to both, wired as lora-stack wires them in run directory $T/run.
# Sets FE_PORT and METRICS_PORT once all are ready.
start_stack() {
    RUN=$T/run
    start_engine_group "$RUN" "$PIDS" "$T/m" "$@"
    wait_for_text "$RUN/engine.err" "lora-engine: ready:" 30
    "$LORA_BIN/lora-frontend" --run-dir "$RUN" --port 0 \
        --publish-endpoint "ipc://$RUN/frontend-0.sock" > "$T/frontend.out" \
        2> "$T/frontend.err" 3>&- &
    echo $! >> "$PIDS"
    "$LORA_BIN/lora-metrics" --engine "ipc://$RUN/publish.sock" \
        --frontend "ipc://$RUN/frontend-0.sock" --listen 127.0.0.1:0 2> "$T/metrics.err" 3>&- &
    echo $! >> "$PIDS"
    wait_for_text "$T/frontend.err" "lora-frontend: ready: http://" 30
    wait_for_text "$T/metrics.err" "lora-metrics: ready: http://" 30
    FE_PORT=$(ready_port "$T/frontend.err")
    METRICS_PORT=$(ready_port "$T/metrics.err")
    [ -n "$FE_PORT" ] && [ -n "$METRICS_PORT" ]
}

# A streaming completion for adapter $1 held open in the background until teardown; $2 tells
# two streams of one adapter apart.
hold_stream() {
    local body='"prompt":"hello","max_tokens":3000,"ignore_eos":true,"stream":true'
    curl -sN "http://127.0.0.1:$FE_PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$1\",$body}" > "$T/stream-$1-$2" 2>&1 3>&- &
    echo $! >> "$PIDS"
}

scrape() {
    curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" > "$T/scrape"
}

# The value of the one sample of $T/scrape named $1 whose labels contain every further argument.
sample() {
    local name=$1 line
    shift
    line=$(grep "^$name[{ ]" "$T/scrape") || { echo "no $name" >&2; return 1; }
    for l in "$@"; do
        line=$(grep -F -- "$l" <<< "$line") || { echo "no $name{$*}" >&2; return 1; }
    done
    [ "$(wc -l <<< "$line")" -eq 1 ] || { echo "several $name{$*}: $line" >&2; return 1; }
    awk '{ print $NF + 0 }' <<< "$line"
}

# Scrapes until the command "$@" succeeds on the scrape (15 s at most).
until_scrape() {
    local deadline=$((SECONDS + 15))
    until scrape && "$@" 2> /dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "the scrape never satisfied: $*" >&2
            grep -v -e '^#' -e '_bucket{' "$T/scrape" >&2
            return 1
        fi
        sleep 0.05
    done
}

is() { # VALUE NAME [LABELS]...: the sample equals VALUE
    [ "$(sample "${@:2}")" = "$1" ]
}

# ---- the example configuration and rules ----------------------------------------------------

@test "promtool: the example configuration and rules check, and the rules pass their unit tests" {
    # From elsewhere: the configuration names its rule file relative to itself.
    cd "$T"
    run promtool check config "$EX/prometheus.yml"
    expect_status 0
    [[ "$output" == *"SUCCESS: 1 rule files found"* ]]
    n=$("$PYTHON" -c 'import sys, yaml
groups = yaml.safe_load(open(sys.argv[1]))["groups"]
print(sum(len(g["rules"]) for g in groups))' "$EX/lora-rules.yml")
    [ "$n" -ge 6 ]
    run promtool check rules "$EX/lora-rules.yml"
    expect_status 0
    [[ "$output" == *"SUCCESS: $n rules found"* ]]

    # Every rule is exercised: each record is the expr of a promql_expr_test, each alert the
    # alertname of an alert_rule_test.
    run "$PYTHON" -c 'import sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"]]
t = yaml.safe_load(open(sys.argv[2]))["tests"]
exprs = {e["expr"] for x in t for e in x.get("promql_expr_test", [])}
alerts = {a["alertname"] for x in t for a in x.get("alert_rule_test", []) if a.get("exp_alerts")}
missing = [r.get("record") or r.get("alert") for r in rules
           if r.get("record", "-") not in exprs and r.get("alert", "-") not in alerts]
assert not missing, missing' "$EX/lora-rules.yml" "$ROOT/tests/e2e/lora-rules.test.yml"
    expect_status 0
    run promtool test rules "$ROOT/tests/e2e/lora-rules.test.yml"
    expect_status 0
    [[ "$output" == *SUCCESS* ]]
}

# ---- promtool check metrics under load --------------------------------------------------------

@test "promtool check metrics: a scrape with 16 adapters and held-open streams lints clean" {
    names=$(printf 'a%02d ' $(seq 1 16))
    make_model_and_adapters "$T" $names
    mods=()
    for a in $names; do mods+=(--lora-modules "$a=$T/$a"); done
    start_stack --max-loras 8 --max-cpu-loras 16 "${mods[@]}"

    # All 16 registered and in every rank's cache, 8 of them in the slots.
    until_scrape is 16 vllm:num_cpu_loaded_lora_adapters
    [ "$(grep -c '^vllm:lora_adapter_loaded{' "$T/scrape")" -eq 16 ]
    [ "$(grep -c '^vllm:lora_adapter_loaded{.*level="gpu"' "$T/scrape")" -eq 8 ]
    is 8 vllm:num_gpu_loaded_lora_adapters
    is 8 vllm:max_gpu_lora_adapters

    # Finished requests first, so that the frontend's latency histograms have observations.
    for a in a01 a02 a03; do
        curl -sf "http://127.0.0.1:$FE_PORT/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"model\":\"$a\",\"prompt\":\"hi\",\"max_tokens\":2}" > /dev/null
    done
    until_scrape is 3 vllm:e2e_request_latency_seconds_count

    # One stream per adapter: a batch holds at most 8 adapters, so 8 run and 8 wait.
    for a in $names; do hold_stream "$a" 1; done
    until_scrape is 8 vllm:num_requests_running
    until_scrape is 8 vllm:num_requests_waiting
    [ "$(grep -c '^lora_adapter_requests{.*state="running"} 1\.0$' "$T/scrape")" -eq 8 ]
    [ "$(grep -c '^lora_adapter_requests{.*state="waiting"} 1\.0$' "$T/scrape")" -eq 8 ]
    # Each adapter has exactly its one request, and each running one sits in a slot.
    for a in $names; do
        r=$(sample lora_adapter_requests "adapter_name=\"$a\"" 'state="running"')
        w=$(sample lora_adapter_requests "adapter_name=\"$a\"" 'state="waiting"')
        [ $((r + w)) -eq 1 ] || { echo "$a: running $r, waiting $w"; return 1; }
        if [ "$r" -eq 1 ]; then
            grep -q "^vllm:lora_adapter_loaded{.*adapter_name=\"$a\",level=\"gpu\"" "$T/scrape" ||
                { echo "$a runs outside a slot"; return 1; }
        fi
    done
    is 16 vllm:num_cpu_loaded_lora_adapters
    # lora_requests_info (resident): running lists the 8 in slots, waiting the 8 queued ones.
    names_where() { # REGEX: the adapter names of the matching lines, sorted, comma-joined
        grep -E "$1" "$T/scrape" | sed 's/.*adapter_name="\([^"]*\)".*/\1/' | sort | paste -sd,
    }
    gpu=$(names_where '^vllm:lora_adapter_loaded\{.*level="gpu"')
    queued=$(names_where '^lora_adapter_requests\{.*state="waiting"\} 1\.0$')
    info="max_lora=\"8\",running_lora_adapters=\"$gpu\",waiting_lora_adapters=\"$queued\""
    grep -q "^vllm:lora_requests_info{.*,$info} " "$T/scrape"
    promtool_clean "$T/scrape"
    # The lint looked at real content: the families of the load are in what it parsed.
    grep -q '^vllm:time_to_first_token_seconds_bucket{' "$T/scrape"
    grep -q '^vllm:iteration_tokens_total_bucket{' "$T/scrape"
}

# ---- a Prometheus server ----------------------------------------------------------------------

# A port that was free a moment ago (Prometheus cannot take port 0 and say which it got).
free_port() {
    "$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# The values of PromQL expression $1 at this instant, one "LABELS VALUE" line per series, sorted;
# LABELS is the series' labels named in $2 (comma-separated), as name=value.
promql() {
    curl -sfG "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
        jq -r --arg keep "${2:-}" '
            .status as $s | if $s != "success" then error("status \($s)") else . end |
            .data.result[] |
            ([($keep | split(",")[]) as $k | select($k != "") | "\($k)=\(.metric[$k] // "")"]
             | join(",")) + " " + .value[1]' | sort
}

# Polls until promql "$1" "$3" prints exactly $2 (its lines joined by ';'), before the deadline
# PROM_DEADLINE (in SECONDS).
wait_promql() {
    local got=""
    while :; do
        got=$(promql "$1" "${3:-}" 2> /dev/null | paste -sd ';') || got=""
        [ "$got" = "$2" ] && return 0
        if [ "$SECONDS" -ge "$PROM_DEADLINE" ]; then
            echo "PromQL '$1': expected '$2', got '$got'" >&2
            return 1
        fi
        sleep 0.2
    done
}

@test "Prometheus scrapes lora-metrics every second and PromQL returns the workload's values" {
    make_model_and_adapters "$T" p q r
    start_stack --max-loras 3 --max-cpu-loras 3 --lora-modules "p=$T/p" --lora-modules "q=$T/q" \
        --lora-modules "r=$T/r"
    # Three streams held open for q: three requests running, all of them q's.
    for i in 1 2 3; do hold_stream q "$i"; done

    # The example configuration, with a 1 s interval, this exporter as its target and the
    # example rules by absolute path.
    PROM_PORT=$(free_port)
    "$PYTHON" - "$EX/prometheus.yml" "$T/prometheus.yml" "127.0.0.1:$METRICS_PORT" \
        "$EX/lora-rules.yml" <<'EOF'
import sys, yaml
src, dst, target, rules = sys.argv[1:]
c = yaml.safe_load(open(src))
c["global"].update(scrape_interval="1s", evaluation_interval="1s")
c["rule_files"] = [rules]
assert len(c["scrape_configs"]) == 1
c["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
yaml.safe_dump(c, open(dst, "w"))
EOF
    prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/data" \
        --web.listen-address="127.0.0.1:$PROM_PORT" > "$T/prometheus.log" 2>&1 3>&- &
    echo $! >> "$PIDS"

    PROM_DEADLINE=$((SECONDS + 30))
    wait_promql 'up{job="lora-stack"}' "instance=127.0.0.1:$METRICS_PORT 1" instance ||
        { tail -20 "$T/prometheus.log"; return 1; }
    # Names with a colon are plain PromQL identifiers; the __name__ matcher finds the same.
    wait_promql 'vllm:num_requests_running' "engine=0 3" engine
    wait_promql '{__name__="vllm:num_requests_running"}' "engine=0 3" engine
    wait_promql 'vllm:num_requests_waiting' "engine=0 0" engine
    wait_promql 'vllm:num_gpu_loaded_lora_adapters' "engine=0 3" engine
    wait_promql '{__name__="vllm:num_gpu_loaded_lora_adapters",engine="0"}' " 3"
    wait_promql 'vllm:lora_adapter_loaded' \
        "adapter_name=p,level=gpu 1;adapter_name=q,level=gpu 1;adapter_name=r,level=gpu 1" \
        adapter_name,level
    wait_promql 'lora_adapter_requests' \
        "$(printf '%s;' 'adapter_name=p,state=running 0' 'adapter_name=p,state=waiting 0' \
            'adapter_name=q,state=running 3' 'adapter_name=q,state=waiting 0' \
            'adapter_name=r,state=running 0' 'adapter_name=r,state=waiting 0' | sed 's/;$//')" \
        adapter_name,state
    wait_promql 'sum(lora_adapter_requests{state="running"})
                 - scalar(vllm:num_requests_running)' " 0"
    # The example recording rules, evaluated by the server on the live series.
    wait_promql 'lora:resident_adapters:count' "engine=0,level=gpu 3" engine,level
    wait_promql 'lora:adapter_requests:sum{state="running"}' \
        "adapter_name=p 0;adapter_name=q 3;adapter_name=r 0" adapter_name
    # And lora_requests_info in its default meaning, the three resident adapters running (its
    # value is the time, so its series are counted).
    wait_promql 'count by (max_lora, running_lora_adapters, waiting_lora_adapters)
                     (vllm:lora_requests_info)' \
        "max_lora=3,running_lora_adapters=p,q,r,waiting_lora_adapters= 1" \
        max_lora,running_lora_adapters,waiting_lora_adapters
}
