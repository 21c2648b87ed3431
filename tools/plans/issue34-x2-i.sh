#!/bin/bash
# GPU 0's share of tools/plans/issue34-x2-i.txt (two H200s; lease_sweeps.sh sets OUT, LEASE_STATE and
# LEASE_DEADLINE), one thing at a time: steps 0 and 1 of tools/plans/issue34-n.sh (div_rn's GPU tests, ms_fp4's 125M
# step in the loop and unrolled), then BF16 at 50M, D/N = 10, seed 1, and seed 2 where 9 minutes are left.
set -u -o pipefail
source tools/plans/lease_lib.sh
CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python -m pytest -q -n 8 -o addopts= \
  -m "slow or not slow" -p no:cacheprovider tests/test_ieee.py tests/test_gpu_parity.py > "$OUT/gpu_div_tests.log" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 360 python benchmarks/train_throughput.py --model 125M --devices 1 --recipes ms_fp4 \
  --rounds 2 --steps 8 --max-compile-s 150 --profile /tmp/prof_unroll_ms_fp4 \
  --experiments-variants '{"experiments": {}, "unrolled": {"scan_unroll": 12}}' \
  --out "$OUT/train_throughput_125M_unroll_ms_fp4.json" > "$OUT/train_throughput_125M_unroll_ms_fp4.log" 2>&1
lease_sweep bf50r10s1 --sizes 50M --ratios 10 --recipes bf16 --seeds 1 --devices 0
lease_sweep_if_time 540 bf50r10s2 --sizes 50M --ratios 10 --recipes bf16 --seeds 2 --devices 0
