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
