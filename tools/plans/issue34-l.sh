#!/bin/bash
# GPU 0's share of tools/plans/issue34-l.txt (one H200), issue34-x2-g.txt and issue34-x4-g.txt (lease_sweeps.sh sets
# OUT, LEASE_STATE and LEASE_DEADLINE), one thing at a time on that GPU:
#   0. issue 31, first (about 7 minutes): MS-EDEN's pre-pass along the rows now rotates in vector parts
#      (rotate_vector_parts; its bits checked in interpret mode only): the kernel tests of MS-EDEN and the pre-pass
#      and tests/test_prequantize.py compiled by Triton (if they fail, the quartet2 runs of this lease are void), the
#      pre-pass sweep (gpu_suite.sh prepass) and quartet2's 125M step beside bf16 and the anchor;
#   1. nvidia_nvfp4 30M, D/N = 25 seed 2 (issue 34; seed 1 took 13.3 minutes on one H200 at 4f5c6bc);
#   2. with at least 10 minutes left: BF16 50M, D/N = 10, seed 0 (500M tokens; about 7.5 minutes at the 1.1M tokens/s
#      that 30M's 1.86M and 50M's 1.7x the FLOPs per token predict), the first run of the 50M row;
#   3. issue 31, in the time left (at least 2 minutes): the compiled HLO of quartet's and quartet2's 125M steps with
#      the defaults (benchmarks/loop_copies.py --hlo-out), so that the fusions their profiles name
#      (benchmarks/results/train_throughput_125M_defaults.json: quartet's XLA slice fusions, 10.4 ms a step) can be
#      traced to their JAX ops here, without a GPU.
set -u -o pipefail
source tools/plans/lease_lib.sh
CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python -m pytest -q -n 8 -o addopts= \
  -m "slow or not slow" -p no:cacheprovider tests/test_prequantize.py tests/kernels/test_quantize.py \
  -k "eden or prepass or prequantize or quartet2" > "$OUT/gpu_prepass_tests.log" 2>&1
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 bash benchmarks/gpu_suite.sh prepass
CUDA_VISIBLE_DEVICES=0 timeout 300 python benchmarks/train_throughput.py --model 125M --devices 1 \
  --recipes bf16,quartet2 --rounds 2 --steps 8 --max-compile-s 120 --profile /tmp/prof_prepass \
  --out "$OUT/train_throughput_125M_prepass_quartet2.json" > "$OUT/train_throughput_125M_prepass_quartet2.log" 2>&1
lease_sweep nv30r25s2 --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 2 --devices 0
left=$(( LEASE_DEADLINE - $(date +%s) ))
if [ "$left" -ge 600 ]; then
  lease_sweep bf50r10s0 --sizes 50M --ratios 10 --recipes bf16 --seeds 0 --devices 0
else
  echo "issue34-l: ${left} s left, no BF16 50M run"
fi
for recipe in quartet quartet2; do
  left=$(( LEASE_DEADLINE - $(date +%s) - 20 ))
  [ "$left" -ge 120 ] || { echo "issue34-l: ${left} s left, no HLO of $recipe"; exit 0; }
  CUDA_VISIBLE_DEVICES=0 timeout "$left" python benchmarks/loop_copies.py --recipe "$recipe" --overrides '{}' \
    --hlo-out "$OUT/hlo_125M_$recipe.txt.gz" --out "$OUT/loop_copies_125M_$recipe.json" \
    > "$OUT/loop_copies_125M_$recipe.log" 2>&1
done
