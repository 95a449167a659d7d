#!/usr/bin/env bash
# The one prepared GPU check. It runs within BUDGET seconds (default 500: the staged call's limit
# is 540 s, and unpacking the model comes first), most important part first; a part that would
# start with under 20 s left is skipped and says so, and every part's time limit is cut to what
# is left. The parts, in order:
#   1. the CUDA tests (static step, graphed drafts, engine, lossless);
#   2. the real SmolLM2-135M (from a pre-seeded SPECPIPE_CACHE, no download): the shipped recipe
#      on the dev and held-aside prompts; ngram, with transformers' plain, static-cache (compiled)
#      and prompt-lookup generate as peers; suffix (exactness per prompt, plain vs speculative in
#      one process each);
#   3. the engine table on random-weight shapes (SmolLM2-135M, Qwen2.5-Coder 0.5B and 1.5B:
#      the draft pair's costs): ms per forward at k = 1, 2, 5, 9, 16 and plain tok/s, eager,
#      static exact, static fast (plain decoding overlapped, the GPU's default), and the SmolLM2
#      shape's static exact steps read one by one (overlap=off);
#      then the SmolLM2 shape with its decoder stack compiled (torch.compile) inside the graphs;
#   4. the torch profiler over one generation (plain eager, plain graphed read step by step and
#      overlapped, the recipe, EAGLE-3):
#      device busy and idle time, kernels, graph launches and copies a step;
#   5. the Medusa and EAGLE-3 recipes (their heads must be carried: stage with
#      KEEP="recipes/smollm2-135m/medusa recipes/smollm2-135m/eagle3"), and the EAGLE-3 head as an
#      EAGLE-2 tree of 8 nodes (kernels=fast: trees have no exact construction; per prompt exactness);
#   6. request loads at concurrency 1, 8 and 32 (suffix, the guard on), plain vs speculative;
#   7. reads back to the host and kernel launches outside graphs per step;
#   8. attention a layer by width (256 to 2,112 slots) and layout (the stack's grouped queries,
#      or each token its own batch entry), and the SDPA backend each takes; ngram with eager
#      steps and with kernels=fast;
#   9. the aims of the GPU engine, met or not (benchmarks/gpu_report.py --aims).
# Each result lands in $OUT/report.md as soon as it is measured; $OUT holds at most 8 files
# (logs and results.json files are packed into more.tar.gz).
#   OUT=gpu-results bash benchmarks/gpu_check.sh
# DEVICE=cpu runs the same steps on the CPU (to try the script where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; DEVICE="${DEVICE:-cuda}"; MORE="$(mktemp -d)/more"  # packed into $OUT, never left there
TOKENS="${TOKENS:-128}"; DEADLINE=$((SECONDS + ${BUDGET:-500}))
mkdir -p "$OUT" "$MORE"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
REPORT="$OUT/report.md"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')" > "$OUT/device.txt" 2>&1
{ echo "# GPU check, $(date -u +%F), $DEVICE: $(cat "$OUT/device.txt")"; echo; } > "$REPORT"
packed() { tar czf "$OUT/more.tar.gz" -C "$(dirname "$MORE")" more 2>/dev/null; }
# within LIMIT CMD...: CMD under the smaller of LIMIT and the time left; 124 (and a note) when skipped
within() {
  local limit=$1 left=$((DEADLINE - SECONDS)); shift
  if [ "$left" -lt 20 ]; then echo "(skipped: the check's time budget is spent)" >> "$REPORT"; return 124; fi
  timeout $((limit < left ? limit : left)) "$@"
}
started() { echo "<!-- at ${SECONDS}s -->" >> "$REPORT"; }

echo "## CUDA tests (pytest -k cuda)" >> "$REPORT"; started
within 150 python -m pytest -q -p no:cacheprovider -m "not slow" tests/test_static.py tests/test_engine.py \
    tests/test_step.py tests/test_lossless.py tests/test_bench.py tests/test_overlap.py -k cuda > "$MORE/pytest.txt" 2>&1
{ tail -3 "$MORE/pytest.txt"; echo; } >> "$REPORT"; packed

SMOL="model=smollm2-135m device=$DEVICE limit=1 max_new_tokens=$TOKENS"
# graphs=auto is the static step with CUDA graphs on a GPU (kernels=exact)
bench() {  # NAME LIMIT SETTINGS...
  local name=$1 limit=$2; shift 2
  within "$limit" python -m specpipe bench $SMOL "$@" out="$MORE/bench-$name" > "$MORE/bench-$name.log" 2>&1
  packed
}
table() {  # TITLE NAME...: the bench table of the named runs so far
  local title=$1; shift
  { echo "## $title"; python benchmarks/gpu_report.py "${@/#/$MORE/bench-}"; echo; } >> "$REPORT"
}
started
bench recipe 80 recipe=recipes/smollm2-135m prompts=dev+held-aside
# transformers' peers beside ngram (its first static-cache call compiles, in the bench's warm-up)
bench ngram 120 proposer=ngram gamma=4 prompts=dev 'peer=[hf-plain,hf-static,hf-prompt-lookup]'
bench suffix 45 proposer=suffix prompts=dev
table "Real SmolLM2-135M, $TOKENS tokens, plain vs speculative (the recipe on dev + held-aside)" recipe ngram suffix

