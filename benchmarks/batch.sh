#!/usr/bin/env bash
# The request-load table of docs/benchmarks.md: request loads at concurrency 1, 2, 4, 8,
# plain and each proposer with the batch-aware cost controller, one sweep per proposer.
# Run alone on the machine (nothing else heavy), from the repository root:
#   bash benchmarks/batch.sh [OUT]        (default OUT: bench-results/batch)
# then: specpipe report OUT/<job> markdown=true
set -euo pipefail
OUT=${1:-bench-results/batch}
SMOL="requests=16 max_new_tokens=64 limit=2 controller=cost"
specpipe bench -m concurrency=1,2,4,8 proposer=ngram peer=hf-batched $SMOL out=$OUT/smollm2-ngram
specpipe bench -m concurrency=1,2,4,8 recipe=recipes/smollm2-135m/eagle.yaml $SMOL out=$OUT/smollm2-eagle
specpipe bench -m concurrency=1,2,4,8 recipe=recipes/smollm2-135m/medusa.yaml $SMOL out=$OUT/smollm2-medusa
specpipe bench -m concurrency=1,2,4,8 proposer=twin $SMOL out=$OUT/smollm2-twin
QWEN="model=qwen2.5-coder-1.5b requests=8 max_new_tokens=48 limit=1 controller=cost"
specpipe bench -m concurrency=1,2,4,8 proposer=draft proposer.model=qwen2.5-coder-0.5b $QWEN out=$OUT/qwen-draft
specpipe bench -m concurrency=1,2,4,8 proposer=ngram $QWEN out=$OUT/qwen-ngram
