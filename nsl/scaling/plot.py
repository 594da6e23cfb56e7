"""Scaling-grid figures: `python -m nsl.scaling.plot --root=DIR` writes DIR/plots/*.png and *.pdf.

Reads the finished runs (`records.load_runs`) and, when present, DIR/fits.json written by
`nsl.scaling.fit`. Figures:
  loss_vs_tokens    final loss vs training tokens, one line per model size, a panel per family;
  loss_vs_params    final loss vs parameters per family, with the fitted law's curves;
  loss_vs_compute   final loss vs C = 6ND, all families, with each fitted compute-optimal frontier;
  multipliers       data multiplier D_eq/D vs N and compute multiplier C_eq/C vs C against the
                    baseline, with 95% bootstrap bands (needs fits.json);
  window_ablation   loss vs config `model.window` per family/size (only when windows differ).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from nsl.errors import ArgumentParser, NslError, cli_main  # noqa: E402
from nsl.scaling.fit import (CI_PERCENTILES, Law, compute_multiplier, data_multiplier,  # noqa: E402
                             laws_from_rows)
from nsl.scaling.records import RunRecord, load_runs  # noqa: E402

LAW_KEYS = ("E", "A", "B", "alpha", "beta")


def human(x: float) -> str:
  """1.25e8 -> '125M': counts as people say them."""
  for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
    if abs(x) >= div:
      return f"{x / div:.3g}{suffix}"
  return f"{x:.3g}"


def _round(x: float) -> float:
  """Groups counts that differ only in their 3rd significant digit (e.g. N of one size)."""
  return float(f"{x:.2g}")


def _fitted(fits: dict | None, label: str) -> Law | None:
  fam = (fits or {}).get("families", {}).get(label)
  return Law(*(fam[k] for k in LAW_KEYS)) if fam and fam.get("status") == "fitted" else None


def _save(fig, out_dir: Path, name: str) -> list[Path]:
  paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
  fig.savefig(paths[0], dpi=150, bbox_inches="tight")
  fig.savefig(paths[1], bbox_inches="tight")
  plt.close(fig)
  return paths


def _panels(n: int, title: str):
  cols = min(n, 3)
  rows = -(-n // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
  for ax in axes.flat[n:]:
    ax.set_visible(False)
  fig.suptitle(title)
  return fig, axes.flat


def _n_of(r: RunRecord, n_key: str) -> float:
  return getattr(r, n_key)


def plot_loss_vs_tokens(groups, fits, n_key, loss_key, out_dir):
  fig, axes = _panels(len(groups), f"Final {loss_key} loss vs training tokens, one line per model size")
  for ax, (label, runs) in zip(axes, groups.items()):
    sizes = sorted({_round(_n_of(r, n_key)) for r in runs})
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(sizes)))
    law = _fitted(fits, label)
    for size, color in zip(sizes, colors):
      pts = sorted((r.tokens, r.loss(loss_key), _n_of(r, n_key))
                   for r in runs if _round(_n_of(r, n_key)) == size)
      D, L, N = np.array(pts).T
      ax.plot(D, L, "o-", color=color, label=f"N={human(size)}")
      if law is not None:
        d = np.geomspace(D.min() / 1.5, D.max() * 1.5, 50)
        ax.plot(d, law.loss(np.median(N), d), "--", color=color, lw=1)
    ax.set(xscale="log", xlabel="training tokens D", ylabel=f"{loss_key} loss (nats/token)",
           title=label + ("  (dashed: fitted law)" if law else "  (no fit)"))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
  return _save(fig, out_dir, "loss_vs_tokens")


def plot_loss_vs_params(groups, fits, n_key, loss_key, out_dir):
  fig, axes = _panels(len(groups), f"Final {loss_key} loss vs parameters, with the fitted law L(N,D)")
  for ax, (label, runs) in zip(axes, groups.items()):
    N = np.array([_n_of(r, n_key) for r in runs])
    D = np.array([r.tokens for r in runs])
    L = np.array([r.loss(loss_key) for r in runs])
    # One curve per fixed D or per fixed tokens-per-parameter ratio, whichever the grid has fewer of.
    by_d, by_ratio = [_round(v) for v in D], [_round(v) for v in D / N]
    use_ratio = len(set(by_ratio)) < len(set(by_d))
    keys = by_ratio if use_ratio else by_d
    values = sorted(set(keys))
    colors = plt.cm.plasma(np.linspace(0, 0.85, len(values)))
    law = _fitted(fits, label)
    for value, color in zip(values, colors):
      sel = np.array([k == value for k in keys])
      name = f"D/N={value:g}" if use_ratio else f"D={human(value)}"
      ax.plot(N[sel], L[sel], "o", color=color, label=name)
      if law is not None:
        n = np.geomspace(N[sel].min() / 1.5, N[sel].max() * 1.5, 50)
        ax.plot(n, law.loss(n, value * n if use_ratio else value), "-", color=color, lw=1)
    n_name = "total" if n_key == "params_total" else "non-embedding"
    ax.set(xscale="log", xlabel=f"parameters N ({n_name})", ylabel=f"{loss_key} loss (nats/token)",
           title=label + ("  (lines: fitted law)" if law else "  (no fit)"))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
  return _save(fig, out_dir, "loss_vs_params")


def family_colors(labels) -> dict[str, str]:
  """One colour per family label, the same in every figure."""
  return {label: f"C{i % 10}" for i, label in enumerate(sorted(labels))}


def plot_loss_vs_compute(groups, fits, n_key, loss_key, out_dir):
  fig, ax = plt.subplots(figsize=(7, 5))
  colors = family_colors(groups)
  for label, runs in groups.items():
    color = colors[label]
    C = np.array([6 * _n_of(r, n_key) * r.tokens for r in runs])
    ax.plot(C, [r.loss(loss_key) for r in runs], "o", color=color, alpha=0.6, label=f"{label} runs")
    law = _fitted(fits, label)
    if law is not None:
      c = np.geomspace(C.min() / 3, C.max() * 3, 100)
      ax.plot(c, law.frontier_loss(c), "-", color=color,
              label=f"{label} frontier: N_opt ∝ C^{law.n_exponent:.2f}, E={law.E:.2f}")
  ax.set(xscale="log", xlabel="training compute C = 6·N·D (FLOPs)",
         ylabel=f"{loss_key} loss (nats/token)",
         title="Loss vs compute; lines: compute-optimal frontier of each fitted law")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  return _save(fig, out_dir, "loss_vs_compute")


def _band(ax, x, curve, samples_SX, color, label):
  """The fitted curve and, where bootstrap samples are defined, their percentile band."""
  ax.plot(x, curve, "-", color=color, label=label)
  lo, hi = np.full(len(x), np.nan), np.full(len(x), np.nan)
  for j in range(len(x) if len(samples_SX) else 0):
    col = samples_SX[:, j][np.isfinite(samples_SX[:, j])]
    if col.size:
      lo[j], hi[j] = np.percentile(col, CI_PERCENTILES)
  if np.isfinite(lo).any():
    ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)


def plot_multipliers(fits, colors, out_dir):
  mult = fits.get("multipliers", {})
  if mult.get("status") != "ok" or not mult.get("data"):
    return None, mult.get("reason", "no non-baseline family was fitted")
  fams, base_name = fits["families"], mult["baseline"]
  base = _fitted(fits, base_name)
  base_boot = laws_from_rows(fams[base_name]["bootstrap"]["samples_E_A_B_alpha_beta"])
  fig, (ax_d, ax_c) = plt.subplots(1, 2, figsize=(13, 5))
  undefined = 0
  for name in mult["data"]:
    fam, law, color = fams[name], _fitted(fits, name), colors.get(name, "C0")
    boots = list(zip(base_boot, laws_from_rows(fam["bootstrap"]["samples_E_A_B_alpha_beta"])))
    pts = np.array(fam["points"])
    ratio = float(np.median(pts[:, 1] / pts[:, 0]))
    n = np.geomspace(*fam["range"]["N"], 60)
    curve, _, ok = data_multiplier(base, law, n, ratio * n)
    undefined += int((~ok).sum())
    samples = np.array([data_multiplier(b, l, n, ratio * n)[0] for b, l in boots]).reshape(-1, len(n))
    _band(ax_d, n, curve, samples, color, f"{name} at D = {ratio:.3g}·N")
    c = np.geomspace(*fam["range"]["C_6ND"], 60)
    curve, _, _, ok = compute_multiplier(base, law, c)
    undefined += int((~ok).sum())
    samples = np.array([compute_multiplier(b, l, c)[0] for b, l in boots]).reshape(-1, len(c))
    _band(ax_c, c, curve, samples, color, name)
  band = f"bands: {CI_PERCENTILES[0]}–{CI_PERCENTILES[1]}th bootstrap percentiles"
  for ax in (ax_d, ax_c):
    ax.axhline(1.0, color="k", lw=0.8, ls=":", label=f"parity with {base_name}")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  ax_d.set(xlabel="parameters N", ylabel="data multiplier D_eq / D",
           title=f"Data efficiency vs {base_name}: tokens {base_name} needs for the same loss\n"
                 f"÷ tokens used, at the same N ({band})")
  ax_c.set(xlabel="training compute C = 6·N·D (FLOPs)", ylabel="compute multiplier C_eq / C",
           title=f"Effective compute vs {base_name}: compute {base_name} needs for the same loss\n"
                 "÷ compute used, both on their compute-optimal frontiers")
  if undefined:
    fig.suptitle(f"gaps: {undefined} points undefined (loss below the baseline's asymptote)", fontsize=9)
  fig.tight_layout()
  return _save(fig, out_dir, "multipliers"), None


def plot_window_ablation(groups, colors, n_key, loss_key, out_dir):
  windows = sorted({r.window for runs in groups.values() for r in runs},
                   key=lambda w: (w is None, w or 0))  # 'full' (None) last
  if len(windows) < 2:
    return None, "all runs have the same model.window"
  lines = {}
  for label, runs in groups.items():
    for r in runs:
      key = (label, _round(_n_of(r, n_key)), _round(r.tokens))
      lines.setdefault(key, {}).setdefault(r.window, []).append(r.loss(loss_key))
  lines = {k: v for k, v in lines.items() if len(v) >= 2}
  if not lines:
    return None, "no family/size/tokens group was run at two or more windows"
  pos = {w: i for i, w in enumerate(windows)}
  fig, ax = plt.subplots(figsize=(7, 5))
  for (label, size, tokens), by_w in sorted(lines.items()):
    ws = sorted(by_w, key=lambda w: pos[w])
    ax.plot([pos[w] for w in ws], [np.mean(by_w[w]) for w in ws], "o-", color=colors[label],
            label=f"{label}, N={human(size)}, D={human(tokens)}")
  ax.set_xticks(range(len(windows)), ["full" if w is None else str(w) for w in windows])
  ax.set(xlabel="attention window model.window (tokens; 'full' = unwindowed)",
         ylabel=f"{loss_key} loss (nats/token, mean over seeds)", title="Window ablation")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  return _save(fig, out_dir, "window_ablation"), None


def make_plots(root: str | Path, loss_key: str = "val") -> tuple[list[Path], dict[str, str]]:
  """Writes every figure the data supports; returns (files written, figure -> why skipped)."""
  root = Path(root)
  runset = load_runs(root, loss_key)
  if not runset.runs:
    raise NslError(f"--root={root}: no finished runs (status 'done') to plot")
  fits = None
  if (root / "fits.json").is_file():
    try:
      fits = json.loads((root / "fits.json").read_text())
    except json.JSONDecodeError as e:
      raise NslError(f"{root / 'fits.json'}: malformed JSON ({e.msg}, line {e.lineno}); "
                     "rerun python -m nsl.scaling.fit") from None
  fitted_key = (fits or {}).get("method", {}).get("loss_key", loss_key)
  if fitted_key != loss_key:
    raise NslError(f"{root / 'fits.json'} was fitted on eval[{fitted_key!r}] but --loss_key={loss_key}; "
                   f"pass --loss_key={fitted_key} or refit")
  # plot N as the fit counted it (total unless fitted with --params=non_embedding)
  fitted_n = (fits or {}).get("method", {}).get("N")
  n_key = fitted_n if fitted_n in ("params_total", "params_non_embedding") else "params_total"
  out_dir = root / "plots"
  out_dir.mkdir(exist_ok=True)
  groups = runset.by_label()
  written = plot_loss_vs_tokens(groups, fits, n_key, loss_key, out_dir)
  written += plot_loss_vs_params(groups, fits, n_key, loss_key, out_dir)
  written += plot_loss_vs_compute(groups, fits, n_key, loss_key, out_dir)
  skipped = {}
  if fits is None:
    skipped["multipliers"] = (f"no {root / 'fits.json'}; "
                              f"run python -m nsl.scaling.fit --root={root} first")
  else:
    paths, why = plot_multipliers(fits, family_colors(groups), out_dir)
    written += paths or []
    if why:
      skipped["multipliers"] = why
  paths, why = plot_window_ablation(groups, family_colors(groups), n_key, loss_key, out_dir)
  written += paths or []
  if why:
    skipped["window_ablation"] = why
  return written, skipped


@cli_main
def main(argv=None):
  p = ArgumentParser(prog="python -m nsl.scaling.plot", description=__doc__.split("\n")[0])
  p.add_argument("--root", required=True, help="grid root: one directory per run (fits.json optional)")
  p.add_argument("--loss_key", default="val", help="eval split used as the loss")
  args = p.parse_args(argv)
  written, skipped = make_plots(args.root, args.loss_key)
  for path in written:
    print(f"wrote {path}")
  for name, why in skipped.items():
    print(f"skipped {name}: {why}")


if __name__ == "__main__":
  sys.exit(main())
