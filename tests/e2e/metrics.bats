#!/usr/bin/env bats
# lora-metrics against the truth on real stacks (workers, engine, frontend and exporters, started
# by tests/ref/metrics_truth.py and stopped by it whatever happens): a scripted workload compared
# step by step with lora-inspect residency and the request states the script knows, in both
# --lora-info modes, at TP=1 and TP=2; the first scrape after ready; a load on an idle engine;
# a forced rank disagreement; restarts, a stopped engine and two engines.

load ../helpers
bats_require_minimum_version 1.5.0

TRUTH="$PYTHON $ROOT/tests/ref/metrics_truth.py"

truth() { # SCENARIO [OPTIONS]: runs it with its work in the test's temp dir
    run $TRUTH "$1" --bin "$LORA_BIN" --work "$BATS_TEST_TMPDIR/work" "${@:2}"
    echo "$output"
    expect_status 0
}

@test "a scripted workload at TP=1: every residency and request series equals the truth after each step" {
    truth workload --tp 1 --record "$BATS_FILE_TMPDIR/tp1.rec"
    [[ "$output" == *"a stream for c, queued behind the full slots"* ]]
    [[ "$output" == *"no series names c after its unload"* ]]
}

@test "the same workload at TP=2: the truth holds and the residency series equal TP=1's" {
    [ -s "$BATS_FILE_TMPDIR/tp1.rec" ] ||
        $TRUTH workload --bin "$LORA_BIN" --work "$BATS_TEST_TMPDIR/tp1" --tp 1 \
            --record "$BATS_FILE_TMPDIR/tp1.rec"
    truth workload --tp 2 --record "$BATS_TEST_TMPDIR/tp2.rec"
    diff "$BATS_FILE_TMPDIR/tp1.rec" "$BATS_TEST_TMPDIR/tp2.rec"
    [ "$(grep -c '^== ' "$BATS_TEST_TMPDIR/tp2.rec")" -eq 9 ]
}

@test "the first scrape after ready shows the --lora-modules adapters; a load on an idle engine shows within 500 ms" {
    truth idle
}

@test "a rank that ignores an add sets lora_residency_disagreement to 1; the unload still succeeds" {
    truth disagree
}

@test "a restart resets counters; a stopped engine is lost and comes back; two engines side by side" {
    truth lifecycle
}
