"""Per-batch validation losses of finished runs, and loss gaps to BF16 with paired error bars.

  fp4jax-evaluate runs/sweep/*-r10-* --batches 64 --out experiments/results/linux-eval.jsonl
  fp4jax-evaluate --table experiments/results/linux-eval.jsonl     # the gap table, markdown
  fp4jax-evaluate --table experiments/results/linux-eval.jsonl --baseline nvidia_nvfp4
  fp4jax-evaluate --table experiments/results/linux-seeded-eval.jsonl --orderings  # which orders hold across seeds
  fp4jax-evaluate --curves experiments/results/linux-ablations.jsonl --baseline ms_fp4 --at 0.1 0.5 1  # along training

For each run folder: restore its newest checkpoint, evaluate ``--batches`` fixed validation batches (the run's
batch size and sequence length, the first windows of the validation split, the run's fixed evaluation key) and
write ``{"name", "model", "recipe", "tokens", "step", "steps", "batch_losses": [...]}`` per line (``step`` <
``steps``: an unfinished run, evaluated at its newest checkpoint).

:func:`gaps` pairs each recipe with the baseline run (BF16 by default; ``--baseline RECIPE`` compares two FP4
recipes directly) of the same size and token count on the same batches: gap = mean_i (loss_i − loss_base_i), error
= t_{0.975, n−1} · sd_i / √n (Student's t 95% interval over the n validation batches; 2.04 for n = 32). The
interval covers the sampling of validation text only, not the run-to-run variance of training (seeds): runs of
several seeds (``fp4jax-sweep --seeds``; each record's ``seed``) pair with the baseline run of their own seed, and
:func:`seeded_gaps` gives each cell's mean gap over seeds with Student's t interval over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.stats

from fp4jax_experiments import cli, train
from fp4jax_experiments.model import BF16_RECIPE, size_rank


def batch_losses(folder: Path, n_batches: int, cache_dir: str | None = None) -> dict:
  """Validation loss of each of ``n_batches`` batches under the newest checkpoint of the run in ``folder``."""
  config = train.TrainConfig(**json.loads((folder / "config.json").read_text()))
  trainer = train.Trainer(config, cache_dir)
  run = train.RunFolder(folder, config)
  try:
    state, step = run.restore(trainer.init_state())
  finally:
    run.close()
  if step == 0:
    raise ValueError(f"{folder}: no checkpoint to evaluate")
  return train.evaluation_record(folder.name, config, step, trainer.batch_losses(state["params"], n_batches))


def t_interval(values: np.ndarray) -> float | None:
  """Half-width of the 95% interval of the mean of ``values``: t_{0.975, n−1} · sd / √n (Student's t, sd with n − 1
  degrees of freedom); None for one value."""
  n = values.size
  return float(scipy.stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n)) if n > 1 else None


def gaps(records: Sequence[dict], baseline: str = BF16_RECIPE) -> list[dict]:
  """Loss gap of every other record to the ``baseline`` recipe's record of the same model, tokens and seed, paired
  over batches (groups without a baseline run are left out).

  Raises:
    ValueError: two records of one (model, tokens, recipe, seed), or a pair evaluated on different batches.
  """
  seen: dict[tuple, str] = {}
  for r in records:
    key = (r["model"], r["tokens"], r["recipe"], train.record_seed(r))
    if key in seen:
      raise ValueError(
        f"records {seen[key]!r} and {r['name']!r} are both {r['recipe']} at {r['model']}, {r['tokens']:,} tokens, "
        f"seed {key[-1]}: one record per run (a variant needs its own recipe label)"
      )
    seen[key] = r["name"]
  base = {(r["model"], r["tokens"], train.record_seed(r)): r for r in records if r["recipe"] == baseline}
  rows = []
  for r in records:
    ref = base.get((r["model"], r["tokens"], train.record_seed(r)))
    if r["recipe"] == baseline or ref is None:
      continue
    if len(r["batch_losses"]) != len(ref["batch_losses"]):
      raise ValueError(
        f"{r['name']} and {ref['name']} must be evaluated on the same validation batches, got "
        f"{len(r['batch_losses'])} and {len(ref['batch_losses'])} batches"
      )
    d = np.asarray(r["batch_losses"]) - np.asarray(ref["batch_losses"])
    if d.size < 2:
      raise ValueError(f"{r['name']}: need at least 2 paired batches for an error bar, got {d.size}")
    rows.append(
      {
        "model": r["model"],
        "tokens": r["tokens"],
        "recipe": r["recipe"],
        "seed": train.record_seed(r),
        "loss": float(np.mean(r["batch_losses"])),
        "baseline_loss": float(np.mean(ref["batch_losses"])),
        "gap": float(d.mean()),
        "ci95": t_interval(d),
      }
    )
  return rows


def seeded_gaps(records: Sequence[dict], baseline: str = BF16_RECIPE) -> list[dict]:
  """Per (model, tokens, recipe): the :func:`gaps` of its seeds (each paired with the baseline run of the same
  seed), their mean, and ``ci95`` = t_{0.975, n−1} · sd / √n over the n seeds (the run-to-run variance of training;
  None for one seed). With ``baseline`` another recipe, this is the paired per-seed difference of two recipes."""
  groups: dict[tuple, list[dict]] = {}
  for row in gaps(records, baseline):
    groups.setdefault((row["model"], row["tokens"], row["recipe"]), []).append(row)
  out = []
  for (model, tokens, recipe), rows in groups.items():
    rows = sorted(rows, key=lambda row: row["seed"])
    g = np.asarray([row["gap"] for row in rows])
    ci = t_interval(g)
    out.append(
      {
        "model": model,
        "tokens": tokens,
        "recipe": recipe,
        "seeds": [row["seed"] for row in rows],
        "gap": float(g.mean()),
        "ci95": ci,
        "per_seed": rows,
      }
    )
  return out


def seeded_gaps_markdown(records: Sequence[dict], baseline: str = BF16_RECIPE) -> str:
  """The :func:`seeded_gaps` table, by model size, tokens, then mean gap: the mean gap with its 95% interval over
  seeds, and each seed's gap with its interval over validation batches."""
  lines = [
    f"| model | tokens | recipe | seeds | gap to {baseline}, mean (95% CI over seeds) "
    "| per seed (95% CI over batches) |",
    "|---|---|---|---|---|---|",
  ]
  for row in sorted(seeded_gaps(records, baseline), key=lambda g: (size_rank(g["model"]), g["tokens"], g["gap"])):
    ci = f" ± {row['ci95']:.4f}" if row["ci95"] is not None else " (one seed)"
    per_seed = ", ".join(f"s{r['seed']}: {r['gap']:+.4f} ± {r['ci95']:.4f}" for r in row["per_seed"])
    lines.append(
      f"| {row['model']} | {row['tokens'] / 1e6:.1f}M | {row['recipe']} | {len(row['seeds'])} "
      f"| {row['gap']:+.4f}{ci} | {per_seed} |"
    )
  return "\n".join(lines) + "\n"


