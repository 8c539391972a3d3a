#!/bin/sh
# Writes a deterministic random model of a named shape into the benchmark cache, once:
#
#   tests/bench/peers/make_model.sh SHAPE [CACHE_DIR]      (default CACHE_DIR: build/peers/cache)
#
# SHAPE          what it is
#   tiny         qwen2, hidden 128, 2 layers, 4 heads, 2 KV heads, vocab 512, tied, bf16 (--quick)
#   small-llama  llama, hidden 128, 2 layers, 4 heads, 2 KV heads, vocab 512, untied, f32, 2 shards
#   0.5b         Qwen2-0.5B's shape: hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate
#                4864, vocab 151936, tied, bf16 (0.99 GB)
#   7b           Qwen2-7B's shape: hidden 3584, 28 layers, 28 heads, 4 KV heads, intermediate
#                18944, vocab 152064, untied, bf16, 4 shards (15.2 GB; needs 16 GB free)
#   7b-test      the 7b options (untied, bf16, 4 shards, 4 KV heads, vocab 152064) on 2 small
#                layers, to test this script and the converters on the 7b layout quickly
#
# The model goes to CACHE_DIR/SHAPE (printed on stdout). An existing complete model (marked by
# CACHE_DIR/SHAPE/.complete) is kept; an incomplete one is written again. LORA_BIN names the
# directory of lora-worker (default build/main/bin).
set -eu

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
shape=$1
cache=${2:-build/peers/cache}
bin=${LORA_BIN:-build/main/bin}
need_mb=0

case $shape in
tiny)
    args="--arch qwen2 --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 256 --vocab 512 --tied --dtype bf16" ;;
small-llama)
    args="--arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 256 --vocab 512 --dtype f32 --shards 2" ;;
0.5b)
    args="--arch qwen2 --hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --vocab 151936 --tied --dtype bf16"
    need_mb=1100 ;;
7b)
    args="--arch qwen2 --hidden 3584 --layers 28 --heads 28 --kv-heads 4 --intermediate 18944 --vocab 152064 --dtype bf16 --shards 4"
    need_mb=16000 ;;
7b-test)
    args="--arch qwen2 --hidden 512 --layers 2 --heads 16 --kv-heads 4 --intermediate 1024 --vocab 152064 --dtype bf16 --shards 4"
    need_mb=700 ;;
-h | --help)
    usage ;;
*)
    echo "make_model.sh: unknown shape '$shape' (tiny, small-llama, 0.5b, 7b, 7b-test)" >&2
    exit 2 ;;
esac

out=$cache/$shape
if [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
fi
if [ ! -x "$bin/lora-worker" ]; then
    echo "make_model.sh: $bin/lora-worker not found (run make first, or set LORA_BIN)" >&2
    exit 1
fi
mkdir -p "$cache"
free_mb=$(df -Pm "$cache" | awk 'NR == 2 { print $4 }')
if [ "$free_mb" -lt "$need_mb" ]; then
    echo "make_model.sh: $shape needs about $need_mb MB free in $cache, $free_mb MB are" >&2
    exit 1
fi
rm -rf "$out"
# shellcheck disable=SC2086 # args is a list of options
"$bin/lora-worker" make-model --out "$out" $args --seed 1 >&2
touch "$out/.complete"
echo "$out"
