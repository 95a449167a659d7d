#!/usr/bin/env bash
# benchmarks/gpu_check.sh rehearsed on the CPU, on a simulated CUDA device (tests/cuda_sim.py):
# every part takes its device=cuda branches, and each operation a GPU would refuse (host and
# device tensors mixed, a host tensor indexed by device indices, a host generator drawing into a
# device tensor, a CPU-only kernel) is counted at the end. Run it before spending GPU time on a
# change. It cannot show timings, kernels or graph capture (graphed computations run eagerly),
# the profiler's CUDA activity (step_profile.py is cut), attention_cost.py's timings (its CUDA
# graphs: every cell reads "failed"), the compiled engine rows (dynamo and
# inductor call CUDA itself: "Torch not compiled with CUDA enabled"), host reads per step
# (the simulation counts each twice, so the CUDA tests that count reads or captures fail), or
# launches per step in step_reads.py's cuda table (counted by device below the simulation, where
# every tensor looks like a host one: `step_reads.py --simulated-cuda` counts them instead).
#   OUT=gpu-rehearsal bash benchmarks/gpu_rehearsal.sh      (TOKENS=16 and BUDGET=1500 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
SITE="$(mktemp -d)"; REFUSED="$SITE/refused.txt"; : > "$REFUSED"
cat > "$SITE/sitecustomize.py" <<EOF
import os, sys
if os.environ.get("SPECPIPE_SIMULATED_CUDA"):  # every Python process the check starts
    sys.path.insert(0, "$PWD/tests")
    import cuda_sim
    cuda_sim.start(os.environ["SPECPIPE_SIMULATED_CUDA"])
EOF
SPECPIPE_SIMULATED_CUDA="$REFUSED" PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" DEVICE=cuda \
    TOKENS="${TOKENS:-16}" BUDGET="${BUDGET:-1500}" OUT="${OUT:-gpu-rehearsal}" bash benchmarks/gpu_check.sh
echo "operations a GPU would refuse: $(wc -l < "$REFUSED")"
sort "$REFUSED" | uniq -c | sort -rn | head -20
