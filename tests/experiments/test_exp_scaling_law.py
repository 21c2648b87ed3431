"""Scaling-law fits recover known parameters from synthetic runs; report and plots are written."""

import dataclasses
import json

import numpy as np
import pytest

from fp4jax_experiments import plots
from fp4jax_experiments import scaling_law as sl

TRUE = sl.QUARTET_C4_BF16
EFF = (0.65, 0.82)
SIZES = {"30M": 30e6, "50M": 50e6, "100M": 100e6, "200M": 200e6}
RATIOS = (25, 100, 400)


def _grid():
  n, r = np.meshgrid(list(SIZES.values()), RATIOS)
  return n.ravel(), (n * r).ravel()


def _results(noise: float, seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  rows = []
  for name, n in SIZES.items():
    for ratio in RATIOS:
      for recipe, eff in (("bf16", (1.0, 1.0)), ("quartet", EFF)):
        loss = float(TRUE(n, n * ratio, *eff)) * float(np.exp(rng.normal(0, noise)))
        rows.append({"model": name, "recipe": recipe, "non_embedding_params": n, "tokens": n * ratio, "val_loss": loss})
  return rows


def test_noise_free_fit_recovers_the_law_and_the_efficiencies():
  n, d = _grid()
  fit = sl.fit_law(n, d, TRUE(n, d))
  for name in sl.PARAMS:
    assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=2e-3), name
  eff = sl.fit_efficiency(fit, n, d, TRUE(n, d, *EFF))
  assert eff == pytest.approx(EFF, rel=1e-3)


# slow tier; default representative: test_noise_free_fit_recovers_the_law_and_the_efficiencies (fit_efficiency)
@pytest.mark.slow
def test_tied_efficiency_is_recovered_from_one_ratio_per_size():
  """One D/N ratio: the tied eff comes out within a narrow interval that covers the truth."""
  n = np.array(list(SIZES.values()))
  d = 25 * n
  exponents = {"alpha": TRUE.alpha, "beta": TRUE.beta, "gamma": TRUE.gamma}
  assert sl.fit_efficiency(TRUE, n, d, TRUE(n, d, 0.7, 0.7), tied=True) == pytest.approx((0.7, 0.7), rel=1e-3)
  rng = np.random.default_rng(1)
  rows = [
    {
      "model": name,
      "recipe": recipe,
      "non_embedding_params": size,
      "tokens": 25 * size,
      "val_loss": float(TRUE(size, 25 * size, eff, eff)) * float(np.exp(rng.normal(0, 0.002))),
    }
    for name, size in SIZES.items()
    for recipe, eff in (("bf16", 1.0), ("quartet", 0.7))
  ]
  report = sl.analyze(rows, fixed=exponents, samples=16, seed=0)["recipes"]["quartet"]
  low, high = report["eff_ci"]
  assert low < 0.7 < high and high - low < 0.25, report
  assert report["eff_bootstrap_finite"] == 1.0


def test_chinchilla_form_is_gamma_one_and_fixed_parameters_stay():
  n, d = _grid()
  chinchilla = sl.LossLaw(A=400.0, alpha=0.34, B=410.0, beta=0.28, E=1.69)
  fit = sl.fit_law(n, d, chinchilla(n, d), fixed={"gamma": 1.0})
  assert fit.gamma == 1.0
  assert [fit.alpha, fit.beta, fit.E] == pytest.approx([0.34, 0.28, 1.69], rel=1e-2)
  with pytest.raises(ValueError, match="fixed"):
    sl.fit_law(n, d, chinchilla(n, d), fixed={"delta": 1.0})


# slow tier; default representative: test_noise_free_fit_recovers_the_law_and_the_efficiencies (the fits it repeats)
@pytest.mark.slow
def test_bootstrap_intervals_cover_the_truth_under_noise_and_report_is_written(tmp_path):
  results = _results(noise=0.002)
  exponents = {"alpha": TRUE.alpha, "beta": TRUE.beta, "gamma": TRUE.gamma}  # the free fit is tested above
  report = sl.analyze(results, fixed=exponents, samples=12, seed=0)
  quartet = report["recipes"]["quartet"]
  assert quartet["bootstrap_finite"] == 1.0  # a well-posed grid: every refit converges
  for key, true in zip(("eff_N", "eff_D"), EFF):
    low, high = quartet[f"{key}_ci"]
    assert low < true < high and low < quartet[key] < high, (key, quartet)
    assert high - low < 0.5
  law = sl.LossLaw(**report["quartet"])
  n, d = _grid()
  assert np.max(np.abs(law(n, d) / TRUE(n, d) - 1)) < 0.01
  gaps = sl.gaps_to_bf16(results)
  assert len(gaps) == len(SIZES) * len(RATIOS) and all(g["gap"] > 0 for g in gaps)
  table = sl.markdown(report, gaps)
  assert "| quartet | 12 |" in table and "eff = eff_N = eff_D" in table
  assert EFF[0] < quartet["eff"] < EFF[1]  # the tied eff lies between the two it stands for
  for path in (
    plots.loss_vs_compute(results, law, report["recipes"], tmp_path / "lc.png"),
    plots.efficiency_bars(report["recipes"], tmp_path / "eff.png"),
  ):
    assert path.stat().st_size > 10_000


