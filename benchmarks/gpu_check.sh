#!/usr/bin/env bash
# One prepared GPU check (under 10 minutes on a machine with a CUDA GPU): the engine's CUDA tests,
# the lossless suite's native-engine cases on CUDA, and the engine benchmark on CUDA. Results go
# to ${OUT:-gpu-results}/ (pytest logs, engine.json, the table as engine.md).
#   bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
python -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/device.txt"
python -m pip install -q -e '.[test]' >"$OUT/install.log" 2>&1 || echo "install failed: see $OUT/install.log"
timeout 240 python -m pytest -q -m "not slow" tests/test_engine.py tests/test_lossless.py \
    -k "cuda or native" 2>&1 | tail -40 | tee "$OUT/pytest.txt"
timeout 300 python benchmarks/engine.py --device cuda --random-weights --models smollm2-135m qwen2.5-coder-1.5b \
    --configs native:bf16 native:none native:bf16+compile --prompts 1 --tokens 64 \
    --out "$OUT/engine.json" 2>&1 | tee "$OUT/engine.md"
echo "results in $OUT/"
