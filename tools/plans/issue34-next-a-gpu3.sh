#!/bin/bash
# GPU 3 of tools/plans/issue34-next-a.txt (its "gpu3" line; lease_sweeps.sh sets OUT, LEASE_STATE, LEASE_DEADLINE).
# First the issue-31 probes, alone on the GPU (about 6 minutes): what the 125M nvidia_nvfp4 step's layer loops copy,
# from its compiled HLO, without and with XLA's dynamic-slice fusion, and the step's speed under both. Then 10M,
# D/N = 10, quartet against QuEST nearest, three seeds, six processes on the GPU (about 20 minutes, 2026-11-28), in
# the time left; its results join the lease's (LEASE_STATE/quest10.*.jsonl).
set -u -o pipefail
CUDA_VISIBLE_DEVICES=3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 RECIPES=nvidia_nvfp4 \
  bash benchmarks/gpu_suite.sh loop-copies
CUDA_VISIBLE_DEVICES=3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 RECIPES=nvidia_nvfp4 FLAGSETS="none dynamic_slice_fusion" \
  bash benchmarks/gpu_suite.sh loop-flags
left=$(python -c "import sys, time; print(max(1.0, (int(sys.argv[1]) - time.time()) / 60))" "$LEASE_DEADLINE")
fp4jax-sweep --sizes 10M --ratios 10 --recipes quartet fp4jax_experiments.ablations:quartet_quest_nearest \
  --seeds 0 1 2 --devices 3 --runs-per-device 6 \
  --data linux --seq-len 512 --batch-size 64 --eval-every 200 --eval-batches 8 --log-every 20 \
  --ckpt-every 2000 --final-eval-batches 32 \
  --out "$LEASE_STATE/runs/quest10" --max-minutes "$left" \
  --results "$LEASE_STATE/quest10.results.jsonl" --eval-results "$LEASE_STATE/quest10.eval.jsonl" \
  > "$LEASE_STATE/quest10.log" 2>&1
