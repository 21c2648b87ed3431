#!/bin/bash
# GPU 1 of tools/plans/issue34-x2-b.txt (lease_sweeps.sh sets LEASE_STATE, LEASE_DEADLINE), one run at a time:
# ms_fp4 at 30M, D/N = 10, seeds 0 and 1 (about 9.5 minutes a run), then the 10M, D/N = 25 quartet seed 0 (about 5
# minutes), in the time left; the results join the lease's.
set -u -o pipefail
left() { python -c "import sys, time; print(max(1.0, (int(sys.argv[1]) - time.time()) / 60))" "$LEASE_DEADLINE"; }
fp4jax-sweep --sizes 30M --ratios 10 --recipes ms_fp4 --seeds 0 1 --devices 1 --runs-per-device 1 \
  --data linux --seq-len 512 --batch-size 64 --eval-every 200 --eval-batches 8 --log-every 20 \
  --ckpt-every 2000 --final-eval-batches 32 \
  --out "$LEASE_STATE/runs/m30ms" --max-minutes "$(left)" \
  --results "$LEASE_STATE/m30ms.results.jsonl" --eval-results "$LEASE_STATE/m30ms.eval.jsonl" \
  > "$LEASE_STATE/m30ms.log" 2>&1
fp4jax-sweep --sizes 10M --ratios 25 --recipes quartet --seeds 0 --devices 1 --runs-per-device 1 \
  --data linux --seq-len 512 --batch-size 64 --eval-every 200 --eval-batches 8 --log-every 20 \
  --ckpt-every 2000 --final-eval-batches 32 \
  --out "$LEASE_STATE/runs/r25q0" --max-minutes "$(left)" \
  --results "$LEASE_STATE/r25q0.results.jsonl" --eval-results "$LEASE_STATE/r25q0.eval.jsonl" \
  > "$LEASE_STATE/r25q0.log" 2>&1
