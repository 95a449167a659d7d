#!/usr/bin/env bash
# Before/after figures for a change to the decode loop: the same benches, run by two installs of
# specpipe one after the other on one machine (nothing else heavy running). Each bench measures
# the plain target and the pipeline interleaved per prompt, so its speedup is from one run; the
# plain tok/s of the two installs on the same prompts says how much the machine drifted (noise).
#   bash benchmarks/loop_compare.sh OUT [SPECPIPE]    (SPECPIPE: the command, default `specpipe`)
# then: python benchmarks/loop_compare.py OUT_BEFORE OUT_AFTER
set -euo pipefail
OUT=${1:?usage: loop_compare.sh OUT [SPECPIPE]}
SP=${2:-specpipe}
SMOL="model=smollm2-135m prompts=dev limit=2 max_new_tokens=128"
QWEN="model=qwen2.5-coder-1.5b prompts=dev limit=1 max_new_tokens=96"
$SP bench $SMOL proposer=ngram gamma=4 out=$OUT/smol-ngram
$SP bench $SMOL recipe=recipes/smollm2-135m out=$OUT/smol-recipe
$SP bench $SMOL recipe=recipes/smollm2-135m/eagle3.yaml out=$OUT/smol-eagle3
$SP bench model=smollm2-135m prompts=dev limit=2 max_new_tokens=64 recipe=recipes/smollm2-135m/eagle3.yaml \
  requests=16 concurrency=4 out=$OUT/smol-eagle3-load-c4  # EAGLE-3 drafting four rows a step
$SP bench $QWEN proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4 out=$OUT/qwen-draft
[ -n "${WITH_TREE:-}" ] && $SP bench $QWEN recipe=recipes/qwen2.5-coder-1.5b/eagle3-tree-bf16.yaml out=$OUT/qwen-tree  # slow without AMX
for c in 1 4 8; do
  $SP bench model=smollm2-135m prompts=dev limit=2 max_new_tokens=64 proposer=ngram gamma=4 requests=16 \
    concurrency=$c out=$OUT/smol-load-c$c
done
