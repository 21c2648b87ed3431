"""Sweep: grid planning, CLI round trip of configs, skip / resume / device scheduling."""

import argparse
import dataclasses
import json
import sys

import numpy as np
import pytest

from fp4jax_experiments import model, sweep, train

BASE = train.TrainConfig(batch_size=4, seq_len=32)


def test_plan_covers_the_grid_with_tokens_per_parameter():
  runs = sweep.plan(BASE, ["1M", "3M"], [25, 100], ["bf16", "quartet2"])
  assert len(runs) == 8 and len({r.name for r in runs}) == 8
  run = next(r for r in runs if r.name == "3M-r100-quartet2")
  n = model.parameter_count(model.model_config("3M"))["non_embedding"]
  assert run.config.recipe == "quartet2" and run.config.model == "3M"
  assert run.config.tokens % BASE.tokens_per_step == 0 and 0 <= 100 * n - run.config.tokens < BASE.tokens_per_step
  with pytest.raises(ValueError, match="ratios"):
    sweep.plan(BASE, ["1M"], [0], ["bf16"])


def test_an_unknown_recipe_is_refused_before_any_run_starts(tmp_path, capsys):
  with pytest.raises(ValueError, match="unknown recipe 'quartett'"):
    sweep.plan(BASE, ["1M"], [10], ["bf16", "quartett"])
  with pytest.raises(ValueError, match="cannot load 'nope' from module 'fp4jax_experiments.ablations'"):
    sweep.plan(BASE, ["1M"], [10], ["fp4jax_experiments.ablations:nope"])
  with pytest.raises(SystemExit):
    sweep.main(["--out", str(tmp_path / "s"), "--sizes", "1M", "--ratios", "10", "--recipes", "quartett"])
  assert "unknown recipe 'quartett'" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_seeds_repeat_every_cell_under_its_own_seed():
  runs = sweep.plan(BASE, ["1M"], [10], ["bf16", "quartet2"], seeds=[0, 1, 2])
  assert [r.name for r in runs] == [f"1M-r10-{rc}-s{s}" for rc in ("bf16", "quartet2") for s in (0, 1, 2)]
  assert [r.config.seed for r in runs] == [0, 1, 2, 0, 1, 2]
  unseeded = {r.name: r.config for r in sweep.plan(BASE, ["1M"], [10], ["bf16", "quartet2"])}
  for r in runs:  # the same cell as the unseeded plan's, but for the seed
    assert dataclasses.replace(r.config, seed=BASE.seed) == unseeded[r.name.rsplit("-s", 1)[0]]
  for bad in ([], [1, 1]):
    with pytest.raises(ValueError, match="seeds: expected distinct seeds"):
      sweep.plan(BASE, ["1M"], [10], ["bf16"], seeds=bad)
  args = sweep.build_parser().parse_args(["--out", "o", "--sizes", "1M", "--ratios", "10", "--recipes", "bf16"])
  assert args.seeds is None
  assert sweep.build_parser().parse_args(["--out", "o", "--sizes", "1M", "--ratios", "10", "--recipes", "bf16",
                                          "--seeds", "3", "4"]).seeds == [3, 4]  # fmt: skip


def test_config_survives_the_command_line():
  config = train.TrainConfig(model="3M", recipe="quartet2", tokens=123456, lr=1.5e-3, bf16_last=1, data="linux")
  parser = argparse.ArgumentParser()
  train.add_config_arguments(parser)
  assert train.config_from_args(parser.parse_args(train.config_to_args(config))) == config


FAKE_TRAINER = """
import json, os, pathlib, sys
folder = pathlib.Path(sys.argv[1])
(folder / "config.json").write_text("{}")
(folder / "launches.txt").open("a").write(os.environ.get("CUDA_VISIBLE_DEVICES", "none") + "\\n")
if folder.name.endswith("bf16"):
    (folder / "summary.json").write_text(json.dumps({"val_loss": 1.0}))
"""


def _fake_command(run, folder, minutes, cache_dir):
  return [sys.executable, "-c", FAKE_TRAINER, str(folder)]