echo "## Engine (random weights): ms per forward, plain tok/s" >> "$REPORT"; started
within 120 python benchmarks/engine.py --device "$DEVICE" --random-weights \
    --models smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b \
    --configs native:bf16 native:bf16+graphs@5 native:bf16+graphs+fast@16 --prompts 1 --tokens 64 \
    --out "$MORE/engine.json" >> "$REPORT" 2> "$MORE/engine.log"
# plain steps read one by one (overlap=off), against the overlapped default above
within 60 python benchmarks/engine.py --device "$DEVICE" --random-weights --models smollm2-135m \
    --configs native:bf16+graphs+sequential@5 --prompts 1 --tokens 64 --out "$MORE/engine-sequential.json" \
    2>> "$MORE/engine.log" | tail -n +3 >> "$REPORT"
echo >> "$REPORT"; packed

# inductor fuses a layer's pointwise work (norms, rotary, the gate, residual adds) into the
# matmuls' neighbours: ~10 kernels a layer where the eager stack launches 17-19 (its first
# call compiles, within each row's first-call time; both calls share the on-disk cache)
echo "## Engine, decoder stack compiled inside the graphs (SmolLM2-135M shape, random weights)" >> "$REPORT"
started
for config in native:bf16+compile+graphs@5 native:bf16+compile+graphs+fast@16; do
  within 100 python benchmarks/engine.py --device "$DEVICE" --random-weights --models smollm2-135m \
      --configs "$config" --prompts 1 --tokens 64 --out "$MORE/engine-${config//[^a-z0-9]/-}.json" \
      2>> "$MORE/engine.log" | tail -n +3 >> "$REPORT"
done
echo >> "$REPORT"; packed

echo "## Where a step's time goes (real SmolLM2, torch profiler)" >> "$REPORT"; started
within 60 python benchmarks/step_profile.py --device "$DEVICE" --model smollm2-135m --tokens 64 \
    --strategy "plain graphs=off" --strategy "plain overlap=off" --strategy "plain" \
    --strategy "recipe=recipes/smollm2-135m" \
    --strategy "recipe=recipes/smollm2-135m/eagle3.yaml" >> "$REPORT" 2> "$MORE/step_profile.log" \
    || echo "(failed or cut: see step_profile.log in more.tar.gz)" >> "$REPORT"
echo >> "$REPORT"; packed

started
bench medusa 45 recipe=recipes/smollm2-135m/medusa.yaml prompts=dev
bench eagle3 45 recipe=recipes/smollm2-135m/eagle3.yaml prompts=dev
# a tree raises τ (2.56 -> 3.23 on 20 dev prompts on a CPU, prompt lookup first) where a verify of 9 rows
# should cost one
bench eagle3-tree 45 recipe=recipes/smollm2-135m/eagle3.yaml kernels=fast 'proposer.tree={top_k:4,nodes:8}' \
    controller=fixed gamma=8 gamma_max=8 proposer.lookup=ngram proposer.lookup_min=2 prompts=dev
table "Head recipes, dev prompts" medusa eagle3 eagle3-tree

{ echo "## Request loads (suffix, 32 requests of 64 tokens): plain vs speculative throughput"
  echo "| concurrency | plain tok/s | spec tok/s | ratio | P99 ms plain / spec | exact | guard-held row steps |"
  echo "|---|---|---|---|---|---|---|"; } >> "$REPORT"; started
for c in 1 8 32; do
  within 45 python -m specpipe bench model=smollm2-135m device="$DEVICE" proposer=suffix prompts=dev requests=32 \
      concurrency=$c max_new_tokens=64 out="$MORE/load-c$c" > "$MORE/load-c$c.log" 2>&1
  python benchmarks/gpu_report.py --load "$MORE/load-c$c" >> "$REPORT"; packed
done
echo >> "$REPORT"

echo "## Reads back to the host, and launches outside graphs, per step (real SmolLM2, $DEVICE)" >> "$REPORT"; started
within 60 python benchmarks/step_reads.py --device "$DEVICE" --model smollm2-135m --tokens 48 \
    --strategy "recipe=recipes/smollm2-135m" --strategy "proposer=ngram gamma=4" \
    --strategy "recipe=recipes/smollm2-135m/eagle3.yaml" \
    >> "$REPORT" 2> "$MORE/step_reads.log" || echo "(failed or cut: see step_reads.log in more.tar.gz)" >> "$REPORT"
echo >> "$REPORT"; packed

echo "## Attention a layer, by width and layout (random values)" >> "$REPORT"; started
within 40 python benchmarks/attention_cost.py --device "$DEVICE" >> "$REPORT" 2> "$MORE/attention.log" \
    || echo "(failed or cut: see attention.log in more.tar.gz)" >> "$REPORT"
echo >> "$REPORT"; packed

started
bench ngram-eager 45 proposer=ngram gamma=4 graphs=off prompts=dev
bench ngram-fast 45 proposer=ngram gamma=4 kernels=fast prompts=dev
table "ngram: eager steps, static exact (above), static fast" ngram-eager ngram ngram-fast

{ echo "## The GPU engine's aims"; python benchmarks/gpu_report.py --aims "$MORE"; echo; } >> "$REPORT"
echo "<!-- done at ${SECONDS}s -->" >> "$REPORT"; packed
echo "results in $OUT/ (report.md; logs in more.tar.gz)"
