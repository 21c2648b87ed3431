"""The main job: train one small model under several recipes on the same data; plot and tabulate the losses.

  fp4jax-compare                      # 1M model, 120k bytes of the stdlib corpus: a CPU is enough
  fp4jax-compare --recipes bf16 nvidia_nvfp4 quartet2 --model 10M --tokens 50M --data linux     # needs a GPU

Writes ``OUT/<recipe>/`` (each a resumable training run), ``OUT/loss_curves.png`` and ``OUT/results.md``:
final validation loss, bits per byte, gap to BF16 (same model, data, batches and seed), tokens/s. An error in any
recipe stops the comparison (a bug is not a result).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from fp4jax_experiments import cli, plots, train
from fp4jax_experiments import model as model_lib

DEFAULT_RECIPES = ("bf16", "nvidia_nvfp4", "quartet2")


def compare(base: train.TrainConfig, recipes, out: Path, cache_dir: str | None = None) -> list[dict]:
  """Train ``base`` under each recipe in ``out/<recipe>``; return each run's summary."""
  return [
    train.train(dataclasses.replace(base, recipe=recipe), out / recipe, cache_dir=cache_dir) for recipe in recipes
  ]


def results_table(rows: list[dict]) -> str:
  """Markdown table of final losses; gap = val loss − BF16's val loss."""
  base = next((r["val_loss"] for r in rows if r["recipe"] == model_lib.BF16_RECIPE), None)
  lines = ["| recipe | val loss | val bits/byte | gap to bf16 | tokens/s |", "|---|---|---|---|---|"]
  for r in rows:
    bpb = f"{r['val_bpb']:.4f}" if r["val_bpb"] is not None else "n/a"
    gap = f"{r['val_loss'] - base:+.4f}" if base is not None else "n/a"
    lines.append(f"| {r['recipe']} | {r['val_loss']:.4f} | {bpb} | {gap} | {r['tokens_per_s']:,.0f} |")
  return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
  """fp4jax-compare's command line."""
  parser = cli.parser("fp4jax-compare", __doc__.split("\n\n")[0])
  parser.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES), help="recipes to train, in this order")
  parser.add_argument("--model", default="1M", choices=list(model_lib.SIZES), help="model size")
  parser.add_argument("--tokens", type=train.parse_count, default=120_000, help="training tokens per recipe, e.g. 50M")
  parser.add_argument("--data", default="stdlib", help="stdlib | linux | corpus folder | train .bin[.xz]")
  parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
  parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
  parser.add_argument("--eval-every", type=int, default=20, help="steps between validation losses (and checkpoints)")
  parser.add_argument("--seed", type=int, default=0, help="seed of every run (the same batches for every recipe)")
  parser.add_argument("--out", type=Path, default=Path("runs/compare"), help="folder of the runs, plot and table")
  parser.add_argument("--cache-dir", default=None, help="corpus cache (default $FP4JAX_CACHE or ~/.cache/fp4jax)")
  return parser


def main(argv: list[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    base = train.TrainConfig(
      model=args.model,
      tokens=args.tokens,
      data=args.data,
      batch_size=args.batch_size,
      seq_len=args.seq_len,
      eval_every=args.eval_every,
      ckpt_every=args.eval_every,
      seed=args.seed,
    )
  except ValueError as err:
    parser.error(str(err))
  rows = compare(base, args.recipes, args.out, args.cache_dir)
  curves = {r["recipe"]: train.read_metrics(args.out / r["recipe"]) for r in rows}
  title = f"{args.model} model, {args.tokens:,} tokens of {args.data}"
  plot = plots.loss_curves(curves, args.out / "loss_curves.png", title)
  table = results_table(rows)
  (args.out / "results.md").write_text(f"{title}\n\n{table}")
  (args.out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
  print(f"\n{title}\n\n{table}\nplot: {plot}\ntable: {args.out / 'results.md'}")


if __name__ == "__main__":
  main()
