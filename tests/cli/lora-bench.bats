#!/usr/bin/env bats
# lora-bench without lora-stack: the command line (help, version, usage errors with exit 100,
# the environment mirrors, the man page against --help); serve against
# tests/ref/sse_server.py, a tiny OpenAI-compatible server that is not lora-stack (token counts
# against its counters, round-robin shares, percentiles against numpy, concurrency and
# arrivals, a server that refuses stream_options or sends no usage, streams cut short, error
# events, 404, an unreachable server); campaign (malformed configurations, the example's
# 56-cell plan, a run with its report, kept cells never run again, energy from a stand-in RAPL
# directory and a stand-in NVML library, the progress line on a terminal only); report on a
# directory that is not a campaign. Every process started is stopped in teardown.

load ../helpers
bats_require_minimum_version 1.5.0

BENCH="$LORA_BIN/lora-bench"
SSE="$ROOT/tests/ref/sse_server.py"
CHECK="$PYTHON $ROOT/tests/ref/bench_check.py"
EXAMPLE="$ROOT/examples/bench/multi-tenancy.json"

setup() {
    for v in $(compgen -e); do
        case "$v" in LORA_BENCH_*) unset "$v" ;; esac
    done
    unset OPENAI_API_KEY
    T=$BATS_TEST_TMPDIR
    : > "$T/pids"
}

teardown() {
    stop_pids "$T/pids"
}

# Starts the tiny server with options "$@"; URL is its base URL.
start_sse() {
    : > "$T/sse.err"
    "$PYTHON" "$SSE" --port 0 "$@" 2> "$T/sse.err" 3>&- &
    SSE_PID=$!
    echo $! >> "$T/pids"
    wait_for_text "$T/sse.err" "sse_server: ready: http://" 20
    URL=$(sed -n 's/^sse_server: ready: \(http:[^ ]*\)$/\1/p' "$T/sse.err")
    [ -n "$URL" ]
}

# A port nothing listens on.
closed_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# serve against $URL with 12 small requests and options "$@"; the result in $T/r.json.
serve() {
    run --separate-stderr "$BENCH" serve --base-url "$URL" --num-prompts 12 \
        --random-input-len 8 --random-output-len 10 --max-concurrency 3 \
        --result-filename "$T/r.json" "$@"
}

# A campaign configuration against $URL: two configurations, one concurrency, one round; the
# "stack" whose CPU time is read is the server's process (its name: python3).
small_config() {
    cat > "$T/c.json" << EOF
{
  "study": "a small study",
  "base_url": "$URL",
  "configurations": [{"name": "one", "adapters": ["a1"]},
                     {"name": "two", "adapters": ["a1", "a2"]}],
  "concurrencies": [2],
  "repetitions": 1,
  "num_prompts": 6,
  "input_tokens": 8,
  "output_tokens": 8,
  "idle_seconds": 1,
  "processes": {"pids": [$SSE_PID]},
  "rules": {"H1": {"statement": "two cost 5% more", "metric": "time_per_token",
                   "configuration": "two", "baseline": "one",
                   "falsified_if": "margin_below", "threshold": 0.05}},
  "published": [{"what": "two against one", "value": 0.06, "metric": "time_per_token",
                 "configuration": "two", "baseline": "one", "source": "a paper"},
                {"what": "a figure alone", "value": -0.02}]
}
EOF
}

# ---- command line ---------------------------------------------------------------------------

@test "--help prints every subcommand's usage and options on stdout and exits 0" {
    run --separate-stderr "$BENCH" --help
    expect_status 0
    [ -z "$stderr" ]
    for sub in serve campaign report; do
        grep -q "^usage: lora-bench $sub" <<< "$output" || { echo "no usage of $sub"; return 1; }
    done
    for opt in base-url model dataset-name num-prompts random-input-len random-output-len \
               max-concurrency request-rate ignore-eos lora-modules seed save-result \
               result-filename percentile-metrics metric-percentiles output-dir quick dry-run \
               run-dir pids output; do
        grep -q -- "^  --$opt\b" <<< "$output" || { echo "no --$opt"; return 1; }
    done
    run -0 "$BENCH" -h
    for sub in serve campaign report; do
        run --separate-stderr "$BENCH" "$sub" --help
        expect_status 0
        [[ "${lines[0]}" == "usage: lora-bench $sub"* ]]
    done
}

