#!/bin/bash
# One GPU's share of tools/plans/issue34-x2-d.txt (two H200s: gpu0, gpu1) or issue34-x4-d.txt (four: gpu0-gpu3):
# bash tools/plans/issue34-d.sh gpuN (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE). One process on a GPU
# at a time; each sweep's runs one after another. Times are the steps alone on an H200 (BENCHMARKS.md's sweep-shape
# sections; ms_fp4's before its OCC bounds took the Pallas select, which made its 125M step 15% shorter).
# gpu0: ms_fp4 at 30M, D/N = 10, seeds 0, 1 and 2 (at most 9 minutes a run).
# gpu1: the new kernels' tests compiled on the GPU (the inverse rotation and the OCC select, against their NumPy
#   oracles and XLA's bits; about a minute), issue 31's quartet 125M step with and without the Pallas inverse rotation
#   (about 3 minutes), then the 10M, D/N = 25 quartet seeds 0 and 2 (about 6 minutes each), then 30M, D/N = 25, bf16
#   seed 0 (about 7).
# gpu2: 30M, D/N = 25, bf16 seeds 1 and 2, then nvidia_nvfp4 seed 1 (about 15).
# gpu3: 30M, D/N = 25, nvidia_nvfp4 seed 0, then quartet2 seed 0 (about 20).
set -u -o pipefail
source tools/plans/lease_lib.sh
case ${1:-} in
  gpu0) lease_sweep m30ms --sizes 30M --ratios 10 --recipes ms_fp4 --seeds 0 1 2 --devices 0 ;;
  gpu1)
    CUDA_VISIBLE_DEVICES=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python -m pytest -q -m "slow or not slow" \
      -p no:cacheprovider tests/kernels/test_inverse_rotate.py tests/kernels/test_select_ranks.py \
      > "$OUT/kernel_tests.log" 2>&1
    CUDA_VISIBLE_DEVICES=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 bash benchmarks/gpu_suite.sh ablation
    lease_sweep r25q --sizes 10M --ratios 25 --recipes quartet --seeds 0 2 --devices 1
    lease_sweep bf30r25a --sizes 30M --ratios 25 --recipes bf16 --seeds 0 --devices 1
    ;;
  gpu2)
    lease_sweep bf30r25b --sizes 30M --ratios 25 --recipes bf16 --seeds 1 2 --devices 2
    lease_sweep nv30r25b --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 1 --devices 2
    ;;
  gpu3)
    lease_sweep nv30r25a --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 0 --devices 3
    lease_sweep q2r25a --sizes 30M --ratios 25 --recipes quartet2 --seeds 0 --devices 3
    ;;
  *) echo "issue34-d.sh: say gpu0, gpu1, gpu2 or gpu3, got '${1:-}'" >&2; exit 2 ;;
esac
