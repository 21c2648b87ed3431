#!/bin/bash
# GPU 0 of tools/plans/issue34-x2-b.txt (lease_sweeps.sh sets OUT, LEASE_STATE, LEASE_DEADLINE). The issue-31
# probes first, alone on the GPU (about 6 minutes): the 125M nvidia_nvfp4 step's loop census (compiled HLO, with and
# without command buffers), then its profile under both (copy kernels attributed to their XLA ops). Then, one run
# at a time, 10M, D/N = 10, quartet and QuEST nearest, three seeds (about 2 minutes a run), and the 10M, D/N = 25
# quartet seed 2 (about 5 minutes), in the time left; the results join the lease's.
set -u -o pipefail
export CUDA_VISIBLE_DEVICES=0 RECIPES=nvidia_nvfp4 FLAGSETS="none no_command_buffer"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 bash benchmarks/gpu_suite.sh loop-copies
XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 bash benchmarks/gpu_suite.sh loop-flags
unset CUDA_VISIBLE_DEVICES
left() { python -c "import sys, time; print(max(1.0, (int(sys.argv[1]) - time.time()) / 60))" "$LEASE_DEADLINE"; }
fp4jax-sweep --sizes 10M --ratios 10 --recipes quartet fp4jax_experiments.ablations:quartet_quest_nearest \
  --seeds 0 1 2 --devices 0 --runs-per-device 1 \
  --data linux --seq-len 512 --batch-size 64 --eval-every 200 --eval-batches 8 --log-every 20 \
  --ckpt-every 2000 --final-eval-batches 32 \
  --out "$LEASE_STATE/runs/quest10" --max-minutes "$(left)" \
  --results "$LEASE_STATE/quest10.results.jsonl" --eval-results "$LEASE_STATE/quest10.eval.jsonl" \
  > "$LEASE_STATE/quest10.log" 2>&1
fp4jax-sweep --sizes 10M --ratios 25 --recipes quartet --seeds 2 --devices 0 --runs-per-device 1 \
  --data linux --seq-len 512 --batch-size 64 --eval-every 200 --eval-batches 8 --log-every 20 \
  --ckpt-every 2000 --final-eval-batches 32 \
  --out "$LEASE_STATE/runs/r25q2" --max-minutes "$(left)" \
  --results "$LEASE_STATE/r25q2.results.jsonl" --eval-results "$LEASE_STATE/r25q2.eval.jsonl" \
  > "$LEASE_STATE/r25q2.log" 2>&1
