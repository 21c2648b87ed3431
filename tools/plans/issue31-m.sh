#!/bin/bash
# What tools/plans/issue31-m.txt runs on one H200 (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE), issue
# 31 only, one thing at a time:
#   1. the 125M step of every recipe with the defaults beside the anchor (gpu_suite.sh defaults, about 5 minutes;
#      at 4f5c6bc quartet2's default step compiled in 65 s, over the 60 s target; since bbcc75e its prequantized W
#      takes the kernels, a 3.3x smaller program);
#   2. quartet2 and quartet in the layer loop (the default), in the loop with JAX's threefry as kernels (threefry
#      is 76-80% of their lowered loop programs) and unrolled (then with the threefry kernels too,
#      threefry_kernel="auto"): which of them should join UNROLLED_RECIPES or the kernel lowering (ms_fp4 stays in
#      the loop: unrolled, its XLA quantizers make a 9x larger program, benchmarks/results/hlo_census_125M.json);
#   3. in the time left (at least 3 minutes): where quartet2's 125M compile goes, its default first, then unrolled
#      (benchmarks/compile_profile.py writes its document after each variant).
set -u -o pipefail
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 bash benchmarks/gpu_suite.sh defaults
variants='{"experiments": {}, "threefry_kernel": {"threefry_kernel": true}, "unrolled": {"scan_unroll": 12}}'
CUDA_VISIBLE_DEVICES=0 timeout 560 python benchmarks/train_throughput.py --model 125M --devices 1 \
  --recipes quartet2,quartet --rounds 2 --steps 8 --max-compile-s 150 --experiments-variants "$variants" \
  --profile /tmp/prof_variants --out "$OUT/train_throughput_125M_variants.json" \
  > "$OUT/train_throughput_125M_variants.log" 2>&1
left=$(( LEASE_DEADLINE - $(date +%s) - 20 ))
[ "$left" -ge 180 ] || { echo "issue31-m: ${left} s left, no compile profile"; exit 0; }
CUDA_VISIBLE_DEVICES=0 timeout "$left" python benchmarks/compile_profile.py --recipe quartet2 --top 80 \
  --variants '{"default": {}, "unrolled": {"scan_unroll": 12}}' --out "$OUT/compile_profile_quartet2.json" \
  > "$OUT/compile_profile_quartet2.log" 2>&1