def test_fit_needs_bf16_runs_and_valid_inputs():
  with pytest.raises(ValueError, match="bf16"):
    sl.analyze([dataclasses.asdict(TRUE) | {"recipe": "quartet"}])
  with pytest.raises(ValueError, match="positive"):
    sl.fit_law([1.0, -1.0], [1.0, 1.0], [1.0, 1.0])


# slow tier; default representative: an end-to-end run of the command; its fits:
# test_noise_free_fit_recovers_the_law_and_the_efficiencies
@pytest.mark.slow
def test_main_writes_the_fit_and_every_plot(tmp_path, capsys):
  """The command on a sweep's JSONL (records with their validation curves): fit, table and three plots."""
  rows = [
    {**r, "val_curve": [[0, 5.5], [r["tokens"] / 2, r["val_loss"] + 0.1], [r["tokens"], r["val_loss"]]]}
    for r in _results(noise=0.002)
  ]
  results = tmp_path / "runs.jsonl"
  results.write_text("".join(json.dumps(r) + "\n" for r in rows))
  sl.main([str(results), "--out", str(tmp_path / "fit"), "--fix-exponents", "--bootstrap", "4"])
  for name in ("fit.json", "fit.md", "loss_vs_compute.png", "efficiency.png", "val_curves.png"):
    assert (tmp_path / "fit" / name).stat().st_size > 500, name
  # --sizes fits a subset: the small sizes' runs leave the report; an unknown size is refused by name
  sl.main(
    [str(results), "--out", str(tmp_path / "large"), "--fix-exponents", "--bootstrap", "4", "--sizes", "100M", "200M"]
  )
  table = (tmp_path / "large" / "fit.md").read_text()
  assert "| 100M |" in table and "| 200M |" in table and "| 30M |" not in table
  with pytest.raises(SystemExit):
    sl.main([str(results), "--out", str(tmp_path / "none"), "--sizes", "5M"])
  assert "--sizes: no runs of ['5M']" in capsys.readouterr().err


def test_bootstrap_resamples_runs_or_on_a_seeded_grid_the_seeds_within_each_cell():
  """One run per (N, D) cell: every resample draws the group's runs with replacement (the sequence of multinomial
  draws of one generator, as before seeds); two seeds per cell: each cell's two runs are redrawn within the cell,
  so every resample keeps each cell's total weight 2."""
  n = np.array([1e6, 1e6, 3e6, 3e6])
  d = np.array([1e7, 2e7, 1e7, 2e7])
  w_base, w_rec = sl._resampling_weights(5, [(n, d), (n[:3], d[:3])], samples=50)
  rng = np.random.default_rng(5)  # the oracle: whole-group draws in group order
  np.testing.assert_array_equal(w_base, rng.multinomial(4, np.ones(4) / 4, 50))
  np.testing.assert_array_equal(w_rec, rng.multinomial(3, np.ones(3) / 3, 50))
  seeded_n, seeded_d = np.repeat(n, 2), np.repeat(d, 2)  # cells (run 2i, run 2i + 1)
  (w,) = sl._resampling_weights(5, [(seeded_n, seeded_d)], samples=200)
  np.testing.assert_array_equal(np.asarray(w).reshape(200, 4, 2).sum(-1), 2.0)
  assert {0.0, 1.0, 2.0} <= set(np.unique(np.asarray(w)))  # both runs of a cell, or one twice
  mixed = sl._resampling_weights(5, [(np.append(seeded_n, 5e6), np.append(seeded_d, 1e7))], samples=20)[0]
  np.testing.assert_array_equal(np.asarray(mixed)[:, -1], 1.0)  # a cell of one run keeps its weight


def test_gaps_pair_each_seed_with_the_bf16_run_of_its_seed():
  row = lambda recipe, seed, loss: {"model": "1M", "tokens": 10, "recipe": recipe, "seed": seed, "val_loss": loss}
  results = [row("bf16", 0, 2.0), row("bf16", 1, 3.0), row("quartet", 0, 2.5), row("quartet", 1, 3.1)]
  assert [(g["seed"], g["gap"]) for g in sl.gaps_to_bf16(results)] == [(0, 0.5), (1, pytest.approx(0.1))]
  report = {form: dataclasses.asdict(TRUE) for form in ("quartet", "chinchilla")} | {"recipes": {}}
  assert "| 1M | 10 | quartet (seed 1) | 3.1000 | +0.1000 |" in sl.markdown(report, sl.gaps_to_bf16(results))
  assert "| 1M | 10 | quartet | 2.5000 | +0.5000 |" in sl.markdown(report, sl.gaps_to_bf16(results[::2]))


