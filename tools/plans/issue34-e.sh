#!/bin/bash
# One GPU's share of tools/plans/issue34-x2-e.txt (two H200s: gpu0, gpu1) or issue34-x4-e.txt (four: gpu0-gpu3):
# bash tools/plans/issue34-e.sh gpuN (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE). One process on a GPU
# at a time. Minutes are the 30M, D/N = 25 runs' steps alone on an H200 (762M tokens at train_throughput_sweep_30M's
# tokens/s; ms_fp4 at the 30M, D/N = 10 seeds' 695k tokens/s) plus about a minute of compile and evaluations.
# gpu0: issue 31's probes: the 125M unroll probe (nvidia_nvfp4's step with its FP4 blocks in the layer loop against
#   unrolled: step time, compile time, profile; about 4 minutes) and quartet2's staging pre-pass per tile and warps
#   (about 3 minutes); then bf16 seeds 1 and 2 (about 8 minutes each).
# gpu1: quartet2 seed 0 (about 22 minutes).
# gpu2: nvidia_nvfp4 seed 0 (about 16 minutes), then the 30M unroll probe (cut by the lease's end if it runs late).
# gpu3: ms_fp4 seed 0 (about 19 minutes).
set -u -o pipefail
source tools/plans/lease_lib.sh
case ${1:-} in
  gpu0)
    CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 MODEL=125M bash benchmarks/gpu_suite.sh unroll
    CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 bash benchmarks/gpu_suite.sh prepass
    lease_sweep bf30r25b --sizes 30M --ratios 25 --recipes bf16 --seeds 1 2 --devices 0
    ;;
  gpu1) lease_sweep q230r25a --sizes 30M --ratios 25 --recipes quartet2 --seeds 0 --devices 1 ;;
  gpu2)
    lease_sweep nv30r25a --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 0 --devices 2
    CUDA_VISIBLE_DEVICES=2 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 MODEL=30M bash benchmarks/gpu_suite.sh unroll
    ;;
  gpu3) lease_sweep ms30r25a --sizes 30M --ratios 25 --recipes ms_fp4 --seeds 0 --devices 3 ;;
  *) echo "issue34-e.sh: say gpu0, gpu1, gpu2 or gpu3, got '${1:-}'" >&2; exit 2 ;;
esac
