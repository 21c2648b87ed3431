#!/bin/bash
# The GPU checks and benchmarks of BENCHMARKS.md, in pieces that each fit one 10-minute device command.
#
#   bash benchmarks/gpu_suite.sh kernels   # 1 GPU: GPU tests (compiled kernels, parity, ieee)
#   bash benchmarks/gpu_suite.sh quantize  # 1 GPU: quantize stage profile, quantize bench (and after a producer)
#   bash benchmarks/gpu_suite.sh gemm      # 1 GPU: the FP4 GEMM bench (many rows, then few), the linear layer
#   bash benchmarks/gpu_suite.sh pairs     # 1 GPU: quantize_pair against two quantizes (tile sweep), the layer
#   bash benchmarks/gpu_suite.sh multi     # 2-4 GPUs: sharded == one device (operands, then losses)
#   bash benchmarks/gpu_suite.sh scaling   # 2-4 GPUs: data-parallel weak scaling, 125M and 350M
#   bash benchmarks/gpu_suite.sh overlap   # 2 GPUs: weak scaling with the gradient all-reduce overlapped (XLA flags)
#   bash benchmarks/gpu_suite.sh unroll    # 1 GPU: a step with its FP4 blocks unrolled against the loop (MODEL: 30M, 125M)
#   bash benchmarks/gpu_suite.sh prequantize  # 1 GPU: ModelConfig.prequantize_weights (the default) against the
#                                          # layer loop: the same bits, the 125M step's reproducibility with each,
#                                          # the step side by side (RECIPES, UNROLLED=1: also unrolled, BITS=0: no
#                                          # bit check, STEP=0: the bit check only)
#   bash benchmarks/gpu_suite.sh defaults  # 1 GPU: the 125M step of every recipe with the defaults, beside the anchor
#   bash benchmarks/gpu_suite.sh threefry  # 1 GPU: the 125M step with JAX's threefry as one kernel per call against
#                                          # its unrolled rounds in the HLO (RECIPES; nvidia_nvfp4 also in the loop)
#   bash benchmarks/gpu_suite.sh compile   # 1 GPU: where the 125M step's compile time goes, FP4 blocks in the loop and
#                                          # unrolled (RECIPE, default nvidia_nvfp4)
#   bash benchmarks/gpu_suite.sh deterministic  # 2-4 GPUs: --deterministic, bit-identical losses (one process and
#                                          # three), then its cost at 125M (one process per program: XLA flags)
#   bash benchmarks/gpu_suite.sh tp        # 1-4 GPUs: --deterministic --tensor-shards 2, losses against one GPU (one
#                                          # process, then across processes); RECIPES=a,b picks the recipes
#   bash benchmarks/gpu_suite.sh tp-cost   # 2 GPUs: what --tensor-shards 2 costs at 125M
#   bash benchmarks/gpu_suite.sh training  # 1 GPU: XLA vs Pallas quantizers, losses step by step, then the 125M step
#   bash benchmarks/gpu_suite.sh recompute # 1 GPU: ModelConfig.recompute's loss curves (bf16, 200 steps) and FP4 speed
#   bash benchmarks/gpu_suite.sh loop-flags  # 1 GPU: the 125M step under XLA flags against the layer loop's copies
#   bash benchmarks/gpu_suite.sh loop-copies  # 1 GPU: what the step's layer loops copy (compiled HLO), per flag set
#   bash benchmarks/gpu_suite.sh occ       # 1 GPU: ms_fp4's OCC clamp bounds several ways, its step with each select
#   bash benchmarks/gpu_suite.sh prepass   # 1 GPU: MS-EDEN's staging pre-pass per tile and warps (quartet2)
#   bash benchmarks/gpu_suite.sh ablation  # 1 GPU: a recipe's 125M step with and without one op's Pallas
#                                          # implementation (OP, default select_ranks; RECIPE, default ms_fp4)
#
# Logs and JSON go to $OUT (the device tool's output folder), or ./gpu_out elsewhere. Run from the repository root.
set -u -o pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The checkout, installed with no network (the machine has the dependencies and setuptools): fp4jax, fp4jax_kernels and
# fp4jax_experiments import from here, in every process; its commands (fp4jax-train, ...) go on the PATH. SKIP_INSTALL=1
# skips it (another script of the same call installed it already).
[ -n "${SKIP_INSTALL:-}" ] || python -m pip install -q --no-index --no-deps --no-build-isolation -e . \
  > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