@test "--version names the program and its version" {
    run -0 "$BENCH" --version
    [[ "$output" =~ ^lora-bench\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
    run -0 "$BENCH" serve --version
    [[ "$output" == "lora-bench "* ]]
}

@test "usage errors: exit 100 naming what is wrong, nothing on stdout" {
    run --separate-stderr "$BENCH"
    expect_status 100
    expect_message "give a subcommand"
    run --separate-stderr "$BENCH" bench
    expect_status 100
    expect_message "unknown subcommand 'bench'"
    run --separate-stderr "$BENCH" serve --no-such-option
    expect_status 100
    expect_message "unknown option '--no-such-option'"
    run --separate-stderr "$BENCH" serve --num-prompts 0
    expect_status 100
    expect_message "--num-prompts"
    run --separate-stderr "$BENCH" serve --dataset-name sharegpt
    expect_status 100
    expect_message "only the random dataset"
    run --separate-stderr "$BENCH" serve --endpoint /v1/chat/completions
    expect_status 100
    expect_message "only /v1/completions"
    run --separate-stderr "$BENCH" serve --request-rate fast
    expect_status 100
    expect_message "--request-rate"
    run --separate-stderr "$BENCH" serve --percentile-metrics ttft,goodput
    expect_status 100
    expect_message "'goodput'"
    run --separate-stderr "$BENCH" serve --metric-percentiles 50,101
    expect_status 100
    expect_message "'101'"
    run --separate-stderr "$BENCH" serve --base-url ftp://x
    expect_status 100
    expect_message "http://"
    run --separate-stderr "$BENCH" campaign
    expect_status 100
    expect_message "give the configuration file"
    run --separate-stderr "$BENCH" campaign "$EXAMPLE"
    expect_status 100
    expect_message "--output-dir"
    run --separate-stderr "$BENCH" report
    expect_status 100
    expect_message "give the campaign's directory"
}

@test "lora-bench --help and lora-bench(1) OPTIONS list the same options" {
    diff <("$BENCH" --help | grep -o -- '^  --[a-z][a-z-]*' | sed 's/ *//' | sort -u) \
         <(man_page_options "$ROOT/man/lora-bench.1" | sort -u)
}

@test "the environment mirrors serve's options; the command line wins" {
    start_sse
    LORA_BENCH_NUM_PROMPTS=5 LORA_BENCH_RANDOM_OUTPUT_LEN=3 run --separate-stderr "$BENCH" serve \
        --base-url "$URL" --random-input-len 4 --result-filename "$T/r.json"
    expect_status 0
    [ "$(jq '.num_prompts, .total_output_tokens' "$T/r.json" | paste -sd ' ')" = "5 15" ]
    LORA_BENCH_NUM_PROMPTS=5 run --separate-stderr "$BENCH" serve --base-url "$URL" \
        --num-prompts 2 --random-input-len 4 --random-output-len 3 --result-filename "$T/r.json"
    expect_status 0
    [ "$(jq .num_prompts "$T/r.json")" = 2 ]
}

# ---- serve against a server that is not lora-stack ---------------------------------------

@test "serve: token counts equal the server's counters, adapters round-robin as listed, percentiles equal numpy's" {
    start_sse
    curl -sf "$URL/metrics" > "$T/before"
    serve --ignore-eos --lora-modules a1 a1 a1 a2 --seed 3
    expect_status 0
    curl -sf "$URL/metrics" > "$T/after"
    [[ "$output" == *"============ Serving Benchmark Result ============"* ]]
    grep -qE '^Successful requests: +12 *$' <<< "$output"
    grep -qE '^Output tokens counted from: +usage$' <<< "$output"
    [[ "$output" == *"Client CPU time per request (ms):"* ]]
    [[ "$output" == *"P99 E2EL (ms):"* ]]
    $CHECK tokens "$T/r.json" "$T/before" "$T/after"
    $CHECK share "$T/r.json" a1 0.75
    $CHECK share "$T/r.json" a2 0.25
    $CHECK percentiles "$T/r.json"
    jq -e '.completed == 12 and .failed == 0 and .total_output_tokens == 120
           and .total_input_tokens == 96 and (.input_lens | length) == 12
           and ([.itls[] | length] | all(. == 9)) and (.generated_texts[0] | startswith("t0 t1"))
           and .output_tokens_from == "usage" and .client_cpu_ms_per_request > 0
           and .lora_assignment == "round-robin" and .request_rate == "inf"
           and .max_concurrency == 3 and .ignore_eos' "$T/r.json"
    # The same seed gives the same prompts.
    cp "$T/r.json" "$T/first.json"
    serve --ignore-eos --lora-modules a1 a1 a1 a2 --seed 3
    [ "$(jq -c .input_lens "$T/first.json")" = "$(jq -c .input_lens "$T/r.json")" ]
}

@test "serve: --metric-percentiles and --percentile-metrics choose what is printed and saved" {
    start_sse
    serve --percentile-metrics ttft,e2el --metric-percentiles 50,90,99.9
    expect_status 0
    [[ "$output" == *"P99.9 TTFT (ms):"* && "$output" == *"P90 E2EL (ms):"* ]]
    [[ "$output" != *"Time per Output Token"* ]]
    jq -e 'has("p99.9_ttft_ms") and has("p50_e2el_ms") and (has("p90_tpot_ms") | not)
           and has("p99_tpot_ms") and has("mean_itl_ms")' "$T/r.json"
    $CHECK percentiles "$T/r.json"
}

@test "serve: --max-concurrency bounds the requests in flight; --request-rate spreads the arrivals" {
    start_sse --delay-ms 5
    serve --max-concurrency 2 --num-prompts 10
    expect_status 0
    $CHECK concurrency "$T/r.json" 2
    # 20 requests at 40 per second: Poisson arrivals rescaled to end at 20 / 40 = 0.5 s.
    serve --max-concurrency 100 --num-prompts 20 --request-rate 40 --random-output-len 2
    expect_status 0
    grep -qE '^Request rate configured \(RPS\): +40\.00 *$' <<< "$output"
    jq -e '(.start_times | max) - (.start_times | min) > 0.3
           and (.start_times | max) - (.start_times | min) < 1.5 and .request_rate == 40' \
        "$T/r.json"
    # All at once: every request starts together.
    serve --max-concurrency 100 --num-prompts 20 --random-output-len 2
    jq -e '(.start_times | max) - (.start_times | min) < 0.3' "$T/r.json"
}

@test "serve: a server that refuses stream_options gets the requests again without it; tokens are then the chunks" {
    start_sse --refuse-stream-options
    serve
    expect_status 0
    jq -e '.completed == 12 and .failed == 0 and .stream_options_refused
           and .output_tokens_from == "chunks" and .total_output_tokens == 120' "$T/r.json"
}

@test "serve: without a usage chunk the output tokens are the chunks counted, and the result says so" {
    start_sse --ignore-usage --tokens-per-chunk 3
    serve
    expect_status 0
    grep -qE '^Output tokens counted from: +chunks$' <<< "$output"
    # 10 tokens in chunks of 3: 4 chunks each. The server sent more than the chunks show;
    # without usage and without a tokenizer, lora-bench can count only the chunks.
    jq -e '.output_tokens_from == "chunks" and .total_output_tokens == 48' "$T/r.json"
}

@test "serve: SSE comments and CRLF line ends are read like plain events" {
    start_sse --comments --crlf
    serve
    expect_status 0
    jq -e '.completed == 12 and .total_output_tokens == 120' "$T/r.json"
}

# The failed requests of $T/r.json: each has the reason $1 (a prefix) and no output token, and
# there are $2 of them; the others have no error. (Which requests fail depends on the order in
# which the server took them, not on their index.)
failures_are() {
    jq -e --arg why "$1" --argjson n "$2" '
        [range(.num_prompts) as $i | {e: .errors[$i], o: .output_lens[$i]}] as $r
        | ($r | map(select(.e != "")) | length == $n
               and all(.e | startswith($why)) and all(.o == 0))
          and ($r | map(select(.e == "")) | all(.o == 10))
          and .failed == $n and .total_output_tokens == 10 * (12 - $n)' "$T/r.json"
}

@test "serve: streams cut short and error events fail with their reason; their tokens are not counted (exit 1)" {
    start_sse --cut-every 3
    serve
    expect_status 1
    [[ "$stderr" == *"failed: stream cut short after 5 chunks"* ]]
    failures_are "stream cut short after 5 chunks: " 4
    $CHECK percentiles "$T/r.json"
    start_sse --no-done-every 5
    serve
    expect_status 1
    failures_are "stream cut short: the server ended it without [DONE] after 5 chunks" 2
    start_sse --error-every 4
    serve
    expect_status 1
    failures_are "the server sent an error event: the engine failed the request" 3
}

@test "serve: a 503 refusal is a failed request with the server's message, its tokens not counted" {
    start_sse --busy-every 3
    serve
    expect_status 1
    [[ "$stderr" == *"failed: HTTP 503: the engine is busy"* ]]
    failures_are "HTTP 503: the engine is busy" 4
}

@test "serve: an unknown model is HTTP 404 with the server's message (exit 1)" {
    start_sse
    serve --lora-modules nosuch
    expect_status 1
    [[ "$stderr" == *'HTTP 404: The model `nosuch` does not exist.'* ]]
    jq -e '.completed == 0 and .failed == 12 and .total_output_tokens == 0' "$T/r.json"
}

@test "serve: an unreachable server is exit 111 with the reason; no token is counted" {
    URL="http://127.0.0.1:$(closed_port)"
    serve
    expect_status 111
    expect_message "unable to reach the server"
    [ ! -e "$T/r.json" ]
    # With --model there is no /v1/models to ask: every request fails to connect.
    serve --model tiny
    expect_status 111
    [[ "$stderr" == *"unable to connect to $URL/v1/completions"* ]]
    jq -e '.completed == 0 and .failed == 12 and .total_output_tokens == 0
           and (.errors | all(startswith("unable to connect")))' "$T/r.json"
}

@test "serve --save-result names the file as vLLM does, in --result-dir" {
    start_sse
    run --separate-stderr "$BENCH" serve --base-url "$URL" --num-prompts 2 \
        --random-input-len 4 --random-output-len 2 --max-concurrency 1 --save-result \
        --result-dir "$T" --label mine
    expect_status 0
    ls "$T"/mine-infqps-concurrency1-tiny-*.json
    [[ "$output" == *"Result saved to $T/mine-infqps-concurrency1-tiny-"* ]]
}

# ---- campaign ---------------------------------------------------------------------------------

@test "campaign: malformed configurations are refused with exit 100, naming the file and the place" {
    start_sse
    check() { # EXPECTED-MESSAGE JQ-FILTER
        small_config
        jq "$2" "$T/c.json" > "$T/bad.json"
        run --separate-stderr "$BENCH" campaign "$T/bad.json" --output-dir "$T/out"
        expect_status 100
        expect_message "$1"
        [ ! -e "$T/out/campaign.json" ]
    }
    check "unknown key 'concurrency'" '. + {concurrency: 3}'
    check "configurations: must be a non-empty array" '.configurations = []'
    check "configurations[1].name: 'one' is also configurations[0]'s" '.configurations[1].name = "one"'
    check "configurations[0].adapters[0]: must be a non-empty string" '.configurations[0].adapters = [3]'
    check "concurrencies[0]: must be an integer" '.concurrencies = [0]'
    check "repetitions: must be an integer" '.repetitions = "four"'
    check "rules.H1.baseline: must name one of the configurations" '.rules.H1.baseline = "three"'
    check "rules.H1.falsified_if" '.rules.H1.falsified_if = "maybe"'
    check "rules.H1.metric" '.rules.H1.metric = "money"'
    check "published[0].configuration" '.published[0].configuration = "nine"'
    check "give num_prompts or num_prompts_per_concurrency" '. + {num_prompts_per_concurrency: 2}'
    check "request_rate" '.request_rate = 0'
    check "base_url: must start with http://" '.base_url = "localhost:8000"'
    check "quick: unknown key 'rules'" '. + {quick: {rules: {}}}'
    echo '{"configurations": [' > "$T/broken.json"
    run --separate-stderr "$BENCH" campaign "$T/broken.json" --output-dir "$T/out"
    expect_status 100
    expect_message "broken.json: invalid JSON at line"
    run --separate-stderr "$BENCH" campaign "$T/missing.json" --output-dir "$T/out"
    expect_status 100
    expect_message "missing.json: unable to open"
    echo '[1, 2]' > "$T/array.json"
    run --separate-stderr "$BENCH" campaign "$T/array.json" --output-dir "$T/out"
    expect_status 100
    expect_message "must be a JSON object"
}

@test "campaign --dry-run: the example's plan is 56 cells, every configuration at every concurrency once a round, rounds rotated" {
    run --separate-stderr "$BENCH" campaign "$EXAMPLE" --dry-run
    expect_status 0
    [ "${lines[0]}" = "56 cells, 3 idle measurements of 20 s" ]
    [ "$(grep -c '^cell ' <<< "$output")" -eq 56 ]
    # Each configuration and concurrency 4 times, once in each round.
    [ "$(grep '^cell ' <<< "$output" | awk '{print $4, $5, $6, $NF}' | sort | uniq -c |
         awk '{print $1}' | sort -u)" = 1 ]
    [ "$(grep '^cell ' <<< "$output" | sed 's/^cell *[0-9]* *round [0-9] *//' | sort | uniq -c |
         awk '{print $1}' | sort -u)" = 4 ]
    # Rotated: the rounds start with different cells.
    [ "$(grep -E '^cell +(0|14|28|42) ' <<< "$output" | awk '{print $5, $NF}' | sort -u |
         wc -l)" -eq 4 ]
    run -0 "$BENCH" campaign "$EXAMPLE" --dry-run --quick
    [ "${lines[0]}" = "14 cells, 3 idle measurements of 1 s" ]
}

@test "campaign against a server that is not lora-stack: every cell kept, contained and counted; the report has its tables and figures" {
    start_sse
    small_config
    run --separate-stderr "$BENCH" campaign "$T/c.json" --output-dir "$T/out"
    expect_status 0
    [[ "$output" == *"campaign: 2 cells in $T/out (2 run now, 0 kept from before); 0 with failed"* ]]
    # In a pipe: no progress line.
    [[ "$stderr" != *"elapsed"* ]]
    ls "$T/out/cells/cell-000.json" "$T/out/cells/cell-001.json" "$T/out/idle-start.json" \
        "$T/out/idle-middle.json" "$T/out/idle-end.json"
    for f in "$T"/out/cells/*.json; do
        jq -e '.status == "ok" and .contained and .tokens == 48 and .server.tokens_match
               and .server.generation_tokens == 48 and .server.mean_step_adapters == null
               and .result.completed == 6 and .window.start <= (.result.start_times | min)
               and .window.end >= (.result.end_times | max) and .energy.measured == false
               and (.energy.note | startswith("not measured"))' "$f"
        $CHECK percentiles <(jq .result "$f")
    done
    jq -e '.result.models == ["a1", "a2", "a1", "a2", "a1", "a2"]' "$T/out/cells/cell-001.json"
    run --separate-stderr "$BENCH" report "$T/out"
    expect_status 0
    for h in "# a small study" "## Cells" "## Idle" "## Cost per generated token" \
             "## Stack CPU per program" "## N distinct adapters against N=1" "## Skew" \
             "## Hypotheses" "## Published figures beside the measured ones" \
             "## Latency percentiles" "## Figures"; do
        grep -qxF -- "$h" <<< "$output" || { echo "no '$h'"; return 1; }
    done
    grep -q '^| H1 | two cost 5% more | 2 | time_per_token | [+-][0-9.]*% | ' <<< "$output"
    grep -q '^| two against one | +6.0% | a paper | [+-][0-9.]*% at concurrency 2 |$' <<< "$output"
    grep -qxF '| a figure alone | -2.0% |  | (no comparison given) |' <<< "$output"
    [ "$output" = "$(cat "$T/out/report.md")" ]
    [ -s "$T/out/cost-time.png" ] && [ -s "$T/out/cost-cpu.png" ]
    [ "$(head -c 8 "$T/out/cost-time.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]
    [ ! -e "$T/out/cost-energy.png" ]
}

@test "campaign: a kept cell is never run again; a directory holding another plan is refused" {
    start_sse
    small_config
    run -0 "$BENCH" campaign "$T/c.json" --output-dir "$T/out"
    sum=$(md5sum "$T/out/cells/cell-000.json")
    rm "$T/out/cells/cell-001.json" "$T/out/idle-end.json"
    run --separate-stderr "$BENCH" campaign "$T/c.json" --output-dir "$T/out"
    expect_status 0
    [[ "$output" == *"(1 run now, 1 kept from before)"* ]]
    [ "$(md5sum "$T/out/cells/cell-000.json")" = "$sum" ]
    [ -s "$T/out/cells/cell-001.json" ] && [ -s "$T/out/idle-end.json" ]
    jq '.repetitions = 2' "$T/c.json" > "$T/c2.json"
    run --separate-stderr "$BENCH" campaign "$T/c2.json" --output-dir "$T/out"
    expect_status 100
    expect_message "holds another campaign"
}

@test "campaign: failed requests are kept in the cell with their reason and never counted" {
    start_sse --cut-every 4
    small_config
    run --separate-stderr "$BENCH" campaign "$T/c.json" --output-dir "$T/out"
    expect_status 1
    [[ "$output" == *"failed requests"* ]]
    jq -e '.status == "failed requests" and .tokens == 40 and .result.failed == 1
           and (.errors | to_entries[0].key | startswith("stream cut short"))' \
        "$T/out/cells/cell-000.json"
    run --separate-stderr "$BENCH" report "$T/out"
    expect_status 0
    grep -q '^| 0 | one | 2 | failed requests | stream cut short' <<< "$output"
}

@test "campaign: an unreachable server stops it before any cell (exit 111)" {
    URL="http://127.0.0.1:$(closed_port)"
    small_config
    run --separate-stderr "$BENCH" campaign "$T/c.json" --output-dir "$T/out"
    expect_status 111
    expect_message "unable to reach the server"
    [ ! -e "$T/out/cells/cell-000.json" ]
}

@test "campaign: energy from a RAPL package counter and from NVML, net of idle" {
    start_sse --delay-ms 20 # cells of half a second: the stand-in counter moves in 20 ms steps
    small_config
    # A stand-in RAPL package at 20 W, counting in microjoules as the kernel does.
    mkdir -p "$T/powercap/intel-rapl:0" "$T/powercap/intel-rapl:0:0" "$T/powercap/intel-rapl"
    echo 262143328850 > "$T/powercap/intel-rapl:0/max_energy_range_uj"
    echo 5 > "$T/powercap/intel-rapl:0:0/energy_uj" # a part of the package: not added again
    t0=$(date +%s%N)
    (while :; do
        echo $((($(date +%s%N) - t0) / 50)) > "$T/powercap/e.tmp"
        mv "$T/powercap/e.tmp" "$T/powercap/intel-rapl:0/energy_uj"
        sleep 0.02
    done) 3>&- &
    echo $! >> "$T/pids"
    jq --arg d "$T/powercap" '.energy = {nvml: false, powercap_dir: $d}' "$T/c.json" > "$T/e.json"
    run --separate-stderr "$BENCH" campaign "$T/e.json" --output-dir "$T/rapl"
    expect_status 0
    jq -e '.watts > 15 and .watts < 25' "$T/rapl/idle-start.json"
    jq -e --arg d "$T/powercap" '.energy.measured and .energy.sources == ["rapl:\($d)/intel-rapl:0"]
           and .energy.joules > 0 and .cost.energy_per_token_gross > 0' "$T/rapl/cells/cell-000.json"
    run -0 "$BENCH" report "$T/rapl"
    grep -q "^Energy from: \`rapl:$T/powercap/intel-rapl:0\`; net of idle at [12][0-9]\.[0-9][0-9] W" \
        <<< "$output"
    [ -s "$T/rapl/cost-energy.png" ]

    # A stand-in libnvidia-ml.so.1 whose one GPU draws 50 W, found through LD_LIBRARY_PATH.
    command -v cc > /dev/null || skip "no C compiler for the stand-in NVML library"
    mkdir "$T/nvml"
    cat > "$T/nvml/nvml.c" << 'EOF'
#include <time.h>
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
static int gpu;
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = &gpu; return i != 0; }
int nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *mj)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    *mj = (unsigned long long)((t.tv_sec + t.tv_nsec * 1e-9) * 50000.0);
    return 0;
}
EOF
    cc -shared -fPIC -o "$T/nvml/libnvidia-ml.so.1" "$T/nvml/nvml.c"
    jq '.energy = {nvml: true, powercap_dir: "/nonexistent"}' "$T/c.json" > "$T/n.json"
    LD_LIBRARY_PATH="$T/nvml" run --separate-stderr "$BENCH" campaign "$T/n.json" \
        --output-dir "$T/nv"
    expect_status 0
    jq -e '.watts > 49 and .watts < 51' "$T/nv/idle-middle.json"
    jq -e '.energy.sources == ["nvml:gpu0"] and .energy.joules > 0' "$T/nv/cells/cell-001.json"
    run -0 "$BENCH" report "$T/nv"
    grep -q '^Energy from: `nvml:gpu0`; net of idle at 5[01]\.[0-9][0-9] W' <<< "$output"
    # A constant draw: net of idle, a cell's energy per token is about nothing (the gross
    # figure is 50 W times the cell's time over its 48 tokens).
    net=$(awk -F' *\\| *' '$2 == "two" && $5 == 2 { print $11 }' <<< "$output")
    gross=$(jq .cost.energy_per_token_gross "$T/nv/cells/cell-001.json")
    awk -v n="$net" -v g="$gross" 'BEGIN { exit !(g > 0 && n * n < (g / 20) * (g / 20)) }' ||
        { echo "net $net against gross $gross"; return 1; }
}

@test "campaign: a progress line on a terminal, with the cell, the elapsed time and an estimate" {
    start_sse --delay-ms 20
    small_config
    script -qefc "'$BENCH' campaign '$T/c.json' --output-dir '$T/out'" /dev/null > "$T/tty.out"
    grep -q "lora-bench: cell 2 of 2 (two, concurrency 2, round 1); 0m0[0-9]s elapsed, " "$T/tty.out"
    grep -q "about 0m0[0-9]s left" "$T/tty.out"
}

# ---- report -----------------------------------------------------------------------------------

@test "report: a directory that is not a campaign is exit 1 with the reason" {
    run --separate-stderr "$BENCH" report "$T/nothing"
    expect_status 1
    expect_message "is not a campaign directory"
    mkdir "$T/d"
    echo '{"version": 1}' > "$T/d/campaign.json"
    run --separate-stderr "$BENCH" report "$T/d"
    expect_status 1
    expect_message "no configuration or plan"
}
