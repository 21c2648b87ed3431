#!/bin/bash
# Several fp4jax-sweep runs side by side on a lent multi-GPU machine, across the calls of one lease.
#
#   bash tools/lease_sweeps.sh PLAN MINUTES [WAIT_S]
#
# PLAN: one sweep per line (a trailing \ continues it), "NAME fp4jax-sweep-arguments..." (no --out, --max-minutes,
# --results or --eval-results: this script sets them); blank lines and # comments are skipped. The first call on a
# machine installs the checkout (no network), unpacks the linux-6.12 corpus once ($FP4JAX_LINUX_DATA, default
# ./data/linux-6.12: copy ../shared/data/linux-6.12 there and carry `data`), and starts each line as
#   fp4jax-sweep ARGS --out /tmp/lease-sweeps/runs/NAME --max-minutes MINUTES --results ... --eval-results ...
# in its own process session (setsid), so that the sweeps outlive the call. Every call (the first included) then
# waits until all sweeps have exited or WAIT_S seconds (default 540) have passed since it began, copying into $OUT
# every 50 s: results.jsonl and eval.jsonl (every sweep's finished runs), runs.tgz (the run folders without
# checkpoints), sweeps.log (each sweep's log tail, nvidia-smi) and device.txt (JAX devices, GPUs, COMMIT, plan).
# A line "NAME ! COMMAND" runs the bash COMMAND instead (a GPU probe, e.g. "CUDA_VISIBLE_DEVICES=3
# XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 bash benchmarks/gpu_suite.sh loop-copies"), in its own session with OUT set to
# its folder, LEASE_STATE the state folder below and LEASE_DEADLINE the epoch second at which the first call's
# MINUTES end; every call packs those folders into $OUT/commands.tgz. COMMIT=<sha> names the code in every run's
# summary. A call cut off at its limit still returns the last copy.
# Later calls of the same lease start nothing; they wait and copy again. A run unfinished when the lease ends is
# lost (checkpoints stay on the machine).
#
# Memory: each training process gets XLA_PYTHON_CLIENT_MEM_FRACTION=$MEMFRAC (default 0.15), so several sweeps can
# share a GPU; keep the processes per GPU times MEMFRAC under 0.95.
set -u -o pipefail
PLAN=${1:-}; MIN=${2:-}; WAIT_S=${3:-540}
[ -f "$PLAN" ] || { echo "lease_sweeps.sh: PLAN '$PLAN' is not a file (usage: PLAN MINUTES [WAIT_S])" >&2; exit 2; }
[[ "$MIN" =~ ^[0-9]+(\.[0-9]+)?$ && "$WAIT_S" =~ ^[0-9]+$ ]] \
  || { echo "lease_sweeps.sh: MINUTES '$MIN' and WAIT_S '$WAIT_S' must be numbers (WAIT_S whole seconds)" >&2; exit 2; }
empty=$(grep -v '^ *#' "$PLAN" | grep -E '^[^[:space:]]+[[:space:]]+![[:space:]]*$' | head -1)
[ -z "$empty" ] || { echo "lease_sweeps.sh: PLAN line '$empty' has no command after '!'" >&2; exit 2; }
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
STATE=${LEASE_STATE:-/tmp/lease-sweeps}  # the sweeps' folders and logs on the machine
T0=$(date +%s)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FP4JAX_LINUX_DATA=${FP4JAX_LINUX_DATA:-$PWD/data/linux-6.12}
export FP4JAX_COMMIT=${COMMIT:-}  # each run's summary records it (the machine's copy may hold no .git)
export XLA_PYTHON_CLIENT_MEM_FRACTION=${MEMFRAC:-0.15}
[ -n "${SKIP_INSTALL:-}" ] || python -m pip install -q --no-index --no-deps --no-build-isolation -e . \
  > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export SKIP_INSTALL=1  # installed: a COMMAND line's gpu_suite.sh does not install again
PATH="$(python -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export LEASE_STATE=$STATE
if [ ! -d "$STATE" ]; then
  mkdir -p "$STATE/runs"
  LEASE_DEADLINE=$(python -c "import sys; print(int($T0 + 60 * float(sys.argv[1])))" "$MIN"); export LEASE_DEADLINE
  {
    python -c "import jax; print(jax.__version__, jax.devices())"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    echo "commit ${COMMIT:-?}, started $(date -u +%FT%TZ), MEMFRAC $XLA_PYTHON_CLIENT_MEM_FRACTION"
    python -c "from fp4jax_experiments import data; data.load_corpus('linux')"  # unpack once, before the sweeps
  } > "$STATE/device.txt" 2>&1
  grep -v '^ *#' "$PLAN" | grep . | while read name args; do  # no -r: a line ending in \ continues on the next
    if [ "${args:0:1}" = "!" ]; then
      cmd=${args:1}; cmd=${cmd#"${cmd%%[![:space:]]*}"}  # the command, its leading blanks dropped
      mkdir -p "$STATE/out/$name"
      OUT="$STATE/out/$name" setsid nohup bash -c "$cmd" > "$STATE/$name.log" 2>&1 < /dev/null &
      echo $! > "$STATE/$name.pid"
      echo "started $name: $cmd" >> "$STATE/device.txt"
      continue
    fi
    # shellcheck disable=SC2086  # the plan's arguments are split into words on purpose
    setsid nohup fp4jax-sweep $args --out "$STATE/runs/$name" --max-minutes "$MIN" \
      --results "$STATE/$name.results.jsonl" --eval-results "$STATE/$name.eval.jsonl" \
      > "$STATE/$name.log" 2>&1 < /dev/null &
    echo $! > "$STATE/$name.pid"
    echo "started $name: fp4jax-sweep $args --max-minutes $MIN" >> "$STATE/device.txt"
  done
fi
copy_out() {
  cat "$STATE"/*.results.jsonl > "$OUT/results.jsonl" 2>/dev/null
  cat "$STATE"/*.eval.jsonl > "$OUT/eval.jsonl" 2>/dev/null
  cp "$STATE/device.txt" "$OUT/device.txt"
  { for f in "$STATE"/*.log; do echo "== $f"; tail -n 40 "$f"; done; date -u; nvidia-smi; } > "$OUT/sweeps.log" 2>&1
  if [ -d "$STATE/out" ]; then
    (cd "$STATE" && tar czf "$OUT/commands.tgz.tmp" out && mv "$OUT/commands.tgz.tmp" "$OUT/commands.tgz")
  fi
  (cd "$STATE" && tar czf "$OUT/runs.tgz.tmp" --exclude=ckpt --exclude=ckpt-rejected --exclude=.jax-cache runs \
    && mv "$OUT/runs.tgz.tmp" "$OUT/runs.tgz")
}
while :; do
  alive=0
  for p in "$STATE"/*.pid; do kill -0 "$(cat "$p")" 2>/dev/null && alive=1; done
  copy_out
  [ "$alive" = 0 ] && { echo "all sweeps exited"; break; }
  [ $(($(date +%s) - T0 + 60)) -ge "$WAIT_S" ] && { echo "sweeps still running"; break; }
  sleep 50
done
grep -h "^sweep .*finished" "$STATE"/*.log