def test_execute_skips_finished_resumes_partial_and_spreads_over_devices(tmp_path):
  runs = sweep.plan(BASE, ["100K"], [10], ["bf16", "quartet2", "nvidia_nvfp4"])
  (tmp_path / "100K-r10-quartet2").mkdir()
  (tmp_path / "100K-r10-quartet2" / "summary.json").write_text("{}")
  states = sweep.execute(runs, tmp_path, max_minutes=5, devices=["0", "1"], command=_fake_command)
  assert states == {"100K-r10-bf16": "finished", "100K-r10-quartet2": "finished", "100K-r10-nvidia_nvfp4": "partial"}
  assert not (tmp_path / "100K-r10-quartet2" / "launches.txt").exists()
  used = {(tmp_path / n / "launches.txt").read_text() for n in ("100K-r10-bf16", "100K-r10-nvidia_nvfp4")}
  assert used == {"0\n", "1\n"}

  states = sweep.execute(runs, tmp_path, max_minutes=5, command=_fake_command)  # second piece: only the partial run
  assert (tmp_path / "100K-r10-nvidia_nvfp4" / "launches.txt").read_text().splitlines() == ["1", "none"]
  assert (tmp_path / "100K-r10-bf16" / "launches.txt").read_text() == "0\n"


FAKE_TRAINER_WITH_RECORDS = (
  FAKE_TRAINER
  + """
(folder / "metrics.jsonl").write_text(json.dumps({"kind": "val", "step": 1, "tokens": 9, "val_loss": 1.0}) + "\\n")
if folder.name.endswith("bf16"):
    (folder / "final_eval.json").write_text(json.dumps({"name": folder.name, "batch_losses": [1.0]}))
"""
)


def test_results_are_rewritten_as_each_run_ends(tmp_path):
  """The results files follow the runs: after the first process ends they hold its run (if finished), so a piece
  killed from outside (a device's time limit) keeps what finished before."""
  runs = sweep.plan(BASE, ["100K"], [10, 20], ["bf16", "quartet2"])  # the fake finishes the bf16 runs only
  results, evals, seen = tmp_path / "out" / "results.jsonl", tmp_path / "evals.jsonl", []

  def on_exit():
    sweep.write_results(tmp_path / "sweep", runs, results, evals)
    seen.append([json.loads(line)["name"] for line in results.read_text().splitlines()])

  command = lambda run, folder, minutes, cache: [sys.executable, "-c", FAKE_TRAINER_WITH_RECORDS, str(folder)]  # noqa: E731
  sweep.execute(runs, tmp_path / "sweep", max_minutes=5, command=command, on_exit=on_exit)
  assert len(seen) == 4  # one rewrite per ended process, one process at a time (no --devices)
  finished = ["100K-r10-bf16", "100K-r20-bf16"]
  assert seen[-1] == finished and all(set(names) <= set(finished) for names in seen)
  assert [len(names) for names in seen] == sorted(len(names) for names in seen) and seen[0] != finished
  assert [json.loads(line)["name"] for line in evals.read_text().splitlines()] == finished
  assert sweep.write_results(tmp_path / "sweep", runs, None, None) == (0, 0)


def test_nothing_launches_without_budget(tmp_path):
  runs = sweep.plan(BASE, ["100K"], [10], ["bf16"])
  states = sweep.execute(runs, tmp_path, max_minutes=0.5, command=_fake_command)
  assert states == {"100K-r10-bf16": "new"}


def test_collect_reads_finished_runs(tmp_path):
  runs = sweep.plan(BASE, ["100K"], [10], ["bf16", "quartet2"])
  folder = tmp_path / runs[0].name
  folder.mkdir()
  (folder / "summary.json").write_text(json.dumps({"val_loss": 2.5, "tokens": 100}))
  (folder / "metrics.jsonl").write_text(json.dumps({"kind": "val", "step": 0, "tokens": 0, "val_loss": 5.5}) + "\n")
  assert sweep.collect(tmp_path, runs) == [
    {"name": runs[0].name, "val_loss": 2.5, "tokens": 100, "val_curve": [[0, 5.5]]}
  ]


