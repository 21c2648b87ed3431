# Sourced by the plan scripts of tools/lease_sweeps.sh's "NAME ! COMMAND" lines (which set LEASE_STATE and
# LEASE_DEADLINE): lease_sweep NAME ARGS... runs one fp4jax-sweep to its end, in the time the lease has left, with the
# issue-34 settings (the linux corpus, 64 x 512 tokens a step, evaluations and checkpoints as in the results README),
# its folder under LEASE_STATE/runs and its results beside the other sweeps' (LEASE_STATE/NAME.*.jsonl), so the
# lease's calls copy them out.
lease_minutes_left() {
  python -c "import sys, time; print(max(1.0, (int(sys.argv[1]) - time.time()) / 60))" "$LEASE_DEADLINE"
}

lease_sweep() {
  local name=$1
  shift
  fp4jax-sweep "$@" --data linux --seq-len 512 --batch-size 64 --eval-every 200 --eval-batches 8 --log-every 20 \
    --ckpt-every 2000 --final-eval-batches 32 --out "$LEASE_STATE/runs/$name" --max-minutes "$(lease_minutes_left)" \
    --results "$LEASE_STATE/$name.results.jsonl" --eval-results "$LEASE_STATE/$name.eval.jsonl" \
    > "$LEASE_STATE/$name.log" 2>&1
}

# lease_sweep_if_time SECONDS NAME ARGS...: lease_sweep NAME ARGS... where at least SECONDS of the lease are left.
lease_sweep_if_time() {
  local need=$1 left
  shift
  left=$(( LEASE_DEADLINE - $(date +%s) ))
  if [ "$left" -ge "$need" ]; then
    lease_sweep "$@"
  else
    echo "$1: ${left} s left (needs ${need}), not started"
  fi
}
