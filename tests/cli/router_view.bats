#!/usr/bin/env bats
# tests/ref/router_view.py on written scrapes: its model of the lora-load-state-scorer reads
# residency as the scorer's pull request expects its extractor to (the cases of its extractor
# and scorer tests, transcribed into the text format), and its usage errors exit 100.

load ../helpers
bats_require_minimum_version 1.5.0

VIEW="$PYTHON $ROOT/tests/ref/router_view.py"

setup() {
    T=$BATS_TEST_TMPDIR
}

# scrape NAME LINE...: file $T/NAME.prom holding the lines.
scrape() {
    local name=$1
    shift
    printf '%s\n' "$@" > "$T/$name.prom"
}

loaded() { # ENGINE ADAPTER LEVEL PINNED VALUE [RANK]
    local rank=${6:+,rank=\"$6\"}
    local labels="engine=\"$1\",adapter_name=\"$2\",level=\"$3\",pinned=\"$4\"$rank"
    echo "vllm:lora_adapter_loaded{$labels} $5"
}

@test "router_view: two engines' series are one set: gpu outranks cpu, zeroes are absent" {
    scrape S "$(loaded 0 alice gpu false 1)" "$(loaded 0 bob cpu true 1)" \
        "$(loaded 0 dave gpu false 0)" "$(loaded 1 alice cpu false 1)" \
        "$(loaded 1 carol gpu false 1)" \
        'vllm:num_gpu_loaded_lora_adapters{model_name="base",engine="0"} 1' \
        'vllm:num_gpu_loaded_lora_adapters{model_name="base",engine="1"} 2'
    run $VIEW residency "S=$T/S.prom"
    expect_status 0
    [ "$output" = "S loaded=alice:gpu,bob:cpu:pinned,carol:gpu gpu=2 max=0 active=" ]
}

@test "router_view: residency without the count gauge, with neither family, with a rank label" {
    scrape S "$(loaded 0 alice gpu false 1)" "$(loaded 0 bob cpu false 1)" \
        "$(loaded 0 carol gpu false 1)"
    run $VIEW residency "S=$T/S.prom"
    [ "$output" = "S loaded=alice:gpu,bob:cpu,carol:gpu gpu=2 max=0 active=" ]
    scrape N 'vllm:num_requests_running{engine="0"} 0'
    run $VIEW residency "N=$T/N.prom"
    [ "$output" = "N loaded=- gpu=0 max=0 active=" ]
    scrape Z 'vllm:num_gpu_loaded_lora_adapters{engine="0"} 0'
    run $VIEW residency "Z=$T/Z.prom"
    [ "$output" = "Z loaded= gpu=0 max=0 active=" ]
    scrape R "$(loaded 0 alice gpu false 1 64)" "$(loaded 1 alice cpu false 1 64)" \
        'vllm:num_gpu_loaded_lora_adapters{engine="0"} 1'
    run $VIEW residency "R=$T/R.prom"
    [ "$output" = "R loaded=alice:gpu gpu=1 max=0 active=" ]
}

@test "router_view: the slot gauge wins over max_lora; without it, max_lora counts" {
    local info='vllm:lora_requests_info{max_lora="2",running_lora_adapters="a"} 5'
    scrape G "$info" 'vllm:max_gpu_lora_adapters{engine="0"} 4' \
        'vllm:max_gpu_lora_adapters{engine="1"} 3'
    scrape L "$info"
    run $VIEW residency "G=$T/G.prom" "L=$T/L.prom"
    [ "${lines[0]}" = "G loaded=- gpu=0 max=4 active=a" ]
    [ "${lines[1]}" = "L loaded=- gpu=0 max=2 active=a" ]
}

@test "router_view: every tier at once, best first" {
    local c='vllm:num_gpu_loaded_lora_adapters{engine="0"}'
    local m='vllm:max_gpu_lora_adapters{engine="0"}'
    local busy='vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b"} 5'
    scrape gpu "$(loaded 0 target gpu false 1)" "$(loaded 0 other gpu false 1)" "$c 2" "$m 2"
    scrape cpu "$(loaded 0 target cpu false 1)" "$(loaded 0 a gpu false 1)" \
        "$(loaded 0 b gpu false 1)" "$c 2" "$m 2"
    scrape free "$(loaded 0 other gpu false 1)" "$c 1" "$m 2"
    scrape idle "$(loaded 0 a gpu false 1)" "$(loaded 0 b gpu false 1)" "$c 2" "$m 2"
    scrape full "$(loaded 0 a gpu false 1)" "$(loaded 0 b gpu false 1)" "$c 2" "$m 2" "$busy"
    scrape pinned "$(loaded 0 a gpu true 1)" "$(loaded 0 b gpu true 1)" "$c 2" "$m 2"
    run $VIEW load-state target "full=$T/full.prom" "pinned=$T/pinned.prom" \
        "idle=$T/idle.prom" "free=$T/free.prom" "cpu=$T/cpu.prom" "gpu=$T/gpu.prom"
    expect_status 0
    [ "$(echo "$output" | paste -sd ';')" = "1 gpu 1.0 gpu-resident;2 cpu 0.7 cpu-resident;\
3 free 0.6 free-slot;4 idle 0.3 evictable;5 full 0.0 saturated;5 pinned 0.0 saturated" ]
}

@test "router_view: within a tier the larger share of free slots comes first" {
    scrape two 'vllm:num_gpu_loaded_lora_adapters{engine="0"} 1' \
        'vllm:max_gpu_lora_adapters{engine="0"} 2'
    scrape four 'vllm:num_gpu_loaded_lora_adapters{engine="0"} 1' \
        'vllm:max_gpu_lora_adapters{engine="0"} 4'
    run $VIEW load-state x "two=$T/two.prom" "four=$T/four.prom"
    [ "$(echo "$output" | paste -sd ';')" = "1 four 0.6 free-slot;2 two 0.6 free-slot" ]
}

@test "router_view: usage errors exit 100, an unreadable source 1" {
    run --separate-stderr $VIEW
    expect_status 100
    run --separate-stderr $VIEW load-state
    expect_status 100
    [[ "$stderr" == *"load-state needs an adapter"* ]]
    run --separate-stderr $VIEW residency "no-equals-sign"
    expect_status 100
    run --separate-stderr $VIEW residency "S=$T/none.prom"
    expect_status 1
}