def orderings(records: Sequence[dict]) -> list[dict]:
  """Every two recipes of a (model, tokens) cell run with two or more common seeds, oriented so that ``ahead`` has
  the lower mean loss: their :func:`seeded_gaps` difference (``ahead`` minus ``behind``, each seed paired with its
  own), the interval over seeds, in how many seeds ``ahead`` is ahead, and whether the order holds across seeds
  (``holds``: the interval excludes zero).

  Args:
    records: evaluation records (``batch_losses`` per run) of several seeds.

  Returns:
    One record per pair: model, tokens, ahead, behind, seeds, gap (≤ 0), ci95, ahead_in (seeds), holds.
  """
  rows = []
  for behind in sorted({r["recipe"] for r in records}):
    for g in seeded_gaps(records, baseline=behind):
      if g["recipe"] <= behind or len(g["seeds"]) < 2:  # each pair once, from its later-named recipe
        continue
      sign = 1.0 if g["gap"] <= 0 else -1.0
      a, b = (g["recipe"], behind) if sign > 0 else (behind, g["recipe"])
      rows.append(
        {
          "model": g["model"],
          "tokens": g["tokens"],
          "ahead": a,
          "behind": b,
          "seeds": g["seeds"],
          "gap": sign * g["gap"],
          "ci95": g["ci95"],
          "ahead_in": sum(sign * s["gap"] < 0 for s in g["per_seed"]),
          "holds": bool(abs(g["gap"]) > g["ci95"]),
        }
      )
  return sorted(rows, key=lambda r: (size_rank(r["model"]), r["tokens"], not r["holds"], r["gap"]))


def orderings_markdown(records: Sequence[dict]) -> str:
  """The :func:`orderings` table: per cell, the pairs whose order holds across seeds first, then the others."""
  lines = [
    "| model | tokens | ahead | behind | ahead − behind, mean (95% CI over seeds) | ahead in seeds | holds |",
    "|---|---|---|---|---|---|---|",
  ]
  lines += [
    f"| {r['model']} | {r['tokens'] / 1e6:.1f}M | {r['ahead']} | {r['behind']} | {r['gap']:+.4f} ± {r['ci95']:.4f} "
    f"| {r['ahead_in']} of {len(r['seeds'])} | {'yes' if r['holds'] else 'no'} |"
    for r in orderings(records)
  ]
  return "\n".join(lines) + "\n"


