#!/usr/bin/env bats
# The manual: every page renders without a warning, every program has a page with the sections
# an operator looks for, lora-stack's and lora-metrics' usage and pages list the same options,
# lora-stack-metrics(7) documents exactly the families a scrape of lora-metrics has, and make
# install puts programs and pages where they belong.

load ../helpers

METRICS_PAGE="$ROOT/man/lora-stack-metrics.7"

# lora-metrics exits 0 on SIGTERM; waiting for it keeps the shell from reporting a kill.
teardown() {
    local pid
    if [ -s "$BATS_TEST_TMPDIR/metrics.pid" ]; then
        pid=$(cat "$BATS_TEST_TMPDIR/metrics.pid")
        kill -TERM "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    fi
}

# The families lora-stack-metrics(7) documents: the ".B name" line after each .TP of FAMILIES.
page_families() {
    sed 's/\\-/-/g' "$METRICS_PAGE" | awk '
        /^\.SH/ { inside = ($2 == "FAMILIES"); next }
        inside && /^\.TP/ { tp = 1; next }
        inside && tp { tp = 0; if ($1 == ".B") print $2 }
    ' | sort
}

# Scrapes lora-metrics --stdin fed the generated stream of tests/ref/metrics_stream.py, once the
# whole stream is applied (/health names its end), into $BATS_TEST_TMPDIR/scrape.
scrape_generated_stream() {
    local t=$BATS_TEST_TMPDIR port="" deadline=$((SECONDS + 10))
    $PYTHON "$ROOT/tests/ref/metrics_stream.py" > "$t/stream.mp"
    "$LORA_BIN/lora-metrics" --stdin --listen 127.0.0.1:0 < "$t/stream.mp" 2> "$t/err" &
    echo $! > "$t/metrics.pid"
    while :; do
        [ -n "$port" ] ||
            port=$(sed -n 's/^lora-metrics: ready: http:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$t/err")
        [ -n "$port" ] &&
            curl -s "http://127.0.0.1:$port/health" | grep -qx 'stdin: end of input' && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "lora-metrics did not take the whole stream within 10 s:" >&2
            cat "$t/err" >&2
            return 1
        fi
        sleep 0.05
    done
    curl -sf "http://127.0.0.1:$port/metrics" > "$t/scrape"
}

@test "every manual page renders without warnings (groff -man -ww -z)" {
    for page in "$ROOT"/man/*.[17]; do
        run groff -man -ww -z "$page"
        [ "$status" -eq 0 ] && [ -z "$output" ] || { echo "$page: $output"; return 1; }
    done
}

@test "every program has a page with NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, ENVIRONMENT, EXAMPLES, SEE ALSO" {
    for prog in "$LORA_BIN"/lora-*; do
        page="$ROOT/man/$(basename "$prog").1"
        [ -f "$page" ] || { echo "no page for $prog"; return 1; }
        for section in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" ENVIRONMENT EXAMPLES "SEE ALSO"; do
            grep -q "^\.SH \"\{0,1\}$section\"\{0,1\}\$" "$page" || { echo "$page: no $section"; return 1; }
        done
    done
    [ -f "$ROOT/man/lora-stack-protocol.7" ]
}

@test "lora-stack --help and lora-stack(1) OPTIONS list the same options" {
    diff <("$LORA_BIN/lora-stack" --help | grep -o -- '^  \(-h, \)\{0,1\}--[a-z][a-z-]*' |
               sed 's/.*--/--/' | sort) \
         <(man_page_options "$ROOT/man/lora-stack.1")
}

@test "lora-metrics --help and lora-metrics(1) OPTIONS list the same options" {
    diff <("$LORA_BIN/lora-metrics" --help | grep -o -- '^  --[a-z][a-z-]*' | sed 's/ *//' |
               sort) \
         <(man_page_options "$ROOT/man/lora-metrics.1")
}

@test "lora-stack-metrics(7) exists, renders cleanly and names its families" {
    run groff -man -ww -z "$METRICS_PAGE"
    [ "$status" -eq 0 ] && [ -z "$output" ] || { echo "$output"; return 1; }
    [ "$(page_families | wc -l)" -ge 30 ]
    twice=$(page_families | uniq -d)
    [ -z "$twice" ] || { echo "named twice: $twice"; return 1; }
}

@test "lora-stack-metrics(7) documents exactly the families of a scrape, each with a series" {
    scrape_generated_stream
    diff <(sed -n 's/^# TYPE \([^ ]*\) .*/\1/p' "$BATS_TEST_TMPDIR/scrape" | sort) \
         <(page_families)
    # The stream is rich enough that no family is empty, so none is documented unseen.
    while read -r family; do
        grep -q "^$family\(_bucket\)\{0,1\}[{ ]" "$BATS_TEST_TMPDIR/scrape" ||
            { echo "no series of $family"; return 1; }
    done < <(page_families)
}

@test "each family's type in lora-stack-metrics(7) is the type of the scrape" {
    scrape_generated_stream
    # The first word after the family's .B line: Gauge, Counter or Histogram.
    sed 's/\\-/-/g' "$METRICS_PAGE" | awk '
        /^\.SH/ { inside = ($2 == "FAMILIES"); next }
        inside && /^\.TP/ { tp = 1; next }
        inside && tp == 1 && $1 == ".B" { name = $2; tp = 2; next }
        inside && tp == 2 { tp = 0; t = tolower($1); sub(/[.,;]$/, "", t); print name, t }
    ' | sort > "$BATS_TEST_TMPDIR/page-types"
    sed -n 's/^# TYPE //p' "$BATS_TEST_TMPDIR/scrape" | sort | diff - "$BATS_TEST_TMPDIR/page-types"
}

@test "make install PREFIX=... installs every program and page" {
    # The build under test, with the CUDA setting it was made with: nothing is rebuilt.
    cuda=0
    [[ "$LORA_BIN" == *-cuda/bin ]] && cuda=1
    make -C "$ROOT" --no-print-directory -s install PREFIX="$BATS_TEST_TMPDIR/p" \
        BUILD="${LORA_BIN%/bin}" CUDA=$cuda > /dev/null
    for prog in "$LORA_BIN"/lora-*; do
        [ -x "$BATS_TEST_TMPDIR/p/bin/$(basename "$prog")" ]
    done
    [ -f "$BATS_TEST_TMPDIR/p/share/man/man1/lora-stack.1" ]
    [ -f "$BATS_TEST_TMPDIR/p/share/man/man7/lora-stack-protocol.7" ]
    [ -f "$BATS_TEST_TMPDIR/p/share/man/man7/lora-stack-metrics.7" ]
    run "$BATS_TEST_TMPDIR/p/bin/lora-stack" --help
    [ "$status" -eq 0 ]
}
