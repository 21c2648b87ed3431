"""Loss scaling laws for low-precision training: fit, efficiencies per recipe, bootstrap intervals, report.

Quartet form (arXiv 2505.14669), N parameters, D training tokens:
  L(N, D) = (A/(N·eff_N)^α + B/(D·eff_D)^β)^γ + E
The Chinchilla form A/N^α + B/D^β + E is the same law with γ = 1 fixed, so both are fitted by one routine.

Fitting (Hoffmann et al.'s procedure with the Quartet δ): minimize Σ_i w_i·Huber_δ(log L̂_i − log L_i), δ = 1e-4,
over θ = (log A, α, log B, β, log E, γ) with L-BFGS (optax) from a grid of starts (vmapped, jitted), keeping the best.
Two stages: the base θ from the BF16 runs (eff_N = eff_D = 1), then per recipe (log eff_N, log eff_D) with θ fixed,
and the tied efficiency eff = eff_N = eff_D: the recipe trains like BF16 with eff·N parameters on eff·D tokens. The
tied one is a single number, set by the size of the loss gaps; eff_N and eff_D apart are told from each other only
through how the gaps change with N and D (α ≠ β), so a small, noisy grid leaves them loose where the tied eff is not.
Any base parameter can be held fixed (e.g. α, β, γ from the published fit when a grid is too small to identify them).
Bootstrap: resample the BF16 runs and the recipe's runs with replacement (multinomial weights; on a seeded grid, whose
(N, D) cells hold one run per seed, the seeds within each cell), refit both stages from the point estimate (the base
refits once, shared by every recipe), report the 2.5 / 97.5 percentiles.
Recipe against recipe: the ratio of two recipes' tied efficiencies, eff_b / eff_a, with a paired bootstrap: both
recipes are refitted on the same resample of their common (N, D, seed) runs under the same base refit, so what a
seed does to both (its initialization and data order) cancels in the ratio. Two recipes are told apart where that
interval excludes 1; a recipe is told from BF16 where its own eff interval excludes 1.
The loss of a run is its summary's ``val_loss`` (the sweep's in-training evaluation), or with ``--eval-results`` the
mean of its final evaluation's ``batch_losses`` (``fp4jax-evaluate``, the batches the gap tables use).

  fp4jax-scaling-law experiments/results/sweep.jsonl --out experiments/results/fit
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fp4jax_experiments import model as model_lib
from fp4jax_experiments import train

PARAMS = ("A", "alpha", "B", "beta", "E", "gamma")
LOG_PARAMS = ("A", "B", "E")  # fitted as logarithms (positive)
HUBER_DELTA = 1e-4
LBFGS_STEPS = 300
BF16 = "bf16"


@dataclasses.dataclass(frozen=True)
class LossLaw:
  """L(N, D) = (A/(N·eff_N)^α + B/(D·eff_D)^β)^γ + E (γ = 1: Chinchilla)."""

  A: float
  alpha: float
  B: float
  beta: float
  E: float
  gamma: float = 1.0

  def __call__(self, N, D, eff_N=1.0, eff_D=1.0):
    return np.exp(_log_loss(_theta(dataclasses.asdict(self)), np.log(N) + np.log(eff_N), np.log(D) + np.log(eff_D)))


# Published BF16 fit on C4 (FP4-REFERENCE.md §4).
QUARTET_C4_BF16 = LossLaw(A=1.274e5, alpha=0.5785, B=4.658e5, beta=0.5389, E=1.3408, gamma=0.2764)


def _theta(values: dict) -> jnp.ndarray:
  """θ in float32, logs taken in float64 first (an E far below float32's normal range, as a degenerate fit can
  give, must not flush to 0 and log to −inf)."""
  return jnp.asarray([np.log(np.float64(values[p])) if p in LOG_PARAMS else values[p] for p in PARAMS], jnp.float32)


def _law(theta) -> LossLaw:
  theta = np.asarray(theta, np.float64)
  return LossLaw(**{p: float(np.exp(t) if p in LOG_PARAMS else t) for p, t in zip(PARAMS, theta)})


def _log_loss(theta, log_n, log_d):
  """log L with the sum inside computed as logaddexp(log A − α log N, log B − β log D)."""
  log_a, alpha, log_b, beta, log_e, gamma = (theta[i] for i in range(6))
  inner = jnp.logaddexp(log_a - alpha * log_n, log_b - beta * log_d)
  return jnp.logaddexp(gamma * inner, log_e)


def _huber(r, delta=HUBER_DELTA):
  a = jnp.abs(r)
  return jnp.where(a <= delta, 0.5 * r**2, delta * (a - 0.5 * delta))


def _minimize(objective, starts: jnp.ndarray, *args):
  """L-BFGS from each row of ``starts`` (vmapped over starts and the trailing ``args``' leading axes)."""
  solver = optax.lbfgs()

  def run(x0, *args):
    f = lambda x: objective(x, *args)  # noqa: E731
    value_and_grad = optax.value_and_grad_from_state(f)

    def step(carry, _):
      x, state = carry
      value, grad = value_and_grad(x, state=state)
      updates, state = solver.update(grad, state, x, value=value, grad=grad, value_fn=f)
      return (optax.apply_updates(x, updates), state), None

    (x, _), _ = jax.lax.scan(step, (x0, solver.init(x0)), None, length=LBFGS_STEPS)
    return x, f(x)

  return jax.jit(jax.vmap(run))(starts, *args)


def _best(xs, values) -> np.ndarray:
  values = np.where(np.isfinite(values), np.asarray(values), np.inf)
  return np.asarray(xs[int(np.argmin(values))])


def _arrays(N, D, L):
  N, D, L = (np.asarray(v, np.float64) for v in (N, D, L))
  if not (N.shape == D.shape == L.shape and N.ndim == 1 and N.size > 0):
    raise ValueError(f"N, D, L must be 1-D of one length, got shapes {N.shape}, {D.shape}, {L.shape}")
  if (N <= 0).any() or (D <= 0).any() or (L <= 0).any():
    raise ValueError("N, D and L must be positive")
  return (jnp.asarray(np.log(v), jnp.float32) for v in (N, D, L))


def _base_objective(free_mask, fixed_theta):
  def objective(x, log_n, log_d, log_l, weights):
    theta = jnp.where(free_mask, x, fixed_theta)
    return jnp.sum(weights * _huber(_log_loss(theta, log_n, log_d) - log_l))

  return objective


def _base_starts(fixed_theta, free_mask, min_loss: float) -> jnp.ndarray:
  grid = {
    "A": (1e2, 1e5),
    "alpha": (0.3, 0.6),
    "B": (1e2, 1e5),
    "beta": (0.3, 0.6),
    "E": (0.5 * min_loss, 0.9 * min_loss),
    "gamma": (0.3, 1.0),
  }
  free = [p for p, f in zip(PARAMS, free_mask) if f]
  starts = []
  for combo in itertools.product(*(grid[p] for p in free)):
    values = dict(zip(free, combo))
    theta = np.array(fixed_theta)
    for p, v in values.items():
      theta[PARAMS.index(p)] = np.log(v) if p in LOG_PARAMS else v
    starts.append(theta)
  return jnp.asarray(np.stack(starts), jnp.float32)


def _fixed(fixed: dict | None) -> tuple[jnp.ndarray, jnp.ndarray]:
  fixed = dict(fixed or {})
  unknown = set(fixed) - set(PARAMS)
  if unknown:
    raise ValueError(f"fixed: unknown parameters {sorted(unknown)}; choose from {PARAMS}")
  theta = _theta({p: fixed.get(p, 1.0) for p in PARAMS})
  return jnp.array([p not in fixed for p in PARAMS]), theta


def fit_law(N, D, L, fixed: dict | None = None, weights=None) -> LossLaw:
  """Base law from runs (N_i, D_i, L_i); ``fixed`` holds parameters that are not fitted ({"gamma": 1}: Chinchilla)."""
  log_n, log_d, log_l = _arrays(N, D, L)
  free_mask, fixed_theta = _fixed(fixed)
  if int(free_mask.sum()) == 0:
    raise ValueError("fixed: every parameter is fixed; nothing to fit")
  weights = jnp.ones_like(log_l) if weights is None else jnp.asarray(weights, jnp.float32)
  starts = _base_starts(fixed_theta, free_mask, float(np.exp(log_l.min())))
  n = starts.shape[0]
  tile = lambda a: jnp.broadcast_to(a, (n, *a.shape))  # noqa: E731
  xs, values = _minimize(
    _base_objective(free_mask, fixed_theta), starts, tile(log_n), tile(log_d), tile(log_l), tile(weights)
  )
  return _law(jnp.where(free_mask, _best(xs, values), fixed_theta))


def _eff_objective(theta):
  """Huber loss of (log eff_N, log eff_D), or of (log eff,) for the tied efficiency (``log_eff[-1]`` is then
  ``log_eff[0]``)."""

  def objective(log_eff, log_n, log_d, log_l, weights):
    pred = _log_loss(theta, log_n + log_eff[0], log_d + log_eff[-1])
    return jnp.sum(weights * _huber(pred - log_l))

  return objective


def _eff_starts(tied: bool) -> jnp.ndarray:
  return jnp.log(jnp.array(list(itertools.product(*[(1.0, 0.5)] * (1 if tied else 2))), jnp.float32))


def fit_efficiency(law: LossLaw, N, D, L, weights=None, tied: bool = False) -> tuple[float, float]:
  """(eff_N, eff_D) of a recipe's runs under the base ``law``; ``tied``: one eff for both (returned twice)."""
  log_n, log_d, log_l = _arrays(N, D, L)
  weights = jnp.ones_like(log_l) if weights is None else jnp.asarray(weights, jnp.float32)
  starts = _eff_starts(tied)
  tile = lambda a: jnp.broadcast_to(a, (starts.shape[0], *a.shape))  # noqa: E731
  theta = _theta(dataclasses.asdict(law))
  xs, values = _minimize(_eff_objective(theta), starts, tile(log_n), tile(log_d), tile(log_l), tile(weights))
  with np.errstate(over="ignore"):  # an efficiency the runs do not bound runs off to inf, reported as such
    eff = np.exp(_best(xs, values))
  return float(eff[0]), float(eff[-1])


def _cell_weights(rng: np.random.Generator, n: np.ndarray, d: np.ndarray, samples: int) -> np.ndarray:
  """(samples, runs) multinomial weights of one group of runs with sizes ``n`` and tokens ``d``: the runs resampled
  with replacement from the whole group where every (N, D) cell holds one run; otherwise within each cell, which then
  holds one run per seed: the bootstrap over seeds (a cell of one run keeps its weight 1)."""
  cells = np.stack([np.asarray(n), np.asarray(d)], axis=1)
  _, inverse, counts = np.unique(cells, axis=0, return_inverse=True, return_counts=True)
  inverse = inverse.ravel()
  if counts.max() == 1:
    return rng.multinomial(inverse.size, np.ones(inverse.size) / inverse.size, samples)
  weights = np.zeros((samples, inverse.size))
  for cell, k in enumerate(counts):
    weights[:, inverse == cell] = rng.multinomial(k, np.ones(k) / k, samples)
  return weights


def _resampling_weights(seed: int, groups: Sequence[tuple], samples: int) -> list[jnp.ndarray]:
  """Multinomial weights (``samples`` rows) resampling each group of runs (``(N, D)`` arrays) with replacement
  (``_cell_weights``), one stream seeded by ``seed``, groups in order: the base runs first, so the base weights
  (and refits) are every recipe's."""
  rng = np.random.default_rng(seed)
  return [jnp.asarray(_cell_weights(rng, n, d, samples), jnp.float32) for n, d in groups]


def base_refits(base_runs, law: LossLaw, fixed: dict | None = None, samples: int = 200, seed: int = 0) -> jnp.ndarray:
  """θ refitted on each bootstrap resample of the base runs (``samples`` rows), from the point estimate ``law``."""
  free_mask, fixed_theta = _fixed(fixed)
  bn, bd, bl = _arrays(*base_runs)
  (w_base,) = _resampling_weights(seed, [base_runs[:2]], samples)
  tile = lambda a: jnp.broadcast_to(a, (samples, *a.shape))  # noqa: E731
  theta0 = _theta(dataclasses.asdict(law))
  thetas, _ = _minimize(_base_objective(free_mask, fixed_theta), tile(theta0), tile(bn), tile(bd), tile(bl), w_base)
  return jnp.where(free_mask, thetas, fixed_theta)


def _refit_draws(thetas, runs, weights, eff: tuple[float, float], tied: bool) -> jnp.ndarray:
  """(log eff_N, log eff_D), or (log eff,) if ``tied``, refitted on each resample: row i under ``thetas[i]`` with
  run weights ``weights[i]``, from the point estimate ``eff``."""
  rn, rd, rl = _arrays(*runs)

  def eff_fit(theta, w):
    start = jnp.log(jnp.array([eff[:1] if tied else eff], jnp.float32))
    x, _ = _minimize(_eff_objective(theta), start, rn[None], rd[None], rl[None], w[None])
    return x[0]

  return jax.jit(jax.vmap(eff_fit))(thetas, weights)


def bootstrap(
  thetas, base_runs, recipe_runs, eff: tuple[float, float], fixed: dict | None = None, seed: int = 0, tied: bool = False
) -> dict[str, tuple[float, float]]:
  """95% percentile intervals of eff_N, eff_D (and the base parameters) by resampling runs with replacement;
  ``tied``: of the tied efficiency (reported as both).

  ``thetas``: ``base_refits`` of ``base_runs`` with the same ``seed`` (one row per resample); ``base_runs`` /
  ``recipe_runs`` are (N, D, L) triples of arrays. Each resample refits the efficiencies under its θ from the point
  estimate ``eff``. A resample whose refit diverges (non-finite, e.g. a grid too small to pin E once a size is left
  out) is dropped; ``"finite_fraction"`` says how many were kept (intervals are NaN if none).
  """
  free_mask, _ = _fixed(fixed)
  _, w_rec = _resampling_weights(seed, [base_runs[:2], recipe_runs[:2]], thetas.shape[0])
  log_effs = _refit_draws(thetas, recipe_runs, w_rec, eff, tied)
  with np.errstate(over="ignore"):  # a diverged refit overflows to inf and is dropped below
    draws = {"eff_N": np.exp(log_effs[:, 0]), "eff_D": np.exp(log_effs[:, -1])}
  for i, p in enumerate(PARAMS):
    if bool(free_mask[i]):
      draws[p] = np.exp(thetas[:, i]) if p in LOG_PARAMS else np.asarray(thetas[:, i])
  ok = np.all([np.isfinite(v) for v in draws.values()], axis=0)
  intervals = {name: _interval(v[ok]) for name, v in draws.items()}
  return {**intervals, "finite_fraction": float(ok.mean())}


def _interval(draws: np.ndarray) -> tuple[float, float]:
  """The 2.5 / 97.5 percentiles of the kept draws (NaN, NaN if none was kept)."""
  if draws.size == 0:
    return float("nan"), float("nan")
  return float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def load_results(paths: Sequence[str | Path]) -> list[dict]:
  """Finished-run records (JSON lines written by ``fp4jax_experiments.sweep --results``)."""
  return [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]


def with_evaluations(results: list[dict], evaluations: list[dict]) -> list[dict]:
  """``results`` with each run's ``val_loss`` replaced by the mean of its final evaluation's ``batch_losses``
  (records of ``fp4jax-evaluate`` / ``fp4jax-sweep --eval-results``, matched by run name and step).

  Raises:
    ValueError: a run has no evaluation at its final step, or two evaluations.
  """
  by_name: dict[str, dict] = {}
  for e in evaluations:
    if e["name"] in by_name:
      raise ValueError(f"evaluations: two records of run {e['name']!r}")
    by_name[e["name"]] = e
  missing = [r["name"] for r in results if r["name"] not in by_name or by_name[r["name"]]["step"] != r["step"]]
  if missing:
    raise ValueError(f"evaluations: no record at the run's final step for {missing}")
  return [{**r, "val_loss": float(np.mean(by_name[r["name"]]["batch_losses"]))} for r in results]


def _rows(results: list[dict], recipe: str) -> list[dict]:
  return [r for r in results if r["recipe"] == recipe and not r.get("bf16_first") and not r.get("bf16_last")]


def runs_of(results: list[dict], recipe: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(N non-embedding, D tokens, final validation loss) of one recipe's runs (recipes with BF16 blocks excluded)."""
  rows = _rows(results, recipe)
  return tuple(np.array([r[k] for r in rows], np.float64) for k in ("non_embedding_params", "tokens", "val_loss"))


def _runs_by_key(results: list[dict], recipe: str) -> dict[tuple, float]:
  """{(N, D, seed): final validation loss} of one recipe's runs; a key twice is refused."""
  runs: dict[tuple, float] = {}
  for r in _rows(results, recipe):
    key = (float(r["non_embedding_params"]), float(r["tokens"]), train.record_seed(r))
    if key in runs:
      raise ValueError(f"results: two {recipe} runs with N = {key[0]:g}, D = {key[1]:g}, seed {key[2]}")
    runs[key] = r["val_loss"]
  return runs


def compare(results: list[dict], thetas, effs: dict[str, float], seed: int = 0) -> list[dict]:
  """Recipe against recipe: for every pair (a, b) of ``effs``' recipes (sorted by name) whose runs have the same
  (N, D, seed) keys, the ratio of tied efficiencies eff_b / eff_a with its paired 95% bootstrap interval.

  Both recipes' runs are put in one order (by N, D, seed) and refitted on the same resamples (``_cell_weights``:
  the seeds within each cell, or the runs of a one-seed grid), each resample under the same base refit
  ``thetas[i]``; the interval is the 2.5 / 97.5 percentiles of the per-resample ratios (non-finite ones dropped).
  Pairs whose run keys differ are not compared.

  Args:
    results: run records (``load_results``), BF16 runs included.
    thetas: ``base_refits`` of the BF16 runs with the same ``seed``.
    effs: each recipe's tied efficiency (the point estimate the refits start from).
    seed: the bootstrap seed.

  Returns:
    One record per compared pair: recipe (b), against (a), ratio, ratio_ci, runs, finite_fraction.
  """
  base = runs_of(results, BF16)
  keyed = {recipe: _runs_by_key(results, recipe) for recipe in sorted(effs)}
  draws: dict[str, np.ndarray] = {}

  def eff_draws(recipe: str) -> np.ndarray:
    if recipe not in draws:
      keys = sorted(keyed[recipe])
      n, d, l = (np.array(v, np.float64) for v in zip(*[(k[0], k[1], keyed[recipe][k]) for k in keys]))
      _, w = _resampling_weights(seed, [base[:2], (n, d)], thetas.shape[0])
      eff = effs[recipe]
      with np.errstate(over="ignore"):
        draws[recipe] = np.exp(np.asarray(_refit_draws(thetas, (n, d, l), w, (eff, eff), tied=True))[:, 0])
    return draws[recipe]

  comparisons = []
  for a, b in itertools.combinations(sorted(effs), 2):
    if keyed[a].keys() != keyed[b].keys():
      continue
    with np.errstate(over="ignore", invalid="ignore"):
      ratios = eff_draws(b) / eff_draws(a)
    ok = np.isfinite(ratios)
    ci = _interval(ratios[ok])
    comparisons.append(
      {
        "recipe": b,
        "against": a,
        "ratio": effs[b] / effs[a],
        "ratio_ci": ci,
        "runs": len(keyed[a]),
        "finite_fraction": float(ok.mean()),
      }
    )
  return comparisons


def excludes_one(ci: tuple[float, float]) -> bool:
  """Whether a 95% interval (low, high) lies wholly above or below 1 (False if it is NaN)."""
  return bool(ci[0] > 1 or ci[1] < 1)


def analyze(results: list[dict], fixed: dict | None = None, samples: int = 200, seed: int = 0) -> dict:
  """Both base fits, and per recipe (eff_N, eff_D) and the tied eff, with bootstrap intervals. Needs BF16 runs."""
  base = runs_of(results, BF16)
  if base[0].size == 0:
    raise ValueError("results: no finished bf16 runs; the base law is fitted on them")
  for recipe in {r["recipe"] for r in results}:
    _runs_by_key(results, recipe)  # refuses a run twice
  law = fit_law(*base, fixed=fixed)
  chinchilla = fit_law(*base, fixed={**(fixed or {}), "gamma": 1.0})
  report = {"quartet": dataclasses.asdict(law), "chinchilla": dataclasses.asdict(chinchilla), "recipes": {}}
  thetas = base_refits(base, law, fixed, samples, seed)  # shared by every recipe's intervals
  for recipe in sorted({r["recipe"] for r in results} - {BF16}):
    runs = runs_of(results, recipe)
    if runs[0].size == 0:
      continue
    eff = fit_efficiency(law, *runs)
    intervals = bootstrap(thetas, base, runs, eff, fixed, seed)
    tied = fit_efficiency(law, *runs, tied=True)
    tied_ci = bootstrap(thetas, base, runs, tied, fixed, seed, tied=True)
    report["recipes"][recipe] = {
      "eff_N": eff[0],
      "eff_D": eff[1],
      "runs": int(runs[0].size),
      "eff_N_ci": intervals["eff_N"],
      "eff_D_ci": intervals["eff_D"],
      "bootstrap_finite": intervals["finite_fraction"],
      "eff": tied[0],
      "eff_ci": tied_ci["eff_N"],
      "eff_bootstrap_finite": tied_ci["finite_fraction"],
      "eff_excludes_1": excludes_one(tied_ci["eff_N"]),
    }
  effs = {recipe: e["eff"] for recipe, e in report["recipes"].items()}
  report["comparisons"] = compare(results, thetas, effs, seed)
  return report


def gaps_to_bf16(results: list[dict]) -> list[dict]:
  """Per (model, tokens, seed): each recipe's final validation loss minus BF16's of the same seed (runs with BF16
  blocks excluded; a record without a seed is seed 0)."""
  cell = lambda r: (r["model"], r["tokens"], train.record_seed(r))  # noqa: E731
  base = {cell(r): r["val_loss"] for r in results if r["recipe"] == BF16}
  return [
    {
      "model": r["model"],
      "tokens": r["tokens"],
      "recipe": r["recipe"],
      "seed": train.record_seed(r),
      "val_loss": r["val_loss"],
      "gap": r["val_loss"] - base[cell(r)],
    }
    for r in results
    if r["recipe"] != BF16 and cell(r) in base
  ]


def markdown(report: dict, gaps: list[dict]) -> str:
  lines = ["| form | A | α | B | β | E | γ |", "|---|---|---|---|---|---|---|"]
  for form in ("quartet", "chinchilla"):
    p = report[form]
    lines.append(
      f"| {form} | {p['A']:.4g} | {p['alpha']:.4f} | {p['B']:.4g} | {p['beta']:.4f} | {p['E']:.4f} | {p['gamma']:.4f} |"
    )
  lines += [
    "",
    "| recipe | runs | eff_N (95% CI) | eff_D (95% CI) | refits kept | eff = eff_N = eff_D (95% CI) | refits kept "
    "| eff told from 1 |",
    "|---|---|---|---|---|---|---|---|",
  ]
  ci = lambda e, k: f"{e[k]:.3g} ({e[k + '_ci'][0]:.3g}–{e[k + '_ci'][1]:.3g})"  # noqa: E731
  told = lambda ci: "yes" if excludes_one(ci) else "no"  # noqa: E731
  for recipe, e in report["recipes"].items():
    lines.append(
      f"| {recipe} | {e['runs']} | {ci(e, 'eff_N')} | {ci(e, 'eff_D')} | {e['bootstrap_finite']:.0%} | "
      f"{ci(e, 'eff')} | {e['eff_bootstrap_finite']:.0%} | {told(e['eff_ci'])} |"
    )
  if report.get("comparisons"):
    lines += [
      "",
      "Recipe against recipe: eff_b / eff_a of the tied efficiencies, paired bootstrap over the same runs "
      "(told apart: the interval excludes 1).",
      "",
      "| recipe (b) | against (a) | runs each | eff_b / eff_a (95% CI) | refits kept | told apart |",
      "|---|---|---|---|---|---|",
    ]
    lines += [
      f"| {c['recipe']} | {c['against']} | {c['runs']} | {c['ratio']:.3g} ({c['ratio_ci'][0]:.3g}–"
      f"{c['ratio_ci'][1]:.3g}) | {c['finite_fraction']:.0%} | {told(c['ratio_ci'])} |"
      for c in report["comparisons"]
    ]
  lines += ["", "| model | tokens | recipe | val loss | gap to bf16 |", "|---|---|---|---|---|"]
  seeded = len({train.record_seed(g) for g in gaps}) > 1  # several seeds: each row names its run's
  label = lambda g: f"{g['recipe']} (seed {train.record_seed(g)})" if seeded else g["recipe"]  # noqa: E731
  lines += [
    f"| {g['model']} | {g['tokens']:,} | {label(g)} | {g['val_loss']:.4f} | {g['gap']:+.4f} |"
    for g in sorted(gaps, key=lambda g: (model_lib.size_rank(g["model"]), g["tokens"], g["gap"]))
  ]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="fp4jax-scaling-law", description=__doc__.split("\n\n")[0])
  parser.add_argument("results", nargs="+", type=Path, help="JSONL files from fp4jax_experiments.sweep --results")
  parser.add_argument("--out", type=Path, required=True, help="folder for fit.json, fit.md and the plots")
  parser.add_argument(
    "--fix-exponents",
    action="store_true",
    help="hold α, β, γ at the published C4 BF16 values (for grids too small to identify them)",
  )
  parser.add_argument(
    "--sizes",
    nargs="+",
    default=None,
    help="fit only the runs of these model sizes (e.g. leave out sizes whose curves have phase "
    "transitions that a smooth law cannot follow)",
  )
  parser.add_argument(
    "--eval-results",
    nargs="+",
    type=Path,
    default=None,
    help="fit each run's final evaluation (mean of its batch_losses; JSONL of fp4jax-evaluate or fp4jax-sweep "
    "--eval-results) instead of its summary's val_loss",
  )
  parser.add_argument("--bootstrap", type=int, default=200)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  results = load_results(args.results)
  if args.eval_results:
    try:
      results = with_evaluations(results, load_results(args.eval_results))
    except ValueError as err:
      parser.error(f"--eval-results: {err}")
  if args.sizes:
    missing = sorted(set(args.sizes) - {r["model"] for r in results})
    if missing:
      parser.error(
        f"--sizes: no runs of {missing} in the results (sizes present: "
        f"{sorted({r['model'] for r in results}, key=model_lib.size_rank)})"
      )
    results = [r for r in results if r["model"] in args.sizes]
  law = QUARTET_C4_BF16
  fixed = {"alpha": law.alpha, "beta": law.beta, "gamma": law.gamma} if args.fix_exponents else None
  report = analyze(results, fixed, args.bootstrap, args.seed)
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "fit.json").write_text(json.dumps(report, indent=1) + "\n")
  table = markdown(report, gaps_to_bf16(results))
  (args.out / "fit.md").write_text(table)
  from fp4jax_experiments import plots

  plots.loss_vs_compute(results, LossLaw(**report["quartet"]), report["recipes"], args.out / "loss_vs_compute.png")
  plots.efficiency_bars(report["recipes"], args.out / "efficiency.png")
  plots.val_curves_by_size(results, args.out / "val_curves.png")
  print(table)


if __name__ == "__main__":
  main()