PATH="$(python -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
python -c "import jax; print(jax.__version__, jax.devices())" > "$OUT/device.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv >> "$OUT/device.txt" 2>&1

# same_curves PREFIX N: the loss and validation-loss records of the N runs $OUT/PREFIX*/metrics.jsonl, and whether they
# are equal as floats across the runs
same_curves() {
  python - "$OUT" "$1" "$2" <<'PY'
import json, pathlib, sys
runs = sorted(pathlib.Path(sys.argv[1]).glob(sys.argv[2] + "*/metrics.jsonl"))
curves = {r.parent.name: [json.loads(line).get("loss", json.loads(line).get("val_loss")) for line in r.open()] for r in runs}
print(curves)
print("bit-identical across processes:", len(curves) == int(sys.argv[3]) and len({tuple(c) for c in curves.values()}) == 1)
PY
}

# loop_flags NAME: the XLA_FLAGS of a named flag set aimed at the layer loops' copies
loop_flags() {
  case $1 in
    none) echo "" ;;
    double_buffering) echo "--xla_gpu_enable_while_loop_double_buffering=true" ;;
    region_analysis) echo "--xla_gpu_copy_insertion_use_region_analysis=true" ;;
    # XLA reads and writes loop slots in place for cuBLAS GEMMs and registered custom calls (not Triton's)
    dynamic_slice_fusion) echo "--xla_gpu_enable_dynamic_slice_fusion=true" ;;
    # no command buffers (CUDA graphs): the loop bodies' instructions stay in the body, copies run as cudaMemcpy
    no_command_buffer) echo "--xla_gpu_enable_command_buffer=" ;;
    *) echo "gpu_suite.sh: unknown flag set '$1' (none double_buffering region_analysis dynamic_slice_fusion" \
         "no_command_buffer)" >&2
       return 2 ;;
  esac
}

# flag_sets DEFAULT: $FLAGSETS (else DEFAULT), each name checked by loop_flags before any of them runs
flag_sets() {
  local v sets=${FLAGSETS:-$1}
  for v in $sets; do loop_flags "$v" > /dev/null || return 2; done
  echo "$sets"
}

