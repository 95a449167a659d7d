#!/usr/bin/env bash
# The README's "Draft heads (issue 13)" table: EAGLE-3, EAGLE (with and without prompt lookup
# first), Medusa and n-gram lookup on
# SmolLM2-135M, and EAGLE-3 against the 0.5B draft model on Qwen2.5-Coder-1.5B; native engine,
# greedy, per category of the dev set, each row with its own plain target in the same process.
# Run alone on the machine (nothing else heavy), from the repository root:
#   bash benchmarks/heads.sh [OUT] [QWEN_HEADS]   (default OUT: bench-results/heads;
#   QWEN_HEADS: the folder `specpipe train proposer=eagle3 model=qwen2.5-coder-1.5b` wrote)
# then: specpipe report OUT/<job> markdown=true
set -euo pipefail
OUT=${1:-bench-results/heads}
QWEN_HEADS=${2:-}
SMOL="engine=native categories=[code,code-edit,chat,summarize,math] limit=2 max_new_tokens=128"
# the head recipes as shipped (prompt lookup first, the head where nothing matches), then the heads alone
specpipe bench recipe=recipes/smollm2-135m/eagle3.yaml $SMOL out=$OUT/smollm2-eagle3-lookup
specpipe bench recipe=recipes/smollm2-135m/eagle.yaml $SMOL out=$OUT/smollm2-eagle-lookup
specpipe bench recipe=recipes/smollm2-135m/eagle3.yaml proposer.lookup=false $SMOL out=$OUT/smollm2-eagle3
specpipe bench recipe=recipes/smollm2-135m/eagle.yaml proposer.lookup=false $SMOL out=$OUT/smollm2-eagle
specpipe bench recipe=recipes/smollm2-135m/medusa.yaml $SMOL out=$OUT/smollm2-medusa
specpipe bench proposer=ngram gamma=4 $SMOL out=$OUT/smollm2-ngram
if [ -n "$QWEN_HEADS" ]; then
  QWEN="model=qwen2.5-coder-1.5b engine=native categories=[code,code-edit,chat,summarize,math] limit=1 max_new_tokens=96"
  specpipe bench proposer=eagle3 proposer.heads=$QWEN_HEADS gamma=4 $QWEN out=$OUT/qwen-eagle3
  specpipe bench proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4 $QWEN out=$OUT/qwen-draft
fi
