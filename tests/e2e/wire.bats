#!/usr/bin/env bats
# The wire protocol against an independent msgpack implementation (python3-msgpack), both ways:
# what the C encoders write, python reads as the catalogue documents it; what python writes
# (unknown keys, float64 where float32 is usual), the C decoders read with the same values; and
# malformed bodies are rejected, each with a message, without disturbing the next message.
# The C side is the unit-test binary: test_msg --emit DIR / --check DIR.

load ../helpers
bats_require_minimum_version 1.5.0

setup_file() {
    if [ -z "${LORA_BUILD:-}" ]; then
        LORA_BUILD=build/main
        [ -d "$ROOT/build/main-cuda" ] && LORA_BUILD=build/main-cuda
    fi
    case "$LORA_BUILD" in
    /*) CODEC="$LORA_BUILD/tests/unit/test_msg" ;;
    *) CODEC="$ROOT/$LORA_BUILD/tests/unit/test_msg" ;;
    esac
    export CODEC
    export WIRE="$ROOT/tests/ref/wire_compat.py"
    export D=$BATS_FILE_TMPDIR
}

# Fails with a clear message when a prerequisite is missing, rather than skipping.
need_tools() {
    if [ ! -x "$CODEC" ]; then
        echo "missing $CODEC: build it with make (LORA_BUILD=$LORA_BUILD)" >&2
        return 1
    fi
    if ! "$PYTHON" -c 'import msgpack' 2>/dev/null; then
        echo "$PYTHON has no msgpack module: make deps installs python3-msgpack" >&2
        return 1
    fi
}

@test "wire: C encodes every message type, python-msgpack reads the documented fields" {
    need_tools
    run "$CODEC" --emit "$D/c"
    expect_status 0
    run "$PYTHON" "$WIRE" expect-emitted "$D/c"
    expect_status 0
}

@test "wire: python-msgpack encodes every message type, C decodes the same values" {
    need_tools
    "$PYTHON" "$WIRE" write-valid "$D/py"
    run --separate-stderr "$CODEC" --check "$D/py"
    printf '%s\n' "$output" > "$D/py.out"
    expect_status 0
    run "$PYTHON" "$WIRE" compare-check "$D/py" "$D/py.out"
    expect_status 0
}

@test "wire: malformed bodies are rejected with a message, a valid one after them decodes" {
    need_tools
    "$PYTHON" "$WIRE" write-malformed "$D/bad"
    run --separate-stderr "$CODEC" --check "$D/bad"
    printf '%s\n' "$output" > "$D/bad.out"
    expect_status 1
    run "$PYTHON" "$WIRE" check-malformed "$D/bad" "$D/bad.out"
    expect_status 0
}

@test "wire: the C side of the round trip reads back what it wrote" {
    need_tools
    run "$CODEC" --emit "$D/self"
    expect_status 0
    run --separate-stderr "$CODEC" --check "$D/self"
    expect_status 0
    n_files=$(ls "$D/self" | grep -c '\.msgpack$')
    [ "$n_files" -ge 38 ]
    [ "$(printf '%s\n' "$output" | grep -c '"ok":true')" -eq "$n_files" ]
}

@test "wire: test_msg with a bad argument is a usage error (exit 100)" {
    need_tools
    run "$CODEC" --bogus
    expect_status 100
    run "$CODEC" --check "$D/does-not-exist"
    expect_status 111
}

@test "wire: man/lora-stack-protocol.7 names every message type, field and enum value" {
    need_tools
    run "$CODEC" --emit "$D/man"
    expect_status 0
    run "$PYTHON" "$WIRE" man-check "$D/man" "$ROOT/man/lora-stack-protocol.7"
    expect_status 0
    if command -v groff > /dev/null; then
        run groff -man -ww -z "$ROOT/man/lora-stack-protocol.7"
        expect_status 0
        [ -z "$output" ]
    fi
}
