#!/usr/bin/env bash
# engine=llamacpp against llama.cpp alone (llama-cpp-python on the same GGUF), same prompts, same runs:
# SmolLM2-135M (Q4_1) with each proposer that runs on llama.cpp, Qwen2.5-Coder-1.5B (Q4_K_M) with the
# 0.5B GGUF draft and lookup. One `specpipe bench` per strategy, each with its own plain target and
# the llama-cpp peer on the same prompts. Then `specpipe report $OUT` prints one table.
#   bash benchmarks/llamacpp.sh            (OUT=bench-llamacpp LIMIT=1 TOKENS=128 by default)
set -euo pipefail
OUT=${OUT:-bench-llamacpp}
LIMIT=${LIMIT:-1}
TOKENS=${TOKENS:-128}
COMMON=(engine=llamacpp prompts=dev+held-aside "limit=$LIMIT" "max_new_tokens=$TOKENS")
RECIPES=recipes/smollm2-135m
mkdir -p "$OUT"

run() {  # name, then overrides; bench exits 1 where an output diverged (kernels=fast may): go on
  local name=$1; shift
  echo "== $name: $*" >&2
  python -m specpipe bench "${COMMON[@]}" "$@" "out=$OUT/$name" > "$OUT/$name.log" || echo "   exit $? (see $OUT/$name.log)" >&2
}

run smollm2-ngram model=smollm2-135m proposer=ngram gamma=4 'peer=[llama-cpp,llama-cpp-lookup]'
run smollm2-ngram-fast model=smollm2-135m proposer=ngram gamma=4 kernels=fast peer=llama-cpp
run smollm2-ngram-cost model=smollm2-135m proposer=ngram controller=cost peer=llama-cpp
run smollm2-suffix model=smollm2-135m proposer=suffix gamma=6 peer=llama-cpp
run smollm2-eagle "recipe=$RECIPES/eagle.yaml" peer=llama-cpp
run smollm2-medusa "recipe=$RECIPES/medusa.yaml" peer=llama-cpp
run qwen1.5b-draft model=qwen2.5-coder-1.5b proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4 peer=llama-cpp
run qwen1.5b-ngram model=qwen2.5-coder-1.5b proposer=ngram gamma=4 'peer=[llama-cpp,llama-cpp-lookup]'
run qwen1.5b-suffix model=qwen2.5-coder-1.5b proposer=suffix gamma=6 peer=llama-cpp
python -m specpipe report "$OUT"
