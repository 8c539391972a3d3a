#!/usr/bin/env bats
# lora-bench against real stacks started with `lora-stack up`: serve's token counts equal what
# the server's /metrics counters moved by (in all and per adapter, tokens from the usage
# chunk), its percentiles equal numpy's over its own saved per-request times, an unknown
# adapter is the server's 404; `campaign --quick` of examples/bench/multi-tenancy.json through
# examples/bench/multi-tenancy.sh gives a report with every table and non-empty figures, every
# cell contained and counted by the server, and more distinct adapters per step for N=8 than
# N=1; a frontend killed mid-stream leaves failed requests with their reason and no token
# counted. Every stack is brought down in teardown.

load ../helpers
bats_require_minimum_version 1.5.0

BENCH="$LORA_BIN/lora-bench"
STACK="$LORA_BIN/lora-stack"
CHECK="$PYTHON $ROOT/tests/ref/bench_check.py"

setup_file() {
    for v in $(compgen -e); do
        case "$v" in LORA_BENCH_* | LORA_STACK_* | LORA_ENGINE_* | LORA_FRONTEND_*) unset "$v" ;; esac
    done
    export D=$BATS_FILE_TMPDIR
    # Ports of this file's own: 23000 and up, 20 per process id slot.
    export PORT=$((23000 + ($$ % 400) * 20))
    export URL="http://127.0.0.1:$PORT"
    "$STACK" up --run-dir "$D/run" --port "$PORT" --metrics-port $((PORT + 1)) \
        --max-loras 4 > "$D/up.out" 2> "$D/up.err" 3>&- || { cat "$D/up.err" >&2; return 1; }
}

teardown_file() {
    "$STACK" down --run-dir "$D/run" > /dev/null 2>&1 || true
}

setup() {
    T=$BATS_TEST_TMPDIR
    unset OPENAI_API_KEY
}

teardown() {
    if [ -n "${RUN2:-}" ]; then
        "$STACK" down --run-dir "$RUN2" > /dev/null 2>&1 || true
    fi
}

# Scrapes $1 into $2 until vllm:generation_tokens_total has moved by $3 since the scrape in
# $4 (10 s at most; the engine publishes its counters on a timer).
scrape_until_moved() {
    local deadline=$((SECONDS + 10)) b a
    b=$(awk '/^vllm:generation_tokens_total/ { s += $NF } END { print s + 0 }' "$4")
    while :; do
        curl -sf "$1" > "$2"
        a=$(awk '/^vllm:generation_tokens_total/ { s += $NF } END { print s + 0 }' "$2")
        awk -v a="$a" -v b="$b" -v n="$3" 'BEGIN { exit !(a - b == n) }' && return 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "the counter moved by $((${a%.*} - ${b%.*})), not $3" >&2
            return 1
        fi
        sleep 0.1
    done
}

@test "serve: the tokens it counts are what the server's /metrics counters moved by, in all and per adapter" {
    curl -sf "$URL/metrics" > "$T/before"
    run --separate-stderr "$BENCH" serve --base-url "$URL" --num-prompts 24 \
        --random-input-len 20 --random-output-len 12 --random-range-ratio 0.5 --ignore-eos \
        --max-concurrency 6 --lora-modules demo-sql demo-sql demo-sql demo-chat \
        --result-filename "$T/r.json"
    expect_status 0
    n=$(jq .total_output_tokens "$T/r.json")
    scrape_until_moved "$URL/metrics" "$T/after" "$n" "$T/before"
    $CHECK tokens "$T/r.json" "$T/before" "$T/after"
    $CHECK share "$T/r.json" demo-sql 0.75
    # Lengths were drawn around 20 and 12; the server's usage chunk counted them.
    jq -e '.completed == 24 and .output_tokens_from == "usage"
           and (.input_lens | min) >= 10 and (.input_lens | max) <= 30
           and (.output_lens | min) >= 6 and (.output_lens | max) <= 18
           and ([.input_lens[]] | unique | length) > 1' "$T/r.json"
    # The base model as well, through --model.
    cp "$T/after" "$T/before"
    run --separate-stderr "$BENCH" serve --base-url "$URL" --num-prompts 5 \
        --random-input-len 8 --random-output-len 7 --ignore-eos --result-filename "$T/b.json"
    expect_status 0
    scrape_until_moved "$URL/metrics" "$T/after" 35 "$T/before"
    $CHECK tokens "$T/b.json" "$T/before" "$T/after"
}