def _seeded_results(recipes: dict[str, float], seed_effect: float = 0.01) -> list[dict]:
  """Three sizes x two ratios x three seeds from ``TRUE`` at each recipe's tied eff; a seed scales every recipe's
  loss of its cell by the same factor (its initialization and data order), plus 0.1% noise of each run's own."""
  rng = np.random.default_rng(3)
  cells = [(name, n, ratio) for name, n in list(SIZES.items())[:3] for ratio in (25, 100)]
  shared = {(name, ratio, s): float(np.exp(rng.normal(0, seed_effect))) for name, _, ratio in cells for s in range(3)}
  rows = []
  for recipe, eff in recipes.items():
    for name, n, ratio in cells:
      for s in range(3):
        loss = float(TRUE(n, n * ratio, eff, eff)) * shared[name, ratio, s] * float(np.exp(rng.normal(0, 0.001)))
        rows.append(
          {"name": f"{name}-r{ratio}-{recipe}-s{s}", "model": name, "recipe": recipe, "seed": s, "step": 10}
          | {"non_embedding_params": n, "tokens": n * ratio, "val_loss": loss}
        )
  return rows


def test_recipes_are_compared_by_a_paired_bootstrap_over_the_same_seeds():
  """A recipe whose runs are another's (file order reversed) has the ratio 1 in every resample, which only a
  resample pairing the same seeds of both can give; a recipe at 0.6 against 0.8 is told apart near 0.75; one
  whose runs are not the others' seeds is compared with none."""
  results = _seeded_results({"bf16": 1.0, "a": 0.8, "c": 0.6})
  results += [{**r, "recipe": "b"} for r in results if r["recipe"] == "a"][::-1]
  d = [{**r, "recipe": "d"} for r in results if r["recipe"] == "c"]
  results += [{**d[0], "seed": 7}] + d[1:]  # as many runs as c, one of them another seed
  exponents = {"alpha": TRUE.alpha, "beta": TRUE.beta, "gamma": TRUE.gamma}
  base = sl.runs_of(results, "bf16")
  thetas = sl.base_refits(base, sl.fit_law(*base, fixed=exponents), exponents, samples=24, seed=0)
  effs = {"a": 0.8, "b": 0.8, "c": 0.6, "d": 0.6}
  comparisons = {(c["recipe"], c["against"]): c for c in sl.compare(results, thetas, effs, seed=0)}
  assert set(comparisons) == {("b", "a"), ("c", "a"), ("c", "b")}  # d's runs are not a's, b's or c's
  same = comparisons["b", "a"]
  assert same["ratio_ci"] == (1.0, 1.0) and same["runs"] == 18 and same["finite_fraction"] == 1.0
  low, high = comparisons["c", "a"]["ratio_ci"]
  assert 0.70 < low < 0.75 < high < 0.80 and sl.excludes_one((low, high))
  assert not sl.excludes_one(same["ratio_ci"]) and not sl.excludes_one((float("nan"), float("nan")))
  report = {form: dataclasses.asdict(TRUE) for form in ("quartet", "chinchilla")} | {"recipes": {}}
  table = sl.markdown(report | {"comparisons": list(comparisons.values())}, [])
  assert "| b | a | 18 | 1 (1–1) | 100% | no |" in table
  assert f"| c | a | 18 | 0.75 ({low:.3g}–{high:.3g}) | 100% | yes |" in table
  with pytest.raises(ValueError, match="two a runs with N = 3e"):
    sl.compare(results + [r for r in results if r["recipe"] == "a"][:1], thetas, effs)


def test_evaluations_replace_each_runs_loss_by_the_mean_of_its_batches(tmp_path, capsys):
  rows = [
    {"name": "1M-bf16", "step": 4, "recipe": "bf16", "val_loss": 2.0},
    {"name": "1M-quartet", "step": 4, "recipe": "quartet", "val_loss": 2.5},
  ]
  evaluations = [
    {"name": "1M-quartet", "step": 4, "batch_losses": [2.25, 2.75, 2.0]},
    {"name": "1M-bf16", "step": 4, "batch_losses": [1.5, 2.5]},
  ]
  assert [r["val_loss"] for r in sl.with_evaluations(rows, evaluations)] == [2.0, pytest.approx(7 / 3)]
  with pytest.raises(ValueError, match=r"no record at the run's final step for \['1M-quartet'\]"):
    sl.with_evaluations(rows, [evaluations[1], {**evaluations[0], "step": 3}])
  with pytest.raises(ValueError, match="two records of run '1M-bf16'"):
    sl.with_evaluations(rows, evaluations + evaluations[1:])
  results, evals = tmp_path / "runs.jsonl", tmp_path / "eval.jsonl"
  results.write_text("".join(json.dumps(r) + "\n" for r in rows))
  evals.write_text(json.dumps(evaluations[1]) + "\n")
  with pytest.raises(SystemExit):
    sl.main([str(results), "--out", str(tmp_path / "fit"), "--eval-results", str(evals)])
  assert "--eval-results: evaluations: no record at the run's final step for ['1M-quartet']" in capsys.readouterr().err
