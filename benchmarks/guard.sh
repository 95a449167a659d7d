#!/usr/bin/env bash
# The guard's aims in docs/benchmarks.md ("The guard"): no prompt and no request load slower than
# plain, with the guard on (the default) against the controller alone (guard=false), in one sweep
# each so both run on the same machine minutes apart. Every bench interleaves the plain target
# with the pipeline on the same prompts in one process.
# Run alone on the machine (nothing else heavy), from the repository root:
#   bash benchmarks/guard.sh [OUT] [PART ...]     (default OUT: bench-results/guard; PARTs: all)
# PARTs: noise prompts load twin draft recipes. Then: specpipe report OUT/<part>/<job> markdown=true
set -euo pipefail
OUT=${1:-bench-results/guard}
shift || true
PARTS=${*:-noise prompts load twin draft recipes}
PROMPTS="prompts=dev+held-aside limit=2 max_new_tokens=128"
LOAD="prompts=dev+held-aside limit=2 requests=16 max_new_tokens=64"
QWEN="model=qwen2.5-coder-1.5b prompts=dev+held-aside limit=1 max_new_tokens=96"
SHIPPED=recipes/smollm2-135m/specpipe.yaml
run() { echo "== specpipe bench $*"; specpipe bench "$@"; }

for part in $PARTS; do
  case $part in
    noise)  # the plain target against itself: how far a prompt's speedup moves by chance
      run proposer=none $PROMPTS out=$OUT/noise ;;
    prompts)  # one request at a time, every prompt of the dev and held-aside sets
      run -m recipe=$SHIPPED guard=true,false $PROMPTS out=$OUT/prompts-shipped
      run -m model=smollm2-135m proposer=ngram gamma=4 guard=true,false $PROMPTS out=$OUT/prompts-ngram ;;
    load)  # continuous batching at concurrency 1-8
      run -m recipe=$SHIPPED concurrency=1,2,4,8 guard=true,false $LOAD out=$OUT/load-shipped
      run -m model=smollm2-135m proposer=ngram gamma=4 concurrency=1,2,4,8 guard=true,false $LOAD out=$OUT/load-ngram ;;
    twin)  # SmolLM2's int8 twin: accepts often, costs nearly a target step
      run -m model=smollm2-135m proposer=twin guard=true,false $PROMPTS out=$OUT/prompts-twin
      run -m model=smollm2-135m proposer=twin concurrency=1,2,4,8 guard=true,false $LOAD out=$OUT/load-twin ;;
    draft)  # Qwen2.5-Coder-1.5B drafted by the 0.5B
      run -m proposer=draft proposer.model=qwen2.5-coder-0.5b guard=true,false $QWEN out=$OUT/prompts-qwen-draft ;;
    recipes)  # the other shipped recipes, guard on and off
      for recipe in eagle eagle3 medusa; do
        run -m recipe=recipes/smollm2-135m/$recipe.yaml guard=true,false $PROMPTS out=$OUT/prompts-$recipe
      done ;;
    *) echo "unknown part: $part (noise prompts load twin draft recipes)" >&2; exit 2 ;;
  esac
done
