#!/bin/bash
# What tools/plans/issue31-m.txt runs on one H200 (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE), issue
# 31 only, one thing at a time:
#   0. the prequantize tests on the GPU (about 2 minutes): the vmapped kernels that now quantize every prequantized
#      W under "auto" compiled by Triton, with XLA's bits, and each layer's dot given them equal to the dot's own;
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
CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python -m pytest -q -n 8 -o addopts= \
  -m "slow or not slow" -p no:cacheprovider tests/test_prequantize.py > "$OUT/gpu_prequantize_tests.log" 2>&1
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