def test_biggest_runs_start_first_and_share_a_device(tmp_path, monkeypatch):
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  runs = sweep.plan(BASE, ["100K", "1M"], [10], ["bf16", "quartet2"])
  order = []

  def command(run, folder, minutes, cache_dir):
    order.append(run.name)
    return [
      sys.executable,
      "-c",
      "import os, sys; open(sys.argv[1] + '/env.txt', 'w').write("
      "os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'] + ' ' + "
      "os.environ['JAX_COMPILATION_CACHE_DIR'])",
      str(folder),
    ]

  sweep.execute(runs, tmp_path, max_minutes=5, devices=["3", "5"], command=command, runs_per_device=2)
  assert order == ["1M-r10-bf16", "1M-r10-quartet2", "100K-r10-bf16", "100K-r10-quartet2"]
  env = {r.name: (tmp_path / r.name / "env.txt").read_text() for r in runs}
  cache = tmp_path / sweep.COMPILE_CACHE  # one compilation cache for the sweep's runs
  # every GPU busy before any shares
  assert env["1M-r10-bf16"] == f"3 0.45 {cache}" and env["1M-r10-quartet2"] == f"5 0.45 {cache}"
  assert set(env.values()) == {f"3 0.45 {cache}", f"5 0.45 {cache}"}
  with pytest.raises(ValueError, match="runs_per_device"):
    sweep.execute(runs, tmp_path, max_minutes=5, command=command, runs_per_device=0)


@pytest.mark.parametrize(
  "overrides",
  [
    {
      "remat": True,
      "scan_unroll": 6,
      "threefry_kernel": False,
      "recompute": "norms",
      "quantizer_backend": "pallas",
      "prequantize_weights": True,
    },
    {
      "remat": False,
      "scan_unroll": 1,
      "threefry_kernel": True,
      "recompute": "norms_swiglu",
      "quantizer_backend": "xla",
      "prequantize_weights": False,
    },
    {
      "remat": False,
      "scan_unroll": "auto",
      "threefry_kernel": "auto",
      "recompute": "none",
      "quantizer_backend": "auto",
      "prequantize_weights": True,
    },
  ],
)
def test_execution_flags_reach_the_training_command(tmp_path, overrides):
  """The sweep's --remat/--scan-unroll/--threefry-kernel/--recompute/--quantizer-backend/--prequantize-weights reach
  each run's `experiments.train` command intact."""
  run = sweep.plan(BASE, ["100K"], [10], ["bf16"])[0]
  command = sweep.train_command(run, tmp_path, 3.0, None, execution=overrides, final_eval_batches=32)
  parser = argparse.ArgumentParser()
  train.add_config_arguments(parser)
  train.add_execution_arguments(parser)
  for flag in ("--out", "--max-minutes", "--final-eval-batches"):
    parser.add_argument(flag)
  args = parser.parse_args(command[3:])
  assert train.execution_overrides(args) == overrides
  assert train.config_from_args(args) == run.config
  assert args.final_eval_batches == "32"
  assert "--final-eval-batches" not in sweep.train_command(run, tmp_path, 3.0, None)


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_scan_unroll_flag_takes_auto_or_a_positive_int(bad, capsys):
  parser = argparse.ArgumentParser()
  train.add_execution_arguments(parser)
  assert parser.parse_args([]).scan_unroll == "auto" and parser.parse_args(["--scan-unroll", "4"]).scan_unroll == 4
  with pytest.raises(SystemExit):
    parser.parse_args(["--scan-unroll", bad])
  assert "expected 'auto' or a positive integer" in capsys.readouterr().err


def test_evaluations_are_collected_from_the_runs_that_wrote_one(tmp_path):
  runs = sweep.plan(BASE, ["100K"], [10], ["bf16", "nvidia_nvfp4"])
  record = {
    "name": runs[0].name,
    "model": "100K",
    "recipe": "bf16",
    "tokens": 1,
    "step": 2,
    "steps": 2,
    "batch_losses": [1.0, 2.0],
  }
  (tmp_path / runs[0].name).mkdir()
  (tmp_path / runs[0].name / train.FINAL_EVAL).write_text(json.dumps(record) + "\n")
  (tmp_path / runs[1].name).mkdir()  # unfinished: no evaluation
  assert sweep.collect_evaluations(tmp_path, runs) == [record]