@test "serve: its percentiles equal numpy's over its own saved per-request times" {
    run --separate-stderr "$BENCH" serve --base-url "$URL" --num-prompts 30 \
        --random-input-len 16 --random-output-len 16 --ignore-eos --max-concurrency 5 \
        --lora-modules demo-sql demo-chat demo-code --metric-percentiles 25,50,75,90,99 \
        --result-filename "$T/r.json"
    expect_status 0
    $CHECK percentiles "$T/r.json"
    $CHECK concurrency "$T/r.json" 5
    jq -e '([.itls[] | length] | add) > 0 and .p25_itl_ms <= .p75_itl_ms' "$T/r.json"
}

@test "serve: an adapter the stack does not hold is its 404, each request failed and counted as no token" {
    run --separate-stderr "$BENCH" serve --base-url "$URL" --num-prompts 3 \
        --random-input-len 4 --random-output-len 4 --lora-modules no-such-adapter \
        --result-filename "$T/r.json"
    expect_status 1
    [[ "$stderr" == *"request 0 failed: HTTP 404: "*"no-such-adapter"* ]]
    jq -e '.failed == 3 and .total_output_tokens == 0' "$T/r.json"
}

@test "campaign --quick of examples/bench/multi-tenancy.json: every cell contained and counted, the report's tables and figures" {
    BENCH_PORT=$((PORT + 10)) LORA_BIN="$LORA_BIN" run --separate-stderr \
        "$ROOT/examples/bench/multi-tenancy.sh" "$T/study" --quick
    expect_status 0
    [[ "$output" == *"campaign: 14 cells in $T/study/campaign (14 run now, 0 kept from before); 0 with failed requests or outside their window; 0 whose server counters did not match"* ]]
    C=$T/study/campaign
    [ "$(ls "$C"/cells/cell-*.json | wc -l)" -eq 14 ]
    for f in "$C"/cells/cell-*.json; do
        jq -e '.status == "ok" and .contained and .server.tokens_match
               and .tokens == .num_prompts * 16 and (.cpu.programs | has("lora-worker"))
               and (.cpu.programs | has("lora-engine")) and .cpu.programs["lora-worker"] > 0' \
            "$f" > /dev/null || { echo "$f"; jq 'del(.result)' "$f"; return 1; }
    done
    # The cost driver as the server counted it: one adapter per step for N=1, more for N=8.
    jq -se 'map(select(.configuration == "N=1")) | all(.server.mean_step_adapters == 1)' \
        "$C"/cells/cell-*.json
    jq -se 'map(select(.configuration == "N=8" and .concurrency == 16))
            | all(.server.mean_step_adapters > 2
                  and (.server.adapters | keys) == ["a1","a2","a3","a4","a5","a6","a7","a8"])' \
        "$C"/cells/cell-*.json
    jq -se 'map(select(.configuration == "base")) | all(.server.mean_step_adapters == 0
            and .server.adapters == {})' "$C"/cells/cell-*.json
    # Skewed: the server counted a1's tokens for the requests the list gave a1 (21 in 28).
    jq -se 'map(select(.configuration == "N=8 skewed" and .concurrency == 16))[0]
            | .server.adapters.a1.generation_tokens == 16 * ([.result.models[] | select(. == "a1")] | length)
              and .server.adapters.a1.generation_tokens / .tokens > 0.7' "$C"/cells/cell-*.json
    R=$C/report.md
    for h in "## Cells" "## Idle" "## Cost per generated token" "## Stack CPU per program" \
             "## N distinct adapters against N=1" "## Skew" "## Hypotheses" \
             "## Published figures beside the measured ones" "## Latency percentiles" \
             "## Figures"; do
        grep -qxF -- "$h" "$R" || { echo "no '$h' in the report"; return 1; }
    done
    grep -q '^| 14 | 14 | 14 | 0 | 0 | 0 | 14 of 14 |$' "$R"
    for conf in base N=1 N=2 N=4 N=8 "N=4 skewed" "N=8 skewed"; do
        for c in 8 16; do
            grep -qE "^\| $conf \| [0-9] \| (uniform|skewed) \| $c \| 1 \| [0-9.]+ \| " "$R" ||
                { echo "no cost row for $conf at $c"; return 1; }
        done
    done
    grep -qE '^\| 16 \| N=8 \| 8 \| [+-][0-9.]+% \| ' "$R"
    grep -qE '^\| 16 \| N=8 skewed \| N=8 \| 8 \| 75% \| [+-][0-9.]+% \| ' "$R"
    grep -qE '^\| H1 \| Serving 8 distinct adapters .* \| 8 \| time_per_token \| [+-][0-9.]+% \| .* \| \*\*(not )?falsified\*\*' "$R"
    grep -qE '^\| H1-energy \| .* \| not judged: energy not measured \|$' "$R"
    grep -qE '^\| H2 \| .* \| 16 \| time_per_token \| [+-][0-9.]+% \| .*abs margin\(N=8 skewed vs N=8\) > \+3\.0% \| \*\*' "$R"
    grep -qE '^\| time per generated token, 8 rank-16 adapters against 1 \| \+6\.0% \| vLLM 0\.30 on one A10 GPU \| [+-][0-9.]+% at concurrency 8, [+-][0-9.]+% at concurrency 16 \|$' "$R"
    for png in cost-time.png cost-cpu.png; do
        [ -s "$C/$png" ] && grep -qF "]($png)" "$R"
        [ "$(head -c 8 "$C/$png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]
    done
}

