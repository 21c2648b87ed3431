#!/bin/bash
# GPU 0's share of tools/plans/issue34-m.txt (one H200) and issue34-x2-h.txt (two; lease_sweeps.sh sets OUT,
# LEASE_STATE and LEASE_DEADLINE), one thing at a time on that GPU:
#   0. issue 31 (about 5 minutes): every recipe's 125M step with this commit's defaults beside bf16 and the anchor
#      (gpu_suite.sh defaults). New since train_throughput_125M_defaults.json (4a309d5): quartet's backward inverse
#      Hadamard as a Pallas kernel (1.096x quartet's step beside XLA's butterflies at e73d584) and MS-EDEN's pre-pass
#      launches (quartet2: along the rows in vector parts on (16, 256) tiles, along the rows of the transpose on
#      (128, 32) tiles and 8 warps; its step not yet timed with them);
#   1. issue 31 (about 5 minutes): ms_fp4's 125M step in the layer loop (its default), 4 blocks per iteration and
#      unrolled, side by side: the loop's copies are 4.2 ms of its 62.4 ms (train_throughput_125M_defaults.json) and
#      its unrolled program is 9x the loop's (hlo_census_125M.json), so the compile time decides; a variant compiling
#      for more than 150 s is abandoned (the target is 60 s);
#   2. issue 34: BF16 50M, D/N = 10, seed 0 (500M tokens; about 7.5 minutes at the 1.1M tokens/s that 30M's 1.86M and
#      50M's 1.7x the FLOPs per token predict), the first run of the 50M row;
#   3. seed 1 of the same, where at least 9 minutes are left.
set -u -o pipefail
source tools/plans/lease_lib.sh
CUDA_VISIBLE_DEVICES=0 bash benchmarks/gpu_suite.sh defaults
CUDA_VISIBLE_DEVICES=0 timeout 420 python benchmarks/train_throughput.py --model 125M --devices 1 --recipes ms_fp4 \
  --rounds 2 --steps 8 --max-compile-s 150 --profile /tmp/prof_unroll_ms_fp4 \
  --experiments-variants '{"experiments": {}, "unroll_4": {"scan_unroll": 4}, "unrolled": {"scan_unroll": 12}}' \
  --out "$OUT/train_throughput_125M_unroll_ms_fp4.json" > "$OUT/train_throughput_125M_unroll_ms_fp4.log" 2>&1
lease_sweep bf50r10s0 --sizes 50M --ratios 10 --recipes bf16 --seeds 0 --devices 0
lease_sweep_if_time 540 bf50r10s1 --sizes 50M --ratios 10 --recipes bf16 --seeds 1 --devices 0