def test_gpus_per_run_groups_devices_and_meshes_the_run(tmp_path):
  assert sweep.device_groups(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
  with pytest.raises(ValueError, match="gpus_per_run"):
    sweep.device_groups(["0", "1", "2"], 2)
  run = sweep.plan(BASE, ["100K"], [10], ["bf16"])[0]
  command = sweep.train_command(run, tmp_path, 3.0, None, mesh="data=2")
  assert command[-2:] == ["--mesh", "data=2"]
  assert "--mesh" not in sweep.train_command(run, tmp_path, 3.0, None)
  with pytest.raises(SystemExit):
    sweep.main(
      [
        "--out",
        str(tmp_path),
        "--sizes",
        "100K",
        "--ratios",
        "1",
        "--recipes",
        "bf16",
        "--devices",
        "0,1,2",
        "--gpus-per-run",
        "2",
      ]
    )


def test_gaps_pair_each_recipe_with_bf16_over_the_same_batches():
  from fp4jax_experiments import evaluate

  def record(recipe, losses, model="1M"):
    return {
      "name": recipe,
      "model": model,
      "recipe": recipe,
      "tokens": 100,
      "step": 5,
      "steps": 5,
      "batch_losses": losses,
    }

  rows = evaluate.gaps(
    [record("bf16", [2.0, 3.0, 4.0]), record("quartet2", [2.1, 3.3, 4.2]), record("quartet", [5.0, 5.0], model="3M")]
  )
  assert [r["recipe"] for r in rows] == ["quartet2"]  # no bf16 partner for 3M
  d = np.array([0.1, 0.3, 0.2])
  np.testing.assert_allclose(rows[0]["gap"], d.mean())
  np.testing.assert_allclose(rows[0]["ci95"], 4.302653 * d.std(ddof=1) / np.sqrt(3))  # t(2) 97.5% from tables
  unfinished = record("quartet2", [2.1, 3.3, 4.2]) | {"step": 3}
  table = evaluate.gaps_markdown([record("bf16", [2.0, 3.0, 4.0]), unfinished])
  assert f"| 1M | 0.0M | quartet2 | 3.2000 | +{d.mean():.4f} ± {rows[0]['ci95']:.4f} | 3/5 (unfinished) |" in table
  with pytest.raises(ValueError, match="same validation batches"):
    evaluate.gaps([record("bf16", [2.0, 3.0, 4.0]), record("nvidia_nvfp4", [1.0, 1.0])])
  # another baseline: two FP4 recipes compared directly, paired over the same batches
  records = [
    record("bf16", [2.0, 3.0, 4.0]),
    record("quartet2", [2.1, 3.3, 4.2]),
    record("nvidia_nvfp4", [2.2, 3.2, 4.6]),
  ]
  rows = {r["recipe"]: r for r in evaluate.gaps(records, baseline="nvidia_nvfp4")}
  assert set(rows) == {"bf16", "quartet2"}
  np.testing.assert_allclose(rows["quartet2"]["gap"], np.mean([-0.1, 0.1, -0.4]))
  np.testing.assert_allclose(rows["quartet2"]["baseline_loss"], np.mean([2.2, 3.2, 4.6]))
  assert "gap to nvidia_nvfp4 (95% CI)" in evaluate.gaps_markdown(records, "nvidia_nvfp4")


def test_seeded_gaps_pair_each_seed_with_its_own_baseline_and_average_over_seeds():
  from fp4jax_experiments import evaluate

  def record(recipe, seed, losses):
    name = f"1M-r10-{recipe}-s{seed}"
    return {"name": name, "model": "1M", "recipe": recipe, "tokens": 100, "seed": seed, "step": 5, "steps": 5,
            "batch_losses": losses}  # fmt: skip

  bf16 = {0: [2.0, 3.0], 1: [2.5, 3.5], 2: [1.0, 2.0]}
  # quartet2's per-seed gaps to the bf16 run of the same seed: 0.1, 0.3, 0.2 (hand-built);
  # against another seed's bf16 run they would be 0.6 or -0.9
  q2 = {0: [2.1, 3.1], 1: [2.8, 3.8], 2: [1.2, 2.2]}
  records = [record("bf16", s, v) for s, v in bf16.items()] + [record("quartet2", s, v) for s, v in q2.items()]
  (row,) = evaluate.seeded_gaps(records)
  assert (row["recipe"], row["seeds"]) == ("quartet2", [0, 1, 2])
  np.testing.assert_allclose([r["gap"] for r in row["per_seed"]], [0.1, 0.3, 0.2])
  np.testing.assert_allclose(row["gap"], 0.2)
  np.testing.assert_allclose(row["ci95"], 4.302653 * 0.1 / np.sqrt(3))  # t(2) 97.5% from tables; sd of 0.1, 0.3, 0.2
  table = evaluate.gaps_markdown(records)
  assert "| 1M | 0.0M | quartet2 | 3 | +0.2000 ± 0.2484 | s0: +0.1000 ± 0.0000, s1: +0.3000 ± 0.0000," in table
  (one,) = evaluate.seeded_gaps(records[:1] + records[3:4])  # one seed: no interval over seeds
  assert one["ci95"] is None and "(one seed)" in evaluate.seeded_gaps_markdown(records[:1] + records[3:4])
  old = [{k: v for k, v in r.items() if k != "seed"} for r in (records[0], records[3])]  # records without a seed
  assert [r["seed"] for r in evaluate.gaps(old)] == [0]


def test_causal_amax_runs_are_their_own_recipe_in_names_and_records():
  """A per-token-amax run is named and recorded as ``<recipe>:causal`` (fp4jax.recipes.causal's name), so that it
  is neither the per-tensor run's folder nor counted as one of its seeds; two records of one run are refused."""
  from fp4jax_experiments import evaluate

  causal = dataclasses.replace(BASE, causal_amax=True)
  runs = sweep.plan(causal, ["1M"], [10], ["nvidia_nvfp4"], seeds=[0, 1])
  assert [r.name for r in runs] == ["1M-r10-nvidia_nvfp4:causal-s0", "1M-r10-nvidia_nvfp4:causal-s1"]
  assert [r.config.recipe for r in runs] == ["nvidia_nvfp4"] * 2 and all(r.config.causal_amax for r in runs)
  assert sweep.plan(BASE, ["1M"], [10], ["nvidia_nvfp4"])[0].name == "1M-r10-nvidia_nvfp4"
  record = train.evaluation_record("run", runs[1].config, 5, [2.0, 3.0])
  assert (record["recipe"], record["seed"]) == ("nvidia_nvfp4:causal", 1)
  assert train.evaluation_record("run", BASE, 5, [2.0])["recipe"] == BASE.recipe
  rec = lambda name, recipe: {"name": name, "model": "1M", "recipe": recipe, "tokens": 9, "seed": 0, "step": 5,
                              "steps": 5, "batch_losses": [2.0, 3.0]}  # fmt: skip
  rows = evaluate.gaps([rec("a", "bf16"), rec("b", "nvidia_nvfp4"), rec("c", "nvidia_nvfp4:causal")])
  assert [r["recipe"] for r in rows] == ["nvidia_nvfp4", "nvidia_nvfp4:causal"]
  with pytest.raises(ValueError, match="records 'b' and 'c' are both nvidia_nvfp4 at 1M, 9 tokens, seed 0"):
    evaluate.gaps([rec("a", "bf16"), rec("b", "nvidia_nvfp4"), rec("c", "nvidia_nvfp4")])


def test_orderings_compare_every_two_recipes_over_their_seeds(tmp_path, capsys):
  """Hand-built per-seed differences: b − a = 0.1, 0.3, 0.2 (mean 0.2, sd 0.1: t(2)·0.1/√3 = 0.2484 > 0.2, so a is
  ahead in every seed but the order does not hold), c − a = 0.5, 0.6, 0.7 and c − b = 0.4, 0.3, 0.5 (both hold);
  a recipe of one seed is in no pair."""
  from fp4jax_experiments import evaluate

  a = {0: [2.0, 3.0], 1: [2.5, 3.5], 2: [1.0, 2.0]}
  shift = {"a": (0.0, 0.0, 0.0), "b": (0.1, 0.3, 0.2), "c": (0.5, 0.6, 0.7)}
  head = {"model": "1M", "tokens": 100, "step": 5, "steps": 5}
  records = [
    head | {"name": f"{r}-s{s}", "recipe": r, "seed": s, "batch_losses": [v + shift[r][s] for v in a[s]]}
    for r in shift
    for s in a
  ]
  records.append({**records[0], "name": "d-s0", "recipe": "d"})
  rows = evaluate.orderings(records)
  assert [(r["ahead"], r["behind"], r["holds"], r["ahead_in"]) for r in rows] == [
    ("a", "c", True, 3),
    ("b", "c", True, 3),
    ("a", "b", False, 3),
  ]
  np.testing.assert_allclose([r["gap"] for r in rows], [-0.6, -0.4, -0.2])
  np.testing.assert_allclose([r["ci95"] for r in rows], 4.302653 * 0.1 / np.sqrt(3))  # t(2) 97.5% from tables
  table = evaluate.orderings_markdown(records)
  assert "| 1M | 0.0M | a | c | -0.6000 ± 0.2484 | 3 of 3 | yes |" in table
  assert "| 1M | 0.0M | a | b | -0.2000 ± 0.2484 | 3 of 3 | no |" in table
  path = tmp_path / "eval.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  evaluate.main(["--table", str(path), "--orderings"])
  assert capsys.readouterr().out == table
  with pytest.raises(SystemExit):
    evaluate.main(["--orderings"])
  assert "--orderings reads a --table FILE" in capsys.readouterr().err


def test_curve_gaps_pair_each_seed_along_training(tmp_path, capsys):
  """Hand-built curves evaluated at 0, 25, 50, 75 and 100 of 100 tokens. At 0.3 of the budget the first common
  evaluation is at 50 tokens: the per-seed differences there are -0.1, -0.3, -0.2 (mean -0.2, t(2)·0.1/√3 = 0.2484);
  at the end 0.05, 0.05, 0.05 (sd 0: interval 0). A recipe with no baseline seed is left out; a fraction outside
  (0, 1] and a repeated run are refused."""
  from fp4jax_experiments import evaluate

  steps = [0, 25, 50, 75, 100]
  base = {0: [5.0, 3.0, 2.0, 1.5, 1.0], 1: [5.0, 3.2, 2.2, 1.6, 1.1], 2: [5.0, 2.9, 2.1, 1.4, 0.9]}
  delta = {0: [0.0, 0.5, -0.1, 0.0, 0.05], 1: [0.0, 0.5, -0.3, 0.0, 0.05], 2: [0.0, 0.5, -0.2, 0.0, 0.05]}

  def result(recipe, seed, losses):
    curve = [list(p) for p in zip(steps, losses)]
    return {"model": "1M", "tokens": 100, "recipe": recipe, "seed": seed, "val_curve": curve}

  results = [result("bf16", s, v) for s, v in base.items()]
  results += [result("ms_fp4", s, [b + d for b, d in zip(base[s], delta[s])]) for s in base]
  results.append({**result("quartet", 7, base[0]), "seed": 7})  # its seed has no bf16 run
  rows = evaluate.curve_gaps(results, "bf16", [0.3, 1.0])
  assert [(r["recipe"], r["fraction"], r["at"], r["seeds"]) for r in rows] == [
    ("ms_fp4", 0.3, 50, [0, 1, 2]),
    ("ms_fp4", 1.0, 100, [0, 1, 2]),
  ]
  np.testing.assert_allclose(rows[0]["per_seed"], [-0.1, -0.3, -0.2], atol=1e-12)
  np.testing.assert_allclose([rows[0]["gap"], rows[0]["ci95"]], [-0.2, 4.302653 * 0.1 / np.sqrt(3)], atol=1e-6)
  np.testing.assert_allclose([rows[1]["gap"], rows[1]["ci95"]], [0.05, 0.0], atol=1e-9)
  path = tmp_path / "results.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in results))
  evaluate.main(["--curves", str(path), "--at", "0.3"])
  assert "| 1M | 0.0M | ms_fp4 | 0.0M (0.3) | -0.2000 ± 0.2484 | s0: -0.1000, s1: -0.3000, s2: -0.2000 |" in (
    capsys.readouterr().out
  )
  with pytest.raises(ValueError, match=r"fractions: 0 must be in \(0, 1\]"):
    evaluate.curve_gaps(results, "bf16", [0])
  with pytest.raises(ValueError, match="two records of model 1M, 100 tokens, recipe bf16, seed 0"):
    evaluate.curve_gaps(results + results[:1], "bf16", [1.0])
  with pytest.raises(SystemExit):
    evaluate.main(["--curves", str(path), "--at", "1.5"])
  assert "fractions: 1.5 must be in (0, 1]" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    evaluate.main(["--curves", str(tmp_path / "none.jsonl")])
  assert "none.jsonl: no such file (expected a sweep's --results JSONL)" in capsys.readouterr().err
  evals = tmp_path / "eval.jsonl"  # an evaluation file (batch_losses, no val_curve) given by mistake
  evals.write_text(json.dumps({"name": "a-s0", "model": "1M", "tokens": 9, "recipe": "bf16", "batch_losses": [1.0]}))
  with pytest.raises(SystemExit):
    evaluate.main(["--curves", str(evals)])
  assert "records ['a-s0'] lack model, tokens, recipe or val_curve" in capsys.readouterr().err
