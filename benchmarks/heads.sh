#!/usr/bin/env bash
# The draft-heads table of docs/benchmarks.md: EAGLE-3, EAGLE (with and without prompt lookup
# first), Medusa and n-gram lookup on
# SmolLM2-135M, and EAGLE-3 against the 0.5B draft model on Qwen2.5-Coder-1.5B; native engine,
# greedy, per category of the dev set, each row with its own plain target in the same process.
# Run alone on the machine (nothing else heavy), from the repository root:
#   bash benchmarks/heads.sh [OUT] [QWEN_RECIPE]   (default OUT: bench-results/heads;
#   QWEN_RECIPE: the eagle3.yaml `specpipe train proposer=eagle3 model=qwen2.5-coder-1.5b` wrote;
#   SMOL_ROWS=0 in the environment skips the SmolLM2 rows)
# then: specpipe report OUT/<job> markdown=true
set -euo pipefail
OUT=${1:-bench-results/heads}
QWEN_RECIPE=${2:-}
SMOL="engine=native categories=[code,code-edit,chat,summarize,math] limit=2 max_new_tokens=128"
if [ "${SMOL_ROWS:-1}" != 0 ]; then
# the head recipes as shipped (prompt lookup first, the head where nothing matches), then the heads alone
specpipe bench recipe=recipes/smollm2-135m/eagle3.yaml $SMOL out=$OUT/smollm2-eagle3-lookup
specpipe bench recipe=recipes/smollm2-135m/eagle.yaml $SMOL out=$OUT/smollm2-eagle-lookup
specpipe bench recipe=recipes/smollm2-135m/eagle3.yaml proposer.lookup=false $SMOL out=$OUT/smollm2-eagle3
specpipe bench recipe=recipes/smollm2-135m/eagle.yaml proposer.lookup=false $SMOL out=$OUT/smollm2-eagle
specpipe bench recipe=recipes/smollm2-135m/medusa.yaml $SMOL out=$OUT/smollm2-medusa
specpipe bench proposer=ngram gamma=4 $SMOL out=$OUT/smollm2-ngram
fi
if [ -n "$QWEN_RECIPE" ]; then
  QWEN="model=qwen2.5-coder-1.5b engine=native categories=[code,code-edit,chat,summarize,math] limit=2 max_new_tokens=96"
  # the head's recipe as train wrote it (lookup first, confidence controller), then the head alone at γ 4
  specpipe bench recipe=$QWEN_RECIPE $QWEN out=$OUT/qwen-eagle3-lookup
  specpipe bench recipe=$QWEN_RECIPE proposer.lookup=false controller=fixed gamma=4 $QWEN out=$OUT/qwen-eagle3
  specpipe bench proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4 $QWEN out=$OUT/qwen-draft
  specpipe bench proposer=ngram gamma=4 $QWEN out=$OUT/qwen-ngram
fi