def paired_curves(results: Sequence[dict], baseline: str, recipes: Sequence[str] | None = None) -> dict[tuple, dict]:
  """In-training validation curves paired by seed: per (model, tokens, recipe) with a baseline run of at least one
  of its seeds, the recipe's validation loss minus the baseline run's of the same seed at every evaluation that all
  those runs made (one schedule per cell: the same steps). The in-training evaluations are the trainer's few fixed
  batches (``--eval-batches``), the same batches for every run, so each difference is paired.

  Args:
    results: sweep result records (``fp4jax-sweep --results``: model, tokens, recipe, seed, val_curve).
    baseline: the recipe every other recipe of a cell is compared with.
    recipes: only these (default: every other recipe).

  Returns:
    {(model, tokens, recipe): {"seeds": [...], "at": [tokens, ...], "diffs": array (seeds, evaluations)}}.

  Raises:
    ValueError: two records of one (model, tokens, recipe, seed).
  """
  runs: dict[tuple, dict] = {}
  for r in results:
    key = (r["model"], r["tokens"], r["recipe"], train.record_seed(r))
    if key in runs:
      raise ValueError(f"results: two records of model {key[0]}, {key[1]} tokens, recipe {key[2]}, seed {key[3]}")
    runs[key] = dict(r["val_curve"])
  out = {}
  for model, tokens, recipe in sorted(
    {k[:3] for k in runs if k[2] != baseline and (recipes is None or k[2] in recipes)}
  ):
    seeds = sorted(k[3] for k in runs if k[:3] == (model, tokens, recipe) and (model, tokens, baseline, k[3]) in runs)
    if not seeds:
      continue
    pairs = [(runs[(model, tokens, recipe, s)], runs[(model, tokens, baseline, s)]) for s in seeds]
    at = sorted(set.intersection(*(set(curve) & set(base) for curve, base in pairs)))
    diffs = np.asarray([[curve[t] - base[t] for t in at] for curve, base in pairs], dtype=np.float64)
    out[(model, tokens, recipe)] = {"seeds": seeds, "at": at, "diffs": diffs.reshape(len(seeds), len(at))}
  return out


def curve_gaps(results: Sequence[dict], baseline: str, fractions: Sequence[float]) -> list[dict]:
  """Gaps along training: per (model, tokens, recipe) and each fraction f of the token budget, the
  :func:`paired_curves` differences at the first common evaluation at or after f · tokens, with their mean and
  Student's t 95% interval over the seeds (:func:`t_interval`).

  Args:
    results: sweep result records (``fp4jax-sweep --results``: model, tokens, recipe, seed, val_curve).
    baseline: the recipe every other recipe of a cell is compared with.
    fractions: fractions of the token budget, each in (0, 1].

  Returns:
    One record per (model, tokens, recipe, fraction): model, tokens, recipe, fraction, at (tokens of the
    evaluation), seeds, gap (mean over seeds), ci95 (None for one seed), per_seed [gap, ...].

  Raises:
    ValueError: a fraction outside (0, 1], two records of one (model, tokens, recipe, seed), or no common
      evaluation at or after a fraction.
  """
  for f in fractions:
    if not 0 < f <= 1:
      raise ValueError(f"fractions: {f} must be in (0, 1]")
  out = []
  for (model, tokens, recipe), paired in paired_curves(results, baseline).items():
    for f in fractions:
      i = next((i for i, t in enumerate(paired["at"]) if t >= f * tokens), None)
      if i is None:
        where = f"{recipe} ({model}, {tokens} tokens)"
        raise ValueError(f"{where}: no evaluation common to its seeds and {baseline} at or after {f:g} of the tokens")
      g = paired["diffs"][:, i]
      out.append(
        {
          "model": model,
          "tokens": tokens,
          "recipe": recipe,
          "fraction": f,
          "at": paired["at"][i],
          "seeds": paired["seeds"],
          "gap": float(g.mean()),
          "ci95": t_interval(g),
          "per_seed": [float(x) for x in g],
        }
      )
  return sorted(out, key=lambda r: (size_rank(r["model"]), r["tokens"], r["recipe"], r["fraction"]))


