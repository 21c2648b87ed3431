#!/bin/bash
# GPU 0's share of tools/plans/issue34-n.txt (one H200; lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE),
# one thing at a time (with --probes-only, steps 0 and 1 alone):
#   0. issue 31 (about 2 minutes): fp4jax.ieee.div_rn's float64 path (new: on CUDA the float64 quotient rounded once
#      to float32) against NumPy's IEEE quotient on the GPU, zeros, infinities, NaN and subnormals included, and the
#      kernels' parity tests that call it;
#   1. issue 31 (about 4 minutes): ms_fp4's 125M step in the layer loop (its default) and unrolled, side by side.
#      At 1835a31 unrolled ran 1.18x faster but compiled in 130 s (train_throughput_125M_unroll_ms_fp4.json); on the
#      CPU that compile fell from 123 s to 26 s with div_rn replaced by a plain division, so it should now be near
#      30 s, under the 60 s target;
#   2. issue 34, the longest run that fits: quartet2 at 30M, D/N = 25, seed 0 (about 17 minutes) where 19 minutes
#      are left, else nvidia_nvfp4 at 50M, D/N = 10, seed 0 (about 12.5: 495.6M tokens at the 0.67 of its 30M
#      tokens/s that BF16's 50M run kept), else BF16 at 50M, seed 1 (8 minutes) where 9 are left.
set -u -o pipefail
source tools/plans/lease_lib.sh
CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python -m pytest -q -n 8 -o addopts= \
  -m "slow or not slow" -p no:cacheprovider tests/test_ieee.py tests/test_gpu_parity.py > "$OUT/gpu_div_tests.log" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 360 python benchmarks/train_throughput.py --model 125M --devices 1 --recipes ms_fp4 \
  --rounds 2 --steps 8 --max-compile-s 150 --profile /tmp/prof_unroll_ms_fp4 \
  --experiments-variants '{"experiments": {}, "unrolled": {"scan_unroll": 12}}' \
  --out "$OUT/train_throughput_125M_unroll_ms_fp4.json" > "$OUT/train_throughput_125M_unroll_ms_fp4.log" 2>&1
[ "${1:-}" != --probes-only ] || exit 0  # tools/plans/issue34-x2-i.sh: its own runs follow
left=$(( LEASE_DEADLINE - $(date +%s) ))
if [ "$left" -ge 1140 ]; then
  lease_sweep q2m30r25s0 --sizes 30M --ratios 25 --recipes quartet2 --seeds 0 --devices 0
elif [ "$left" -ge 810 ]; then
  lease_sweep nv50r10s0 --sizes 50M --ratios 10 --recipes nvidia_nvfp4 --seeds 0 --devices 0
else
  lease_sweep_if_time 540 bf50r10s1 --sizes 50M --ratios 10 --recipes bf16 --seeds 1 --devices 0
fi
