#!/usr/bin/env bats
# The command line of lora-frontend: help and version, usage errors (exit 100), no engine
# (exit 111), environment mirrors, and the man page against the options the program lists.

load ../helpers
bats_require_minimum_version 1.5.0

FRONTEND="$LORA_BIN/lora-frontend"
MAN="$ROOT/man/lora-frontend.1"

setup() {
    for v in $(compgen -e); do
        case "$v" in LORA_FRONTEND_* | VLLM_*) unset "$v" ;; esac
    done
}

help_options() {
    "$FRONTEND" --help | grep -o -- '^  --[a-z][a-z-]*' | sed 's/^  //' | sort
}


@test "--help and -h print every option on stdout and exit 0" {
    for flag in --help -h; do
        run --separate-stderr "$FRONTEND" $flag
        expect_status 0
        [[ "$output" == usage:* ]]
        [[ "$output" == *--lora-root* ]]
        [[ "$output" == *"--lora-info MODE"* ]]
        [[ "$output" == *"--engine-publish-endpoint EP"* ]]
        [ -z "$stderr" ]
    done
}

@test "--version names the program and the version" {
    run "$FRONTEND" --version
    expect_status 0
    [[ "$output" == "lora-frontend 0.1.0" ]]
}

@test "usage errors exit 100 and name the problem" {
    run --separate-stderr "$FRONTEND"
    expect_status 100
    expect_message "give --run-dir DIR"
    run --separate-stderr "$FRONTEND" --run-dir /tmp --port 70000
    expect_status 100
    expect_message "--port"
    run --separate-stderr "$FRONTEND" --run-dir /tmp --no-such-flag
    expect_status 100
    expect_message "no-such-flag"
    run --separate-stderr "$FRONTEND" --run-dir /tmp --lora-root /nonexistent
    expect_status 100
    expect_message "--lora-root '/nonexistent' is not a directory"
    run --separate-stderr "$FRONTEND" --run-dir /tmp --lora-info other
    expect_status 100
    expect_message "--lora-info must be resident or inflight, not 'other'"
    LORA_FRONTEND_LORA_INFO=busy run --separate-stderr "$FRONTEND" --run-dir /tmp
    expect_status 100
    expect_message "LORA_FRONTEND_LORA_INFO must be resident or inflight, not 'busy'"
    run --separate-stderr "$FRONTEND" --run-dir /tmp --engine-publish-endpoint=
    expect_status 100
    expect_message "--engine-publish-endpoint is empty"
}

@test "--lora-info and --engine-publish-endpoint: the command line wins over the mirrors" {
    mkdir -m 0700 "$BATS_TEST_TMPDIR/run"
    # Valid on the command line, so only the engine is missing: exit 111, not 100.
    LORA_FRONTEND_LORA_INFO=busy run --separate-stderr "$FRONTEND" \
        --run-dir "$BATS_TEST_TMPDIR/run" --lora-info inflight --engine-timeout-ms 200
    expect_status 111
    LORA_FRONTEND_ENGINE_PUBLISH_ENDPOINT=not-an-endpoint run --separate-stderr "$FRONTEND" \
        --run-dir "$BATS_TEST_TMPDIR/run" --engine-timeout-ms 200
    expect_status 111
    expect_message "'not-an-endpoint'"
}

@test "an engine that never answers is a system failure (exit 111)" {
    mkdir -m 0700 "$BATS_TEST_TMPDIR/run"
    run --separate-stderr "$FRONTEND" --run-dir "$BATS_TEST_TMPDIR/run" --engine-timeout-ms 300
    expect_status 111
    expect_message "did not answer within 300 ms"
}

@test "options have environment mirrors; the command line wins" {
    mkdir -m 0700 "$BATS_TEST_TMPDIR/run"
    LORA_FRONTEND_ENGINE_TIMEOUT_MS=200 run --separate-stderr "$FRONTEND" \
        --run-dir "$BATS_TEST_TMPDIR/run"
    expect_status 111
    expect_message "within 200 ms"
    LORA_FRONTEND_ENGINE_TIMEOUT_MS=200 run --separate-stderr "$FRONTEND" \
        --run-dir "$BATS_TEST_TMPDIR/run" --engine-timeout-ms 250
    expect_message "within 250 ms"
}