def curve_gaps_markdown(results: Sequence[dict], baseline: str, fractions: Sequence[float]) -> str:
  """The :func:`curve_gaps` table: one row per recipe and fraction of the token budget."""
  lines = [
    f"| model | tokens | recipe | at tokens | gap to {baseline}, mean (95% CI over seeds) | per seed |",
    "|---|---|---|---|---|---|",
  ]
  for r in curve_gaps(results, baseline, fractions):
    ci = f" ± {r['ci95']:.4f}" if r["ci95"] is not None else " (one seed)"
    per_seed = ", ".join(f"s{s}: {g:+.4f}" for s, g in zip(r["seeds"], r["per_seed"]))
    lines.append(
      f"| {r['model']} | {r['tokens'] / 1e6:.1f}M | {r['recipe']} | {r['at'] / 1e6:.1f}M ({r['fraction']:g}) "
      f"| {r['gap']:+.4f}{ci} | {per_seed} |"
    )
  return "\n".join(lines) + "\n"


def gaps_markdown(records: Sequence[dict], baseline: str = BF16_RECIPE) -> str:
  """The :func:`gaps` table, by model size, tokens, then gap, unfinished runs marked; records of more than one seed
  get :func:`seeded_gaps_markdown` instead."""
  if len({train.record_seed(r) for r in records}) > 1:
    return seeded_gaps_markdown(records, baseline)
  names = {(r["model"], r["tokens"], r["recipe"]): r for r in records}
  lines = [f"| model | tokens | recipe | val loss | gap to {baseline} (95% CI) | steps |", "|---|---|---|---|---|---|"]
  for row in sorted(gaps(records, baseline), key=lambda g: (size_rank(g["model"]), g["tokens"], g["gap"])):
    r = names[(row["model"], row["tokens"], row["recipe"])]
    done = f"{r['step']}" if r["step"] >= r["steps"] else f"{r['step']}/{r['steps']} (unfinished)"
    lines.append(
      f"| {row['model']} | {row['tokens'] / 1e6:.1f}M | {row['recipe']} | {row['loss']:.4f} "
      f"| {row['gap']:+.4f} ± {row['ci95']:.4f} | {done} |"
    )
  return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
  """fp4jax-evaluate's command line."""
  parser = cli.parser("fp4jax-evaluate", __doc__.split("\n\n")[0])
  parser.add_argument("runs", nargs="*", type=Path, help="run folders (with config.json and checkpoints)")
  parser.add_argument("--batches", type=int, default=32, help="validation batches per run")
  parser.add_argument("--cache-dir", default=None, help="corpus cache (default $FP4JAX_CACHE or ~/.cache/fp4jax)")
  parser.add_argument("--out", type=Path, default=None, help="JSONL of per-batch losses (with run folders)")
  parser.add_argument(
    "--table", type=Path, default=None, help="print the gap table of a JSONL written by --out, and exit"
  )
  parser.add_argument("--baseline", default=BF16_RECIPE, help="the recipe gaps are taken to")
  parser.add_argument(
    "--orderings",
    action="store_true",
    help="with --table: every two recipes of a cell compared over their seeds (which order holds), not the gaps",
  )
  parser.add_argument(
    "--curves",
    type=Path,
    default=None,
    help="print the gaps along training (in-training validation) of a sweep's --results JSONL, and exit",
  )
  parser.add_argument(
    "--at",
    nargs="+",
    type=float,
    default=[0.1, 0.25, 0.5, 1.0],
    help="with --curves: fractions of the token budget",
  )
  return parser


def main(argv: list[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.table:
    records = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
    print(orderings_markdown(records) if args.orderings else gaps_markdown(records, args.baseline), end="")
    return
  if args.curves:
    if not args.curves.is_file():
      parser.error(f"--curves {args.curves}: no such file (expected a sweep's --results JSONL)")
    results = [json.loads(line) for line in args.curves.read_text().splitlines() if line.strip()]
    lacking = [
      r.get("name", i) for i, r in enumerate(results) if not {"model", "tokens", "recipe", "val_curve"} <= r.keys()
    ]
    if lacking:
      parser.error(
        f"--curves {args.curves}: records {lacking} lack model, tokens, recipe or val_curve "
        "(not a sweep's --results file)"
      )
    try:
      print(curve_gaps_markdown(results, args.baseline, args.at), end="")
    except ValueError as err:
      parser.error(str(err))
    return
  if args.orderings:
    parser.error("--orderings reads a --table FILE")
  if not args.runs or args.out is None:
    parser.error("give run folders and --out (or --table FILE)")
  if args.batches < 2:
    parser.error(f"--batches must be at least 2 (error bars), got {args.batches}")
  records = [batch_losses(folder, args.batches, args.cache_dir) for folder in args.runs]
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
  print(gaps_markdown(records, args.baseline), end="")


if __name__ == "__main__":
  main()
