"""Figures (matplotlib, Agg backend): loss curves, loss vs compute with fitted laws, efficiency bars.

Compute is the usual estimate C = 6·N·D FLOPs (N non-embedding parameters, D tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: str | Path) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def loss_curves(curves: Mapping[str, Sequence[dict]], path: str | Path, title: str = "") -> Path:
  """:func:`loss_curves_figure` saved to ``path``."""
  return _save(loss_curves_figure(curves, title), path)


def loss_curves_figure(curves: Mapping[str, Sequence[dict]], title: str = "") -> matplotlib.figure.Figure:
  """Train (thin line) and validation (markers) loss against tokens, each labelled as such in the legend, over the
  whole run (the axes hold every point, the first evaluation's too); ``curves`` maps a label to metrics records."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (label, records) in enumerate(curves.items()):
    train = [(r["tokens"], r["loss"]) for r in records if r["kind"] == "train"]
    val = [(r["tokens"], r["val_loss"]) for r in records if r["kind"] == "val"]
    if train:
      ax.plot(*zip(*train), color=f"C{i}", alpha=0.45, lw=1, label=f"{label} train")
    if val:
      ax.plot(*zip(*val), "o-", color=f"C{i}", ms=3, label=f"{label} validation (last {val[-1][1]:.4f})")
  ax.set(xlabel="tokens", ylabel="loss (nats/token)", title=title)
  ax.grid(alpha=0.3)
  ax.legend()
  return fig


def val_curves_by_size(results: Sequence[dict], path: str | Path, title: str = "") -> Path:
  """:func:`val_curves_by_size_figure`, saved to ``path``."""
  return _save(val_curves_by_size_figure(results, title), path)


def val_curves_by_size_figure(results: Sequence[dict], title: str = "") -> matplotlib.figure.Figure:
  """Validation loss against tokens (sweep result records): one panel per (model size, D/N), sizes in rows and
  token budgets in columns, a color per recipe; the y-range shows the late phase. A recipe with one run per panel is
  its curve; with several (seeds) evaluated at the same tokens, their mean with a band from their minimum to their
  maximum."""
  sizes = sorted(
    {r["model"] for r in results}, key=lambda m: min(r["non_embedding_params"] for r in results if r["model"] == m)
  )
  recipes = sorted({r["recipe"] for r in results}, key=lambda x: (x != "bf16", x))
  budgets = {size: sorted({r["tokens"] for r in results if r["model"] == size}) for size in sizes}
  cols = max(len(b) for b in budgets.values())
  fig, axes = plt.subplots(len(sizes), cols, figsize=(4.2 * cols, 3.4 * len(sizes)), squeeze=False)
  for row, size in zip(axes, sizes):
    for ax in row[len(budgets[size]) :]:
      ax.axis("off")
    for ax, tokens_budget in zip(row, budgets[size]):
      finals, lows = [], []
      for i, recipe in enumerate(recipes):
        runs = [r for r in results if r["model"] == size and r["recipe"] == recipe and r["tokens"] == tokens_budget]
        curves = [list(zip(*r["val_curve"][1:])) for r in runs]  # (tokens, losses) from the first evaluation on
        if len(curves) > 1 and all(c[0] == curves[0][0] for c in curves):
          losses = np.array([c[1] for c in curves])
          mean = losses.mean(axis=0)
          label = f"{recipe} ({mean[-1]:.3f}, {len(runs)} seeds)"
          ax.plot(curves[0][0], mean, "o-", ms=2, lw=1, color=f"C{i}", label=label)
          ax.fill_between(curves[0][0], losses.min(axis=0), losses.max(axis=0), color=f"C{i}", alpha=0.25, lw=0)
          finals.append(losses[:, -1].max())
          lows.append(losses.min())
          continue
        for tokens, loss in curves:
          ax.plot(tokens, loss, "o-", ms=2, lw=1, color=f"C{i}", label=f"{recipe} ({loss[-1]:.3f})")
          finals.append(loss[-1])
          lows.append(min(loss))
      ratio = next(
        r["tokens"] / r["non_embedding_params"] for r in results if r["model"] == size and r["tokens"] == tokens_budget
      )
      if finals:
        ax.set_ylim(min(lows) - 0.02, max(finals) + 0.6)
      ax.set(title=f"{size}, D/N = {ratio:.0f} {title}".strip(), xlabel="tokens", ylabel="validation loss")
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def paired_differences(paired: Mapping[tuple, Mapping], baseline: str, path: str | Path, title: str = "") -> Path:
  """:func:`paired_differences_figure`, saved to ``path``."""
  return _save(paired_differences_figure(paired, baseline, title), path)


def paired_differences_figure(
  paired: Mapping[tuple, Mapping], baseline: str, title: str = ""
) -> matplotlib.figure.Figure:
  """Validation-loss differences to ``baseline`` against tokens, one panel per (model size, token budget), a color
  per recipe: each seed's difference (thin) and their mean (markers), from ``evaluate.paired_curves(results,
  baseline)``; below zero the recipe is ahead. The x axis is logarithmic, so the early phase shows."""
  if not paired:
    raise ValueError(f"paired: no recipe has a run paired with a {baseline} run of the same seed; nothing to draw")
  cells = sorted({key[:2] for key in paired}, key=lambda cell: (cell[1], cell[0]))
  fig, axes = plt.subplots(1, len(cells), figsize=(4.6 * len(cells), 3.6), squeeze=False)
  recipes = sorted({key[2] for key in paired})
  for ax, (model, tokens) in zip(axes[0], cells):
    for i, recipe in enumerate(recipes):
      curve = paired.get((model, tokens, recipe))
      if curve is None:
        continue
      at, diffs = np.asarray(curve["at"], float), np.asarray(curve["diffs"])
      keep = at > 0  # the log axis: the evaluation before training is not shown
      for row in diffs:
        ax.plot(at[keep], row[keep], color=f"C{i}", lw=0.7, alpha=0.45)
      seeds = len(curve["seeds"])
      label = f"{recipe} ({seeds} seed{'s' if seeds > 1 else ''}; end {diffs[:, -1].mean():+.4f})"
      ax.plot(at[keep], diffs.mean(axis=0)[keep], "o-", ms=2.5, lw=1.4, color=f"C{i}", label=label)
    ax.axhline(0.0, color="k", lw=0.8)
    panel = f"{model}, {tokens / 1e6:.1f}M tokens {title}".strip()
    ax.set(xscale="log", xlabel="tokens", ylabel="validation loss − baseline's (same seed)", title=panel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
  fig.suptitle(f"baseline: {baseline}", fontsize=9)
  fig.tight_layout()
  return fig


def loss_vs_compute(
  results: Sequence[dict], law=None, efficiencies: Mapping | None = None, path: str | Path = "loss_vs_compute.png"
) -> Path:
  """Final validation loss against C = 6ND per recipe; with ``law``, the fitted curve of each (recipe, D/N)."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  recipes = sorted({r["recipe"] for r in results}, key=lambda x: (x != "bf16", x))
  for i, recipe in enumerate(recipes):
    rows = [r for r in results if r["recipe"] == recipe]
    n = np.array([r["non_embedding_params"] for r in rows], float)
    d = np.array([r["tokens"] for r in rows], float)
    ax.scatter(6 * n * d, [r["val_loss"] for r in rows], color=f"C{i}", label=recipe, s=18)
    eff = (1.0, 1.0) if recipe == "bf16" else (efficiencies or {}).get(recipe)
    if law is None or eff is None:
      continue
    eff = eff if isinstance(eff, tuple) else (eff["eff_N"], eff["eff_D"])
    for ratio in sorted({round(x, 6) for x in d / n}):
      ns = np.geomspace(n.min() / 1.5, n.max() * 1.5, 50)
      ax.plot(6 * ns * ns * ratio, law(ns, ns * ratio, *eff), color=f"C{i}", lw=0.8, alpha=0.7)
  ax.set(xscale="log", xlabel="compute 6ND (FLOPs)", ylabel="final validation loss")
  ax.grid(alpha=0.3, which="both")
  ax.legend()
  return _save(fig, path)


def efficiency_bars(efficiencies: Mapping[str, Mapping], path: str | Path) -> Path:
  """eff_N, eff_D and the tied eff per recipe with their bootstrap 95% intervals as error bars."""
  fig, ax = plt.subplots(figsize=(7, 4))
  names = list(efficiencies)
  x = np.arange(len(names))
  for offset, key in ((-0.27, "eff_N"), (0.0, "eff_D"), (0.27, "eff")):
    values = np.array([efficiencies[r][key] for r in names])
    ci = np.array([efficiencies[r][f"{key}_ci"] for r in names]).reshape(-1, 2)
    yerr = np.abs(np.stack([values - ci[:, 0], ci[:, 1] - values])) if len(names) else None
    ax.bar(x + offset, values, 0.27, yerr=yerr, capsize=3, label="eff (tied)" if key == "eff" else key)
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xticks(x, names, rotation=20)
  # log scale, clipped: an efficiency the grid does not identify has an interval over many decades
  ax.set(ylabel="efficiency (BF16 = 1)", yscale="log", ylim=(1e-2, 1e2))
  ax.legend()
  return _save(fig, path)
