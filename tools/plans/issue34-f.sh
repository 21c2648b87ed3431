#!/bin/bash
# One share of tools/plans/issue34-f.txt, on two or four H200s: bash tools/plans/issue34-f.sh runs|probe
# (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE).
# runs: issue 34's 30M, D/N = 25 runs one after another, each data parallel over every GPU of the machine (fp4jax-sweep
#   --gpus-per-run: the one-device quantized operands, gradients summed in float32), so that each finishes within one
#   device call and a machine lost between calls loses at most the run in flight (a lost machine keeps no checkpoint).
#   Longest first: quartet2, ms_fp4 and nvidia_nvfp4 seed 0, then BF16 seeds 1 and 2; the lease's end cuts the last.
# probe: issue 31's compile profile on GPU 0 beside the runs (host time; gpu_suite.sh compile, about 7 minutes):
#   nvidia_nvfp4's 125M step with its FP4 blocks in the layer loop and unrolled.
set -u -o pipefail
source tools/plans/lease_lib.sh
gpus=$(nvidia-smi -L | wc -l)
devices=$(seq -s, 0 $((gpus - 1)))
case ${1:-} in
  runs)
    all=(--devices "$devices" --gpus-per-run "$gpus")
    lease_sweep q2-s0 --sizes 30M --ratios 25 --recipes quartet2 --seeds 0 "${all[@]}"
    lease_sweep ms-s0 --sizes 30M --ratios 25 --recipes ms_fp4 --seeds 0 "${all[@]}"
    lease_sweep nv-s0 --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 0 "${all[@]}"
    lease_sweep bf-s12 --sizes 30M --ratios 25 --recipes bf16 --seeds 1 2 "${all[@]}"
    ;;
  probe) CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 bash benchmarks/gpu_suite.sh compile ;;
  *) echo "issue34-f.sh: say runs or probe, got '${1:-}'" >&2; exit 2 ;;
esac
