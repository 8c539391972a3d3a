#!/usr/bin/env bats
# What an adapter directory under --lora-root can hold, over the frontend's
# /v1/load_lora_adapter on a real engine, worker and frontend (ipc sockets in a temporary run
# directory, always stopped): a FIFO, a character device or a socket in place of either file
# fails the load at once with a clear message; a symbolic link under the root is refused; a
# directory swapped for a link to outside while loads run never loads from outside; a file's
# bytes never appear in an error; a load that hangs fails at its deadline; the worker, not only
# the frontend, refuses a link; lora-stack gives the workers the root. After each, the stack
# still serves.

load ../helpers
bats_require_minimum_version 1.5.0

setup_file() {
    export D=$BATS_FILE_TMPDIR
    make_model_and_adapters "$D" good
    mkdir -p "$D/root" "$D/outside"
    cp -r "$D/good" "$D/root/good"
    cp -r "$D/good" "$D/outside/good"
    mkdir -m 0700 "$D/run"
    start_logged engine "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$D/run" --max-loras 2 \
        --max-cpu-loras 64
    LORA_WORKER_TEST_STUCK_LOAD=stuck start_logged worker "$WORKER" serve \
        --engine "ipc://$D/run/worker.sock" --rank 0 --lora-root "$D/root" \
        --load-timeout-ms 1500
    start_logged frontend "$LORA_BIN/lora-frontend" --run-dir "$D/run" --port 0 \
        --enable-runtime-lora --lora-root "$D/root"
    wait_for_text "$D/frontend.log" "ready: http://" 120
    ready_port "$D/frontend.log" > "$D/port"
}

teardown_file() {
    stop_pids "$D/pids"
}

# Loads NAME from PATH: sets $code and $body (at most 30 s: a hang fails the test, not the run).
load_adapter() {
    local out
    out=$(curl -s --max-time 30 -w '\n%{http_code}' "http://127.0.0.1:$(cat "$D/port")/v1/load_lora_adapter" \
        -H 'Content-Type: application/json' \
        -d "{\"lora_name\":\"$1\",\"lora_path\":\"$2\"}") || true
    code=${out##*$'\n'}
    body=${out%$'\n'*}
}

# The stack still completes a request, on the base model and on adapter $1 when given.
still_serves() {
    local model=${1:-}
    local m=""
    [ -n "$model" ] && m="\"model\":\"$model\","
    run curl -s --max-time 30 -w '\n%{http_code}' "http://127.0.0.1:$(cat "$D/port")/v1/completions" \
        -H 'Content-Type: application/json' -d "{$m\"prompt\":\"hi\",\"max_tokens\":2}"
    [[ "$output" == *$'\n'200 ]] || { echo "no completion: $output"; return 1; }
}

# An adapter directory like good with FILE replaced by what the rest of the arguments make.
special_dir() { # DIR FILE KIND
    rm -rf "$1"
    cp -r "$D/good" "$1"
    rm -f "$1/$2"
    case $3 in
    fifo) mkfifo "$1/$2" ;;
    chardev) mknod "$1/$2" c 1 5 ;; # a copy of /dev/zero
    socket) "$PYTHON" -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$1/$2" ;;
    esac
}

@test "adapter files: a FIFO, a device or a socket in place of either file fails at once" {
    kinds=(fifo socket)
    [ "$(id -u)" = 0 ] && kinds+=(chardev)
    for file in adapter_model.safetensors adapter_config.json; do
        for kind in "${kinds[@]}"; do
            special_dir "$D/root/sp-$kind" "$file" "$kind"
            SECONDS=0
            load_adapter "sp-$kind-${file%%.*}" "$D/root/sp-$kind"
            echo "$file as $kind: $code $body (${SECONDS}s)"
            [ "$code" = 400 ]
            [[ "$body" == *"$file: not a regular file"* ]]
            [ "$SECONDS" -lt 10 ]
        done
    done
    still_serves
}

@test "adapter files: a link to /dev/zero in place of a file is refused as a link" {
    special_dir "$D/root/zero" adapter_model.safetensors none
    ln -s /dev/zero "$D/root/zero/adapter_model.safetensors"
    load_adapter zero "$D/root/zero"
    echo "$code $body"
    [ "$code" = 400 ]
    [[ "$body" == *"symbolic link"* ]]
    still_serves
}

@test "adapter files: a symbolic link to a file inside the root is refused" {
    special_dir "$D/root/linked" adapter_model.safetensors none
    ln -s ../good/adapter_model.safetensors "$D/root/linked/adapter_model.safetensors"
    load_adapter linked "$D/root/linked"
    echo "$code $body"
    [ "$code" = 400 ]
    [[ "$body" == *"symbolic link"* ]]
    ln -s good "$D/root/dir-link"
    load_adapter dir-link "$D/root/dir-link"
    echo "$code $body"
    [ "$code" = 400 ]
    [[ "$body" == *"symbolic link"* ]]
    load_adapter good "$D/root/good"
    [ "$code" = 200 ]
    still_serves good
}

