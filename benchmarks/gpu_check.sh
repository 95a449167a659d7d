#!/usr/bin/env bash
# The one prepared GPU check (about 6 minutes on an H200 before the static step's additions; not
# yet timed with them): the CUDA tests, reads back to the host per step on the real SmolLM2, the
# real SmolLM2 with the shipped recipe, ngram (graphed exact, eager, graphed fast) and suffix
# against its plain target (exactness per prompt), and the engine table on random-weight shapes
# (eager, static exact, static fast). Each
# result lands in $OUT/report.md as soon as it is measured; $OUT holds at most 8 files (the logs
# and results.json files are packed into more.tar.gz).
#   OUT=gpu-results bash benchmarks/gpu_check.sh
# DEVICE=cpu runs the same steps on the CPU (to try the script where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; DEVICE="${DEVICE:-cuda}"; MORE="$(mktemp -d)/more"  # packed into $OUT, never left there
TOKENS="${TOKENS:-128}"
mkdir -p "$OUT" "$MORE"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
REPORT="$OUT/report.md"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')" > "$OUT/device.txt" 2>&1
{ echo "# GPU check, $(date -u +%F), $DEVICE: $(cat "$OUT/device.txt")"; echo; } > "$REPORT"
packed() { tar czf "$OUT/more.tar.gz" -C "$(dirname "$MORE")" more 2>/dev/null; }

echo "## CUDA tests (pytest -k cuda)" >> "$REPORT"
timeout 210 python -m pytest -q -p no:cacheprovider -m "not slow" tests/test_engine.py tests/test_step.py \
    tests/test_lossless.py tests/test_static.py -k cuda > "$MORE/pytest.txt" 2>&1
{ tail -3 "$MORE/pytest.txt"; echo; } >> "$REPORT"; packed

echo "## Reads back to the host per step (real SmolLM2, $DEVICE)" >> "$REPORT"
timeout 120 python benchmarks/step_reads.py --device "$DEVICE" --model smollm2-135m --tokens 48 \
    --strategy "recipe=recipes/smollm2-135m" --strategy "proposer=ngram gamma=4" --strategy "proposer=suffix" \
    >> "$REPORT" 2> "$MORE/step_reads.log" || echo "(failed: see step_reads.log in more.tar.gz)" >> "$REPORT"
echo >> "$REPORT"; packed

SMOL="model=smollm2-135m device=$DEVICE limit=1 max_new_tokens=$TOKENS"
# graphs=auto is the static step with CUDA graphs on a GPU (kernels=exact); ngram also eager and with kernels=fast.
# The shipped recipe also on the held-aside prompts (the guard's aim: no prompt below plain)
for spec in "recipe:recipe=recipes/smollm2-135m prompts=dev+held-aside" "ngram:proposer=ngram gamma=4 prompts=dev" \
            "suffix:proposer=suffix prompts=dev" "ngram-eager:proposer=ngram gamma=4 graphs=off prompts=dev" \
            "ngram-fast:proposer=ngram gamma=4 kernels=fast prompts=dev"; do
  name=${spec%%:*}
  timeout 110 python -m specpipe bench $SMOL ${spec#*:} out="$MORE/bench-$name" > "$MORE/bench-$name.log" 2>&1
  packed
done
{ echo "## Real SmolLM2-135M, dev prompts (one a category; the recipe also held-aside), $TOKENS tokens, plain vs speculative"
  python benchmarks/gpu_report.py "$MORE"/bench-recipe "$MORE"/bench-ngram "$MORE"/bench-suffix \
      "$MORE"/bench-ngram-eager "$MORE"/bench-ngram-fast; echo; } >> "$REPORT"

echo "## Engine (random weights): ms per forward, plain tok/s" >> "$REPORT"
timeout 150 python benchmarks/engine.py --device "$DEVICE" --random-weights --models smollm2-135m qwen2.5-coder-1.5b \
    --configs native:bf16 native:bf16+graphs native:bf16+graphs+fast native:none --block 5 --prompts 1 --tokens 64 \
    --out "$MORE/engine.json" >> "$REPORT" 2> "$MORE/engine.log"
packed
echo "results in $OUT/ (report.md; logs in more.tar.gz)"
