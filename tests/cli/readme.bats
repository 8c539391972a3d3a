#!/usr/bin/env bats
# The README's sections, pasted into one shell top to bottom as a reader would (the ```sh blocks,
# through tests/ref/readme_walk.py): no section's files or processes break a later one. The ports
# are the README's own, so the test is skipped, with the reason, when one of them is taken.

load ../helpers
bats_require_minimum_version 1.5.0

WALK_SECTIONS=(lora-stack lora-worker "The engine and its workers" lora-frontend lora-metrics
    lora-inspect "Behind a router: what it reads")
WALK_PORTS=(8000 8100 9100 9101 9200)

WALK_RUNS=()

teardown() {
    [ -z "${WALK_PID:-}" ] || kill -- -"$WALK_PID" 2> /dev/null || true
    for r in "${WALK_RUNS[@]}"; do "$LORA_BIN/lora-stack" down --run-dir "$r" > /dev/null 2>&1 || true; done
}

port_taken() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }

@test "the README's sections run top to bottom in one shell" {
    for p in "${WALK_PORTS[@]}"; do
        if port_taken "$p"; then skip "port $p, which the README uses, is taken"; fi
    done
    local scratch=$BATS_TEST_TMPDIR/tmp
    mkdir -p "$scratch" "$BATS_TEST_TMPDIR/xdg"
    WALK_RUNS=("$BATS_TEST_TMPDIR/xdg/lora-stack" "$scratch/router-run")
    "$PYTHON" "$ROOT/tests/ref/readme_walk.py" "$ROOT/README.md" "$LORA_BIN" "$scratch" \
        "${WALK_SECTIONS[@]}" > "$BATS_TEST_TMPDIR/walk.sh"
    cd "$ROOT"
    # Its own process group, so that whatever it left in the background is stopped afterwards.
    # (Without bats' descriptor 3, which a program left running would hold open.)
    XDG_RUNTIME_DIR=$BATS_TEST_TMPDIR/xdg setsid timeout 300 bash "$BATS_TEST_TMPDIR/walk.sh" \
        > "$BATS_TEST_TMPDIR/out" 2>&1 3>&- &
    WALK_PID=$!
    local rc=0
    wait "$WALK_PID" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "the walk exited $rc; its last lines:" >&2
        tail -40 "$BATS_TEST_TMPDIR/out" >&2
        return 1
    fi
    # Each section did what it says, not only exit 0.
    grep -q 'lora-stack: down' "$BATS_TEST_TMPDIR/out"
    grep -q '"finish_reason"' "$BATS_TEST_TMPDIR/out"
    grep -q '"object":"list"' "$BATS_TEST_TMPDIR/out"
    grep -q '^vllm:lora_requests_info' "$BATS_TEST_TMPDIR/out"
    grep -q '^healthy$' "$BATS_TEST_TMPDIR/out"
    # The router section: the frontend's own /metrics, read by the router's rules. Both start-up
    # adapters sit in the two slots (resident = running), and the residency scorer sees them
    # at level gpu on every rank; the third adapter scores 0 on a full endpoint.
    grep -Eq '^pod running=(demo-sql,demo-chat|demo-chat,demo-sql) waiting= max_lora=2$' \
        "$BATS_TEST_TMPDIR/out"
    grep -Eq '^pod loaded=.*demo-sql:gpu' "$BATS_TEST_TMPDIR/out"
    grep -Eq '^pod loaded=.*demo-chat:gpu.* gpu=2 max=2 ' "$BATS_TEST_TMPDIR/out"
    grep -Eq '^1 pod 0\.0$' "$BATS_TEST_TMPDIR/out"
}