@test "adapter files: a directory swapped for a link to outside while loading never loads from outside" {
    # root/race is, in turn, a directory holding an adapter that cannot load (its config is
    # not JSON) and a link to outside/good, which would load. A 200 is a load from outside.
    mkdir -p "$D/root/race"
    cp "$D/good/adapter_model.safetensors" "$D/root/race/"
    echo 'not json' > "$D/root/race/adapter_config.json"
    ln -s "$D/outside/good" "$D/root/race.link"
    "$PYTHON" - "$D/root" 5 > "$D/swapper.log" 2>&1 3>&- <<'PY' &
import os, random, sys, time
root, seconds = sys.argv[1], float(sys.argv[2])
race, parked, link = (os.path.join(root, n) for n in ("race", "race.dir", "race.link"))
end = time.monotonic() + seconds
swaps = 0
# Each state lasts about as long as a load takes to go from the frontend's check to the
# worker's open, so that a check of the directory is often followed by an open of the link.
while time.monotonic() < end:
    os.rename(race, parked)
    os.rename(link, race)
    time.sleep(random.uniform(0, 0.004))
    os.rename(race, link)
    os.rename(parked, race)
    time.sleep(random.uniform(0, 0.004))
    swaps += 1
print(swaps, "swaps")
PY
    swapper=$!
    loaded=0 tries=0
    while kill -0 "$swapper" 2> /dev/null; do
        tries=$((tries + 1))
        load_adapter "race-$tries" "$D/root/race"
        [ "$code" = 200 ] && loaded=$((loaded + 1))
        [ -n "$code" ] && [ "$code" != 000 ]
    done
    wait "$swapper"
    cat "$D/swapper.log"
    echo "$loaded of $tries loads came from outside the root"
    [ "$tries" -ge 5 ]
    [ "$loaded" -eq 0 ]
    still_serves
}

@test "adapter files: a file's bytes never appear in an error" {
    secret='TOPSECRET-4711 {"r": TOPSECRET-4711}'
    printf '%s' "$secret" > "$D/outside/secret"
    # First 8 bytes of the secret as the little-endian header length a reader would report.
    number=$("$PYTHON" -c 'import sys; print(int.from_bytes(sys.argv[1].encode()[:8], "little"))' "$secret")
    for file in adapter_config.json adapter_model.safetensors; do
        special_dir "$D/root/copy-${file%%.*}" "$file" none
        cp "$D/outside/secret" "$D/root/copy-${file%%.*}/$file"
        special_dir "$D/root/link-${file%%.*}" "$file" none
        ln -s "$D/outside/secret" "$D/root/link-${file%%.*}/$file"
        for d in copy link; do
            load_adapter "$d-${file%%.*}" "$D/root/$d-${file%%.*}"
            echo "$d $file: $code $body"
            [ "$code" = 400 ]
            [[ "$body" == *"$file"* ]]
            [[ "$body" != *TOPSECRET* ]]
            [[ "$body" != *"$number"* ]]
        done
    done
    # A JSON error gives the position.
    load_adapter copy-adapter_config "$D/root/copy-adapter_config"
    [[ "$body" == *"(byte "* ]]
    ! grep -q TOPSECRET "$D"/*.log
    still_serves
}

@test "adapter files: a load that hangs fails at its deadline while the stack serves" {
    cp -r "$D/good" "$D/root/stuck"
    load_adapter stuck "$D/root/stuck" &
    loader=$!
    sleep 0.3 # the load reaches the worker, which holds it for 1.5 s
    # The engine steps while a load is in flight: a completion answers before the load does.
    still_serves
    kill -0 "$loader"
    wait "$loader"
    SECONDS=0
    load_adapter stuck "$D/root/stuck"
    echo "$code $body (${SECONDS}s)"
    [ "$code" = 400 ]
    [[ "$body" == *"did not finish within 1500 ms"* ]]
    [ "$SECONDS" -lt 20 ]
    grep -q "did not finish within 1500 ms" "$D/worker.log"
    # Later loads do not queue behind the stuck one.
    cp -r "$D/good" "$D/root/after"
    load_adapter after "$D/root/after"
    echo "$code $body"
    [ "$code" = 200 ]
    still_serves after
}

@test "adapter files: the worker refuses a link under the root even when no frontend checked it" {
    # The engine's control socket takes any path: the worker's open is the guard that holds.
    ln -s "$D/outside/good" "$D/root/ctl-link"
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$D/run" load ctl-link "$D/root/ctl-link"
    echo "$output"
    [[ "$output" == *"symbolic link"* ]]
    [[ "$output" != *'"ok": true'* ]]
    # A path outside the root is the operator's, and loads as given.
    run $PYTHON "$ROOT/tests/ref/client.py" control --run-dir "$D/run" load outside-good "$D/outside/good"
    echo "$output"
    [[ "$output" != *"error"* ]]
    still_serves outside-good
}

@test "adapter files: lora-stack up gives the workers the frontends' --lora-root" {
    local r=$BATS_TEST_TMPDIR/stack port
    port=$("$PYTHON" -c 'import socket; s = socket.create_server(("127.0.0.1", 0)); print(s.getsockname()[1])')
    run --separate-stderr "$LORA_BIN/lora-stack" up --run-dir "$r" --model "$D/m" --frontends 0 \
        --metrics-port "$port" --enable-runtime-lora --lora-root "$D/root" --load-timeout-ms 5000
    echo "$output $stderr"
    worker=$(sed -n 's/^worker-0 \([0-9]*\)$/\1/p' "$r/pids")
    cmdline=$(tr '\0' ' ' < "/proc/$worker/cmdline")
    "$LORA_BIN/lora-stack" down --run-dir "$r" > /dev/null 2>&1 || true
    echo "worker: $cmdline"
    [[ "$cmdline" == *"--lora-root $D/root"* ]]
    [[ "$cmdline" == *"--load-timeout-ms 5000"* ]]
}