@test "a frontend killed mid-stream: the requests in flight fail as streams cut short, and no token of theirs is counted" {
    local port=$((PORT + 5))
    RUN2=$T/run2
    "$STACK" up --run-dir "$RUN2" --port "$port" --metrics-port $((port + 1)) \
        > /dev/null 2> "$T/up.err" 3>&- || { cat "$T/up.err" >&2; return 1; }
    frontend=$(awk '$1 == "frontend-0" { print $2 }' "$RUN2/pids")
    [ -n "$frontend" ]
    # Long streams (1500 tokens each), 4 at once; the frontend goes once the first tokens came.
    "$BENCH" serve --base-url "http://127.0.0.1:$port" --num-prompts 4 \
        --random-input-len 8 --random-output-len 1500 --ignore-eos --max-concurrency 4 \
        --result-filename "$T/r.json" > "$T/out" 2> "$T/err" 3>&- &
    bench=$!
    deadline=$((SECONDS + 30))
    until curl -sf "http://127.0.0.1:$port/metrics" |
        grep -qE '^vllm:num_requests_running\{[^}]*\} [1-9]'; do
        [ "$SECONDS" -lt "$deadline" ] || { echo "no request ever ran" >&2; return 1; }
        sleep 0.05
    done
    sleep 0.3
    kill -KILL "$frontend"
    wait "$bench" || status=$?
    [ "${status:-0}" -eq 1 ] || { cat "$T/err"; return 1; }
    grep -q "failed: stream cut short after [0-9]* chunks" "$T/err"
    jq -e '.completed == 0 and .failed == 4 and .total_output_tokens == 0
           and (.output_lens | all(. == 0))
           and (.errors | all(startswith("stream cut short")))
           and ([.generated_texts[] | length] | add) > 0' "$T/r.json"
}