@test "the man page lists exactly the options of --help" {
    diff <(help_options) <(man_page_options "$MAN")
}

@test "--generation-config is listed; a value that is not auto, vllm or a directory exits 100" {
    run "$FRONTEND" --help
    [[ "$output" == *"  --generation-config SRC "* ]]
    for v in bogus /etc/passwd "$BATS_TEST_TMPDIR/none"; do
        run --separate-stderr "$FRONTEND" --run-dir /tmp --generation-config "$v"
        expect_status 100
        expect_message "--generation-config '$v' must be auto, vllm or a directory"
    done
    LORA_FRONTEND_GENERATION_CONFIG=bogus run --separate-stderr "$FRONTEND" --run-dir /tmp
    expect_status 100
    expect_message "--generation-config 'bogus'"
}

@test "--request-timeout, --max-connections-per-ip, --max-body-memory: listed, checked, mirrored" {
    run "$FRONTEND" --help
    [[ "$output" == *"  --request-timeout S "* ]]
    [[ "$output" == *"  --max-connections-per-ip N "* ]]
    [[ "$output" == *"  --max-body-memory N "* ]]
    for bad in "--request-timeout -1" "--request-timeout x" "--max-connections-per-ip -1" \
        "--max-connections-per-ip 70000" "--max-body-memory -5"; do
        run --separate-stderr "$FRONTEND" --run-dir /tmp $bad
        expect_status 100
        expect_message "${bad%% *}"
    done
    run --separate-stderr "$FRONTEND" --run-dir /tmp --max-body-memory 2048 \
        --max-body-bytes 4096
    expect_status 100
    expect_message "--max-body-memory 2048 is below --max-body-bytes 4096"
    LORA_FRONTEND_REQUEST_TIMEOUT=soon run --separate-stderr "$FRONTEND" --run-dir /tmp
    expect_status 100
    expect_message "LORA_FRONTEND_REQUEST_TIMEOUT"
    LORA_FRONTEND_MAX_CONNECTIONS_PER_IP=-3 run --separate-stderr "$FRONTEND" --run-dir /tmp
    expect_status 100
    expect_message "LORA_FRONTEND_MAX_CONNECTIONS_PER_IP"
    LORA_FRONTEND_MAX_BODY_MEMORY=-5 run --separate-stderr "$FRONTEND" --run-dir /tmp
    expect_status 100
    expect_message "LORA_FRONTEND_MAX_BODY_MEMORY"
    # Valid values: only the engine is missing (exit 111).
    mkdir -m 0700 "$BATS_TEST_TMPDIR/run"
    LORA_FRONTEND_REQUEST_TIMEOUT=5 LORA_FRONTEND_MAX_CONNECTIONS_PER_IP=0 \
        run --separate-stderr "$FRONTEND" --run-dir "$BATS_TEST_TMPDIR/run" \
        --max-body-memory 0 --engine-timeout-ms 200
    expect_status 111
}

@test "--lora-allow-symlinks is listed in --help and the man page; a value given to it exits 100" {
    run --separate-stderr "$FRONTEND" --help
    expect_status 0
    [[ "$output" == *"  --lora-allow-symlinks"* ]]
    grep -qF -- '\-\-lora\-allow\-symlinks' "$ROOT/man/lora-frontend.1"
    run --separate-stderr "$FRONTEND" --run-dir /tmp --lora-allow-symlinks=yes
    expect_status 100
    expect_message "--lora-allow-symlinks"
    LORA_FRONTEND_LORA_ALLOW_SYMLINKS=maybe run --separate-stderr "$FRONTEND" --run-dir /tmp
    expect_status 100
    expect_message "LORA_FRONTEND_LORA_ALLOW_SYMLINKS"
}