case "${1:-}" in
  kernels)
    # 15 workers share the GPU (no preallocation): compiling the kernels (and the CPU references), not running them,
    # is what takes the time (445 tests in 319 s on an H200 with 16 cores).
    # --dist load overrides pyproject's loadfile, which would run all of test_gpu_parity.py on one worker.
    # -m "slow or not slow": the slow tier's kernel cases too (compiled, they are cheap here)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 450 python -m pytest -v -n 15 --dist load -m "slow or not slow" \
      -p no:cacheprovider tests/test_gpu_parity.py tests/test_ieee.py tests/kernels > "$OUT/gpu_tests.log" 2>&1
    ;;
  quantize)
    timeout 100 python benchmarks/kernels_quantize_profile.py > "$OUT/quantize_profile.log" 2>&1
    # the hand-picked tiles, the pre-pass and the transposed routes (--sweep-tiles: the tile x warps sweep instead)
    timeout 90 python benchmarks/kernels_quantize.py > "$OUT/quantize_bench.log" 2>&1
    # NVFP4 RTN after an elementwise producer: the amax pre-pass folded into the producer's fusion
    timeout 60 python benchmarks/kernels_quantize.py --after-producer > "$OUT/quantize_after_producer.log" 2>&1
    ;;
  gemm)
    # every tile of the table compiles before it is timed: the two shapes took more than 90 s on an H100
    timeout 240 python benchmarks/kernels_gemm.py > "$OUT/gemm.log" 2>&1
    timeout 120 python benchmarks/kernels_gemm.py --few-rows > "$OUT/gemm_few_rows.log" 2>&1
    timeout 200 python benchmarks/bench_linear.py --json "$OUT/linear.json" > "$OUT/linear.log" 2>&1
    ;;
  pairs)
    # a linear layer's X and dY quantized both ways by one kernel, then the layer of the recipes that use it
    timeout 300 python benchmarks/kernels_quantize.py --pairs --rows 8192 --cols 4096 > "$OUT/pairs.log" 2>&1
    timeout 150 python benchmarks/bench_linear.py --recipes nvfp4_rtn,nvidia_nvfp4 --json "$OUT/linear_pairs.json" \
      > "$OUT/linear_pairs.log" 2>&1
    ;;
  multi)
    n=$(nvidia-smi -L | wc -l)
    meshes="data=$n data=$n:fsdp model=2"
    [ "$n" -ge 4 ] && meshes="$meshes data=2,model=2"
    # the loss check's default model has two heads, so the tensor-parallel meshes split attention too
    for checks in operands loss; do
      timeout 280 fp4jax-layout-check --recipes bf16,nvfp4_rtn,nvidia_nvfp4,quartet2 --meshes $meshes \
        --grad-comm-dtypes float32,bfloat16 --checks $checks \
        --out "$OUT/layout_$checks.json" > "$OUT/layout_$checks.log" 2>&1
    done
    ;;
  scaling)
    n=$(nvidia-smi -L | wc -l)
    counts=$(seq -s, 1 "$n" | awk -F, '{for (i = 1; i <= NF; i *= 2) s = s (s ? "," : "") i; print s}')
    timeout 280 fp4jax-bench-scaling --model 125M --recipes bf16,nvidia_nvfp4,quartet2 --devices "$counts" \
      --per-device-batch 16 --steps 6 --warmup 2 --out "$OUT/scaling125.json" > "$OUT/scaling125.log" 2>&1
    timeout 280 fp4jax-bench-scaling --model 350M --recipes bf16,nvidia_nvfp4 --devices "$counts" \
      --per-device-batch 8 --steps 5 --warmup 2 --out "$OUT/scaling350.json" > "$OUT/scaling350.log" 2>&1
    ;;
  overlap)
    # train_throughput on 1 and 2 GPUs (bf16, nvidia_nvfp4, both grad_sum modes) under XLA's latency-hiding
    # scheduler and pipelined all-reduce, so that each block's gradient sum can overlap the backward pass; the
    # anchor runs under the same flags. Against BENCHMARKS' section without flags (5de84e5: 92.2% and 90.2%).
    variants='{"experiments": {}, "per_block": {"grad_sum": "per_block"}}'
    flags="--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_pipelined_all_reduce=true"
    XLA_FLAGS="$flags" timeout 330 python benchmarks/train_throughput.py --devices 1,2 --recipes bf16,nvidia_nvfp4 \
      --rounds 2 --steps 8 --max-compile-s 120 --experiments-variants "$variants" \
      --out "$OUT/train_throughput_2gpu_overlap.json" > "$OUT/train_throughput_2gpu_overlap.log" 2>&1
    ;;
  unroll)
    # FP4 blocks in the layer loop (the default) against unrolled: the loop's residual stacks (their zero fill,
    # memcpys and slice fusions in BENCHMARKS' profiles) against compiling every block's kernels apart. MODEL=125M
    # (issue 31's shape: 16 x 1024 tokens, 12 blocks; compile target 60 s) or 30M (the default: the sweeps' 64 x 512
    # tokens, 6 blocks; a sweep compiles once per recipe and cell, so a slower compile can pay for itself over a run).
    # RECIPES (default nvidia_nvfp4: an unrolled FP4 stack compiles every block's kernels apart, minutes for quartet2).
    # UNROLLS="2 3 4": blocks per loop iteration to measure beside the loop (default: the whole stack, "unrolled").
    case ${MODEL:-30M} in
      30M) shape="--model 30M --batch 64 --seq-len 512" blocks=6 ;;
      125M) shape="--model 125M" blocks=12 ;;
      *) echo "gpu_suite.sh unroll: MODEL must be 30M or 125M, got '$MODEL'" >&2; exit 2 ;;
    esac
    variants='{"experiments": {}' tag=""
    for k in ${UNROLLS:-$blocks}; do
      [[ "$k" =~ ^[1-9][0-9]*$ ]] \
        || { echo "gpu_suite.sh unroll: UNROLLS must be positive integers, got '$k'" >&2; exit 2; }
      if [ "$k" -ge "$blocks" ]; then variants+=", \"unrolled\": {\"scan_unroll\": $blocks}"
      else variants+=", \"unroll_$k\": {\"scan_unroll\": $k}" tag=_partial; fi
    done
    variants+="}"
    # shellcheck disable=SC2086  # $shape is several flags
    timeout 560 python benchmarks/train_throughput.py $shape --devices 1 \
      --recipes "${RECIPES:-nvidia_nvfp4}" --rounds 2 --steps 8 --max-compile-s 300 \
      --experiments-variants "$variants" --profile "/tmp/prof_unroll_${MODEL:-30M}" \
      --out "$OUT/train_throughput_${MODEL:-30M}_unroll$tag.json" \
      > "$OUT/train_throughput_${MODEL:-30M}_unroll$tag.log" 2>&1
    ;;
  prequantize)
    # The FP4 stacks' projection weights quantized for all layers before the layer loop (ModelConfig.
    # prequantize_weights, the default) against in the loop, 125M: the same loss and gradients bit for bit with the
    # kernels on (the slow model test on this GPU), and whether one compiled step reproduces its own losses and the
    # loop's against prequantized (benchmarks/step_bits.py, the first recipe; BITS=0 skips both); then the step side
    # by side for RECIPES (default nvidia_nvfp4), with UNROLLED=1 also unrolled (does it compile in time?)
    if [ "${BITS:-1}" != 0 ]; then
      timeout 720 python -m pytest -v -m "slow or not slow" -p no:cacheprovider tests/experiments/test_exp_model.py \
        -k change_how_not_what > "$OUT/prequantize_bits.log" 2>&1
      recipe=${RECIPES:-nvidia_nvfp4}
      timeout 300 python benchmarks/step_bits.py --recipe "${recipe%%,*}" \
        --out "$OUT/step_bits_125M_${recipe%%,*}.json" > "$OUT/prequantize_step_bits.log" 2>&1
    fi
    [ "${STEP:-1}" != 0 ] || exit 0
    recipes=${RECIPES:-nvidia_nvfp4}
    variants='{"experiments": {}, "loop": {"prequantize_weights": false}'
    [ "${UNROLLED:-0}" = 0 ] || variants+=', "unrolled": {"scan_unroll": 12}'
    variants+="}"
    name="train_throughput_125M_prequantized_${recipes//,/_}"
    timeout 420 python benchmarks/train_throughput.py --model 125M --devices 1 --recipes "$recipes" --rounds 2 \
      --steps 8 --max-compile-s 240 --profile "/tmp/prof_$name" --experiments-variants "$variants" \
      --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    ;;
  defaults)
    # The 125M step of every recipe with this commit's defaults (the kernels, prequantized weights, nvidia_nvfp4's
    # stack unrolled under the threefry kernel lowering) beside the anchor, one process: the headline ratios of issue
    # 31 (RECIPES, default bf16,nvidia_nvfp4,quartet2,ms_fp4,quartet); about 5 minutes.
    timeout 450 python benchmarks/train_throughput.py --model 125M --devices 1 \
      --recipes "${RECIPES:-bf16,nvidia_nvfp4,quartet2,ms_fp4,quartet}" --rounds 2 --steps 8 --max-compile-s 150 \
      --profile /tmp/prof_defaults --out "$OUT/train_throughput_125M_defaults.json" \
      > "$OUT/train_throughput_125M_defaults.log" 2>&1
    ;;
  threefry)
    # ModelConfig.threefry_kernel (jax_threefry_gpu_kernel_lowering, the same bits): on a GPU, JAX lowers each
    # threefry call (Flax's and fp4jax's key derivations and seeds) as 20 unrolled rounds, most of an FP4 step's
    # StableHLO (benchmarks/hlo_census.py). The default ("auto") lowers it as kernels where an FP4 stack is unrolled
    # (nvidia_nvfp4's, model.UNROLLED_RECIPES): the step against the loop and the unrolled rounds, each way; for the
    # other RECIPES (default "nvidia_nvfp4 quartet2"; one process each) the loop with and without the kernels.
    for recipe in ${RECIPES:-nvidia_nvfp4 quartet2}; do
      variants='{"experiments": {}, "threefry_kernel": {"threefry_kernel": true}'
      [ "$recipe" != nvidia_nvfp4 ] || variants='{"experiments": {}, "unrolled_rounds": {"threefry_kernel": false},
        "loop": {"scan_unroll": 1}, "loop_threefry_kernel": {"scan_unroll": 1, "threefry_kernel": true}'
      name="train_throughput_125M_threefry_$recipe"
      timeout 480 python benchmarks/train_throughput.py --model 125M --devices 1 --recipes "$recipe" --rounds 2 \
        --steps 8 --max-compile-s 240 --profile "/tmp/prof_$name" --experiments-variants "$variants}" \
        --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    done
    ;;
  compile)
    # XLA's passes and kernel-module compiles, by host time, for the step with its 12 FP4 blocks in the layer loop and
    # unrolled (BENCHMARKS: unrolled runs faster and compiles for minutes)
    recipe=${RECIPE:-nvidia_nvfp4}
    timeout 560 python benchmarks/compile_profile.py --recipe "$recipe" --top 80 \
      --variants '{"scan": {}, "unrolled": {"scan_unroll": 12}}' \
      --out "$OUT/compile_profile_${recipe}_unroll.json" > "$OUT/compile_profile_${recipe}_unroll.log" 2>&1
    ;;
  deterministic)
    n=$(nvidia-smi -L | wc -l)
    timeout 400 fp4jax-layout-check --checks loss --recipes bf16,nvfp4_rtn,nvidia_nvfp4,quartet2 \
      --meshes data=$n data=$n:fsdp --steps 3 --deterministic 4 --out "$OUT/layout_deterministic.json" \
      > "$OUT/layout_deterministic.log" 2>&1
    for mesh in "" "--mesh data=$n" "--mesh data=$n --fsdp"; do
      name=run$(echo "$mesh" | tr -dc 'a-z0-9')
      timeout 60 fp4jax-train --model 1M --recipe nvidia_nvfp4 --tokens 24576 --batch-size 16 \
        --seq-len 128 --log-every 1 --eval-every 6 --ckpt-every 6 --eval-batches 2 --deterministic 4 $mesh \
        --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    done
    same_curves run 3 > "$OUT/cross_process.log"
    common="--model 125M --recipes bf16,nvidia_nvfp4 --per-device-batch 16 --seq-len 1024 --steps 5 --warmup 2"
    timeout 150 fp4jax-bench-scaling $common --devices 1,$n --out "$OUT/cost_default.json" \
      > "$OUT/cost_default.log" 2>&1
    XLA_FLAGS="--xla_gpu_deterministic_ops=true" timeout 100 fp4jax-bench-scaling $common --devices 1 \
      --out "$OUT/cost_flag.json" > "$OUT/cost_flag.log" 2>&1
    for per_device in 1 2; do
      timeout 150 fp4jax-bench-scaling $common --devices 1,$n --microbatches-per-device $per_device \
        --out "$OUT/cost_det$per_device.json" > "$OUT/cost_det$per_device.log" 2>&1
    done
    ;;
  training)
    # the two quantizer backends step by step (losses bit for bit), then the 125M step both ways
    timeout 200 fp4jax-layout-check --checks backends --recipes nvfp4_rtn,nvidia_nvfp4,quartet2 \
      --steps 4 --out "$OUT/backends.json" > "$OUT/backends.log" 2>&1
    for backend in xla pallas; do
      timeout 280 fp4jax-bench-scaling --model 125M --recipes bf16,nvidia_nvfp4,quartet2 --devices 1 \
        --per-device-batch 16 --steps 6 --warmup 2 --quantizer-backend $backend --out "$OUT/train_$backend.json" \
        > "$OUT/train_$backend.log" 2>&1
    done
    ;;
  recompute)
    # ModelConfig.recompute: the 125M bf16 loss curve of each mode against the saved one, two runs each (the GPU's
    # run-to-run noise), then the FP4 steps' throughput side by side in one process
    timeout 250 python benchmarks/loss_curves.py --rounds 2 --out "$OUT/loss_curves.json" \
      --variants '{"none": {"recompute": "none"}, "norms": {"recompute": "norms"}}' > "$OUT/loss_curves.log" 2>&1
    variants='{"experiments": {}, "norms": {"recompute": "norms"}, "norms_swiglu": {"recompute": "norms_swiglu"}}'
    # nvidia_nvfp4 only: with quartet2 too (70 s per compile on an H100) the piece outran its 330 s
    timeout 330 python benchmarks/train_throughput.py --devices 1 --recipes nvidia_nvfp4 --rounds 2 --steps 8 \
      --experiments-variants "$variants" --out "$OUT/train_throughput_recompute.json" \
      > "$OUT/train_throughput_recompute.log" 2>&1
    ;;
  loop-flags)
    # XLA flags against the layer loop's copies (the copy column of BENCHMARKS.md's 125M profile): one process per
    # flag set, each timing the anchor beside the models, so "/ anchor" compares across the processes; profiled.
    # Budgeted at 190 s per process. RECIPES (default bf16,nvidia_nvfp4,quartet2) picks the models, FLAGSETS (default
    # all five) the flag sets.
    sets=$(flag_sets "none double_buffering region_analysis dynamic_slice_fusion no_command_buffer") || exit 2
    for v in $sets; do
      flags=$(loop_flags "$v")
      XLA_FLAGS="$flags" timeout 190 python benchmarks/train_throughput.py --devices 1 \
        --recipes "${RECIPES:-bf16,nvidia_nvfp4,quartet2}" --rounds 2 --steps 8 --max-compile-s 120 \
        --profile "/tmp/prof_loop_$v" \
        --out "$OUT/train_throughput_loop_$v.json" > "$OUT/train_throughput_loop_$v.log" 2>&1
    done
    ;;
  loop-copies)
    # What the 125M step's layer loops copy, from its compiled HLO (benchmarks/loop_copies.py), per flag set and
    # recipe (RECIPES, default nvidia_nvfp4; FLAGSETS, default none and no_command_buffer); about 40 s a compile.
    sets=$(flag_sets "none no_command_buffer") || exit 2
    for v in $sets; do
      flags=$(loop_flags "$v")
      for r in $(echo "${RECIPES:-nvidia_nvfp4}" | tr , ' '); do
        hlo=(); [ "$v" = none ] && hlo=(--hlo-out "$OUT/hlo_${r}.txt.gz")  # the module, to look up profile names
        XLA_FLAGS="$flags" timeout 240 python benchmarks/loop_copies.py --recipe "$r" ${hlo[@]+"${hlo[@]}"} \
          --out "$OUT/loop_copies_${r}_$v.json" > "$OUT/loop_copies_${r}_$v.log" 2>&1
      done
    done
    ;;
  occ)
    # ms_fp4's OCC bounds: the radix select at three digit widths, a sort, two top-k forms and the Pallas select
    # (fp4jax_kernels.select, bfloat16 rows), same bounds checked; then ms_fp4's 125M step with each select
    timeout 180 python benchmarks/occ_bounds.py --dtypes bfloat16 float32 --out "$OUT/occ_bounds.json" \
      > "$OUT/occ_bounds.log" 2>&1
    timeout 300 python benchmarks/pallas_ablation.py --op select_ranks --recipe ms_fp4 \
      --out "$OUT/pallas_ablation_select_ranks_ms_fp4.json" > "$OUT/pallas_ablation_select_ranks_ms_fp4.log" 2>&1
    ;;
  tp)
    # --deterministic 2 --tensor-shards 2 (Megatron shards, ordered sums): the mesh's shards against one GPU running
    # both (jax.vmap), losses and state; then two processes, one GPU and (with 2+ GPUs) model=2, else one GPU twice.
    # Two H100s took about 85 s per recipe on model=2: with 4 GPUs (three meshes) pass fewer RECIPES per command.
    n=$(nvidia-smi -L | wc -l)
    if [ "$n" -ge 2 ]; then
      meshes="model=2"; [ "$n" -ge 4 ] && meshes="model=2 data=2,model=2 data=2,model=2:fsdp"
      recipes=${RECIPES:-bf16,nvfp4_rtn,nvidia_nvfp4,quartet2}
      timeout 400 fp4jax-layout-check --checks loss --recipes "$recipes" \
        --meshes $meshes --steps 3 --deterministic 2 --out "$OUT/layout_tp.json" > "$OUT/layout_tp.log" 2>&1
    fi
    runs=("" "")
    [ "$n" -ge 2 ] && runs[1]="--mesh model=2"
    for i in "${!runs[@]}"; do
      timeout 80 fp4jax-train --model 1M --recipe nvidia_nvfp4 --tokens 24576 --batch-size 16 \
        --seq-len 128 --log-every 1 --eval-every 6 --ckpt-every 6 --eval-batches 2 --deterministic 2 \
        --tensor-shards 2 ${runs[$i]} --out "$OUT/tp$i" > "$OUT/tp$i.log" 2>&1
    done
    same_curves tp "${#runs[@]}" > "$OUT/tp_cross_process.log"
    ;;
  prepass)
    # quartet2's 128-point staging pre-pass (16.5 ms of its 125M step, 4-5x its bytes' time) per tile and warps,
    # each launch checked to stage the default's bits; about 3 minutes
    timeout 400 python benchmarks/kernels_quantize_profile.py --prepass-sweep --out "$OUT/prepass_sweep.json" \
      > "$OUT/prepass_sweep.log" 2>&1
    ;;
  ablation)
    op=${OP:-select_ranks} recipe=${RECIPE:-ms_fp4}
    timeout 400 python benchmarks/pallas_ablation.py --op "$op" --recipe "$recipe" \
      --out "$OUT/pallas_ablation_${op}_${recipe}.json" > "$OUT/pallas_ablation_${op}_${recipe}.log" 2>&1
    ;;
  tp-cost)
    # what --deterministic --tensor-shards 2 costs at 125M, on one GPU (vmapped shards) and on model=2
    common="--model 125M --recipes bf16,nvidia_nvfp4 --per-device-batch 16 --seq-len 1024 --steps 5 --warmup 2"
    timeout 150 fp4jax-bench-scaling $common --mesh model --devices 1,2 --microbatches-per-device 1 \
      --out "$OUT/tp_cost_det.json" > "$OUT/tp_cost_det.log" 2>&1
    timeout 120 fp4jax-bench-scaling $common --mesh model --devices 1,2 \
      --out "$OUT/tp_cost_default.json" > "$OUT/tp_cost_default.log" 2>&1
    ;;
  *)
    echo "usage: bash benchmarks/gpu_suite.sh PIECE (the pieces are listed at the top of this file)" >&2
    exit 2
    ;;
esac
tail -n 5 "$OUT"/*.log
