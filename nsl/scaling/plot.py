"""Scaling figures: `python -m nsl.scaling.plot --root=DIR` writes DIR/plots/*.png and *.pdf from
DIR/fits.json (written by `python -m nsl.scaling.fit DIR`; docs/guide/scaling.md). Figures:
  loss_vs_compute     final loss vs training compute, every family, with its envelope (approach 1)
                      and its fitted law's compute-optimal frontier (approach 3);
  isoflop             loss vs N within each compute slice, the fitted parabolas and their minima
                      (approach 2), a panel per family;
  optimal_vs_compute  N_opt and D_opt vs compute by each approach;
  fitted_vs_observed  observed loss vs the approach-3 law's prediction;
  loss_vs_tokens      final loss vs tokens, one line per size, a panel per family;
  multipliers         data multiplier D_eq/D vs N and compute multiplier C_eq/C vs C against the
                      baseline, with 95% bootstrap bands;
  window_ablation     loss vs config `model.window` (grid roots whose runs differ in it).
A fit the points do not identify is drawn all the same, greyed in its legend entry as "(not identifiable)".
`--fits=PATH` plots a record written elsewhere (a table's fit), into `--out` (default: beside it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402
import numpy as np  # noqa: E402

from nsl import storage  # noqa: E402
from nsl.errors import ArgumentParser, NslError, cli_main  # noqa: E402
from nsl.scaling import mirror  # noqa: E402
from nsl.scaling.approaches import CI_PERCENTILES  # noqa: E402
from nsl.scaling.fit import compute_multiplier, data_multiplier, law_of  # noqa: E402
from nsl.scaling.law import laws_from_rows  # noqa: E402
from nsl.scaling.records import load_runs  # noqa: E402


def human(x: float) -> str:
  """1.25e8 -> '125M': counts as people say them."""
  for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
    if abs(x) >= div:
      return f"{x / div:.3g}{suffix}"
  return f"{x:.3g}"


def _round(x: float) -> float:
  """Groups counts that differ only in their 3rd significant digit (e.g. N of one size)."""
  return float(f"{x:.2g}")


def family_colors(labels) -> dict[str, str]:
  """One colour per family label, the same in every figure."""
  return {label: f"C{i % 10}" for i, label in enumerate(sorted(labels))}


def _tidy_log_ticks(fig) -> None:
  """A log axis over more than a decade keeps only its decade labels: matplotlib labels the minor
  ticks up to about two decades, and there they collide ("2x10^4 3x10^4 4x10^4 ...")."""
  for ax in fig.axes:
    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
      if axis.get_scale() == "log" and min(lim) > 0 and max(lim) / min(lim) > 10:
        axis.set_minor_formatter(NullFormatter())


def _save(fig, out_dir: Path, name: str) -> list[Path]:
  _tidy_log_ticks(fig)
  paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
  fig.savefig(paths[0], dpi=110, bbox_inches="tight")
  fig.savefig(paths[1], bbox_inches="tight")
  plt.close(fig)
  return paths


def _tag(res: dict) -> str:
  return {True: "", None: " (unchecked)", False: " (not identifiable)"}[res.get("identifiable")]


def _pts(fam: dict) -> np.ndarray:
  return np.array(fam["points"], dtype=float).reshape(-1, 4)  # N, D, loss, C


def _fpt(fam: dict) -> tuple[float, float]:
  return tuple(fam["flops_per_token_model"])


def plot_loss_vs_compute(fits, colors, out_dir, c_name):
  fig, ax = plt.subplots(figsize=(7.5, 5))
  for name, fam in fits["families"].items():
    color, P = colors[name], _pts(fam)
    ax.plot(P[:, 3], P[:, 2], "o", color=color, alpha=0.35, ms=5, label=f"{name} runs")
    a1 = fam["approach1"]
    front = a1.get("frontier") or {}
    if front.get("C"):
      ax.plot(front["C"], front["loss"], "o-", color=color, ms=7, mec="k", mew=0.6,
              label=f"{name} envelope (lowest loss at its compute)")
    law = law_of(fam)
    if law is not None:
      c = np.geomspace(P[:, 3].min() / 2, P[:, 3].max() * 2, 100)
      ax.plot(c, law.frontier_loss(c, _fpt(fam)), "--", color=color, lw=1.2,
              label=f"{name} law frontier{_tag(fam['approach3'])}")
  ax.set(xscale="log", xlabel=f"training compute C ({c_name})", ylabel=f"{fits['method']['loss_key']} loss (nats/token)",
         title="Loss vs compute: runs, envelope (approach 1), law frontier (approach 3)")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3, which="both")
  return _save(fig, out_dir, "loss_vs_compute")


def _panels(n: int, title: str, w=5.2, h=4.2):
  cols = min(n, 3)
  rows = -(-n // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
  for ax in axes.flat[n:]:
    ax.set_visible(False)
  fig.suptitle(title)
  return fig, list(axes.flat)


def plot_isoflop(fits, out_dir):
  fams = {n: f for n, f in fits["families"].items()
          if any(s["n_sizes"] >= 3 for s in f["approach2"].get("slices", []))}
  if not fams:
    return None, "no compute slice of any family holds >= 3 sizes (the grid is not IsoFLOP-shaped)"
  fig, axes = _panels(len(fams), "IsoFLOP profiles (approach 2): loss vs N per compute slice; "
                      "★ parabola minimum (hollow: outside the slice's sizes)")
  for ax, (name, fam) in zip(axes, fams.items()):
    slices = [s for s in fam["approach2"]["slices"] if s["n_sizes"] >= 2]
    shades = plt.cm.viridis(np.linspace(0, 0.9, len(slices)))
    for s, color in zip(slices, shades):
      P = np.array(s["points"], dtype=float).reshape(-1, 4)
      order = np.argsort(P[:, 0])
      ax.plot(P[order, 0], P[order, 2], "o", color=color, label=f"C≈{s['C']:.2g}")
      if s.get("parabola_a_b_c"):
        a, b, c = s["parabola_a_b_c"]
        x = np.linspace(np.log(P[:, 0].min()) - 0.3, np.log(P[:, 0].max()) + 0.3, 60)
        ax.plot(np.exp(x), a * x**2 + b * x + c, "-", color=color, lw=1)
        ax.plot([s["N_opt"]], [s["loss_min"]], "*", ms=13, mec="k",
                color=color if s.get("interior") else "none")
    a2 = fam["approach2"]
    verdict = "skipped" if a2["status"] != "fitted" else ("identifiable" if a2["identifiable"] else
                                                          _tag(a2).strip(" ()") or "identifiable")
    ax.set(xscale="log", xlabel="parameters N", ylabel="loss (nats/token)", title=f"{name}: approach 2 {verdict}")
    ax.legend(fontsize=7, title="slice compute", title_fontsize=7)
    ax.grid(alpha=0.3, which="both")
  fig.tight_layout()
  return _save(fig, out_dir, "isoflop"), None


def plot_optimal_vs_compute(fits, colors, out_dir, c_name):
  fig, (ax_n, ax_d) = plt.subplots(1, 2, figsize=(13, 5))
  drawn = False
  for name, fam in fits["families"].items():
    color, P = colors[name], _pts(fam)
    c = np.geomspace(P[:, 3].min() / 2, P[:, 3].max() * 2, 50)
    a1, a2 = fam["approach1"], fam["approach2"]
    if a1.get("frontier", {}).get("C"):
      f = a1["frontier"]
      ax_n.plot(f["C"], f["N"], "o", color=color, mfc="none")
      ax_d.plot(f["C"], f["D"], "o", color=color, mfc="none")
    for a, style, label in ((a1, "-", "1 envelope"), (a2, "--", "2 IsoFLOP")):
      if a["status"] == "fitted":
        drawn = True
        for ax, key in ((ax_n, "N"), (ax_d, "D")):
          k, e = a[f"{key}_opt_coefficient"], a[f"{key}_opt_exponent"]
          ax.plot(c, k * c**e, style, color=color, label=f"{name} {label}: {key}_opt ∝ C^{e:.2f}{_tag(a)}")
    minima = [s for s in a2.get("slices", []) if s.get("interior")]
    if minima:
      ax_n.plot([s["C"] for s in minima], [s["N_opt"] for s in minima], "*", ms=11, color=color, mec="k")
      ax_d.plot([s["C"] for s in minima], [s["D_opt"] for s in minima], "*", ms=11, color=color, mec="k")
    law = law_of(fam)
    if law is not None:
      drawn = True
      n_opt, d_opt = law.compute_optimal(c, _fpt(fam))
      tag = _tag(fam["approach3"])
      ax_n.plot(c, n_opt, ":", color=color, lw=2, label=f"{name} 3 law: N_opt ∝ C^{law.n_exponent(_fpt(fam)):.2f}{tag}")
      ax_d.plot(c, d_opt, ":", color=color, lw=2, label=f"{name} 3 law: D_opt ∝ C^{law.d_exponent(_fpt(fam)):.2f}{tag}")
  if not drawn:
    plt.close(fig)
    return None, "no approach was fitted for any family"
  for ax, key, what in ((ax_n, "N", "parameters"), (ax_d, "D", "tokens")):
    lo, hi = min(_pts(f)[:, 0 if key == "N" else 1].min() for f in fits["families"].values()), \
        max(_pts(f)[:, 0 if key == "N" else 1].max() for f in fits["families"].values())
    ax.set_ylim(lo / 10, hi * 10)  # a wild extrapolation must not flatten the data's range
    ax.set(xscale="log", yscale="log", xlabel=f"training compute C ({c_name})",
           ylabel=f"compute-optimal {what} {key}_opt",
           title=f"{key}_opt vs compute (○ envelope runs, ★ IsoFLOP minima)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
  fig.tight_layout()
  return _save(fig, out_dir, "optimal_vs_compute"), None


def plot_fitted_vs_observed(fits, colors, out_dir):
  fams = {n: f for n, f in fits["families"].items() if law_of(f) is not None}
  if not fams:
    return None, "no family has an approach-3 law"
  fig, ax = plt.subplots(figsize=(5.5, 5.2))
  lo, hi = np.inf, -np.inf
  for name, fam in fams.items():
    P = _pts(fam)
    pred = law_of(fam).loss(P[:, 0], P[:, 1])
    a3 = fam["approach3"]
    ax.plot(P[:, 2], pred, "o", color=colors[name],
            label=f"{name}: rms log residual {a3['rms_log_residual']:.3g}{_tag(a3)}")
    lo, hi = min(lo, P[:, 2].min(), np.nanmin(pred)), max(hi, P[:, 2].max(), np.nanmax(pred))
  pad = 0.05 * (hi - lo)
  ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k:", lw=1, label="fitted = observed")
  ax.set(xlabel="observed loss (nats/token)", ylabel="approach-3 law L(N, D)", title="Fitted vs observed")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  return _save(fig, out_dir, "fitted_vs_observed"), None


def plot_loss_vs_tokens(fits, out_dir):
  fams = fits["families"]
  fig, axes = _panels(len(fams), "Final loss vs training tokens, one line per model size")
  for ax, (name, fam) in zip(axes, fams.items()):
    P = _pts(fam)
    sizes = sorted({_round(n) for n in P[:, 0]})
    law = law_of(fam)
    for size, color in zip(sizes, plt.cm.viridis(np.linspace(0, 0.9, len(sizes)))):
      sel = np.array([_round(n) == size for n in P[:, 0]])
      Q = P[sel][np.argsort(P[sel][:, 1])]
      ax.plot(Q[:, 1], Q[:, 2], "o-", color=color, label=f"N={human(size)}")
      if law is not None:
        d = np.geomspace(Q[:, 1].min() / 1.5, Q[:, 1].max() * 1.5, 50)
        ax.plot(d, law.loss(np.median(Q[:, 0]), d), "--", color=color, lw=1)
    ax.set(xscale="log", xlabel="training tokens D", ylabel="loss (nats/token)",
           title=name + (f": dashed, the law{_tag(fam['approach3'])}" if law else " (no law)"))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
  return _save(fig, out_dir, "loss_vs_tokens")


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


def _read_off_marks(ax, mult, kind, name, x_key, color):
  """Crosses at the multipliers read off the baseline's runs (fit.observed_*: no law, no interval)."""
  seen = [(r[x_key], r["multiplier"]) for r in mult.get("observed", {}).get(kind, {}).get(name, []) if r["defined"]]
  if seen:
    ax.scatter(*np.array(seen).T, color=color, marker="x", s=25, label=f"{name}, read off the runs")


def plot_multipliers(fits, colors, out_dir, c_name):
  mult = fits.get("multipliers", {})
  if mult.get("status") != "ok" or not mult.get("data"):
    return None, mult.get("reason", "no non-baseline family was fitted")
  fams, base_name = fits["families"], mult["baseline"]
  base, fpt_b = law_of(fams[base_name]), _fpt(fams[base_name]["approach3"])
  base_boot = laws_from_rows(fams[base_name]["approach3"]["bootstrap"]["samples_E_A_B_alpha_beta"])
  fig, (ax_d, ax_c) = plt.subplots(1, 2, figsize=(13, 5))
  curves = {ax_d: [], ax_c: []}
  for name in mult["data"]:
    fam, color = fams[name], colors.get(name, "C0")
    law, fpt_n = law_of(fam), _fpt(fam["approach3"])
    boots = list(zip(base_boot, laws_from_rows(fam["approach3"]["bootstrap"]["samples_E_A_B_alpha_beta"])))
    P = _pts(fam)
    ratio = float(np.median(P[:, 1] / P[:, 0]))
    tag = "" if mult["identifiable"][name]["identifiable"] else " (not identifiable)"
    _read_off_marks(ax_d, mult, "data", name, "N", color)
    _read_off_marks(ax_c, mult, "compute", name, "C", color)
    if base is None or law is None:  # a law past float range (fits.json null): only the read-offs
      continue
    n = np.geomspace(*fam["range"]["N"], 60)
    curve = data_multiplier(base, law, n, ratio * n)[0]
    curves[ax_d].append(curve)
    samples = np.array([data_multiplier(b, l, n, ratio * n)[0] for b, l in boots]).reshape(-1, len(n))
    _band(ax_d, n, curve, samples, color, f"{name} at D = {ratio:.3g}·N{tag}")
    c = np.geomspace(*fam["range"]["C"], 60)
    curve = compute_multiplier(base, law, c, fpt_b, fpt_n)[0]
    curves[ax_c].append(curve)
    samples = np.array([compute_multiplier(b, l, c, fpt_b, fpt_n)[0] for b, l in boots]).reshape(-1, len(c))
    _band(ax_c, c, curve, samples, color, f"{name}{tag}")
  for ax in (ax_d, ax_c):
    ax.axhline(1.0, color="k", lw=0.8, ls=":", label=f"parity with {base_name}")
    ax.set(xscale="log", yscale="log")
    vals = np.concatenate(curves[ax] + [np.ones(1)])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    lo, hi = ax.get_ylim()
    if lo < vals.min() / 100 or hi > vals.max() * 100:  # an unidentified band would flatten the curve
      ax.set_ylim(max(lo, vals.min() / 100), min(hi, vals.max() * 100))
      ax.text(0.99, 0.01, "band clipped at 100x the curve", transform=ax.transAxes, ha="right",
              va="bottom", fontsize=7, color="0.4")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  ax_d.set(xlabel="parameters N", ylabel="data multiplier D_eq / D",
           title=f"Tokens {base_name} needs for the same loss ÷ tokens used\n(same N; bands: 95% bootstrap)")
  ax_c.set(xlabel=f"training compute C ({c_name})", ylabel="compute multiplier C_eq / C",
           title=f"Compute {base_name} needs for the same loss ÷ compute used\n(both on their frontiers)")
  fig.tight_layout()
  return _save(fig, out_dir, "multipliers"), None


def plot_window_ablation(groups, colors, n_key, loss_key, out_dir):
  windows = sorted({r.window for runs in groups.values() for r in runs}, key=lambda w: (w is None, w or 0))
  if len(windows) < 2:
    return None, "all runs have the same model.window"
  lines = {}
  for label, runs in groups.items():
    for r in runs:
      key = (label, _round(getattr(r, n_key)), _round(r.tokens))
      lines.setdefault(key, {}).setdefault(r.window, []).append(r.loss(loss_key))
  lines = {k: v for k, v in lines.items() if len(v) >= 2}
  if not lines:
    return None, "no family/size/tokens group was run at two or more windows"
  pos = {w: i for i, w in enumerate(windows)}
  fig, ax = plt.subplots(figsize=(7, 5))
  for (label, size, tokens), by_w in sorted(lines.items()):
    ws = sorted(by_w, key=lambda w: pos[w])
    ax.plot([pos[w] for w in ws], [np.mean(by_w[w]) for w in ws], "o-", color=colors.get(label, "C0"),
            label=f"{label}, N={human(size)}, D={human(tokens)}")
  ax.set_xticks(range(len(windows)), ["full" if w is None else str(w) for w in windows])
  ax.set(xlabel="attention window model.window (tokens; 'full' = unwindowed)",
         ylabel=f"{loss_key} loss (nats/token, mean over seeds)", title="Window ablation")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  return _save(fig, out_dir, "window_ablation"), None


def _read_fits(path: Path) -> dict:
  try:
    fits = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise NslError(f"{path}: malformed JSON ({e.msg}, line {e.lineno}); rerun python -m nsl.scaling.fit") from None
  if not isinstance(fits, dict) or "families" not in fits or "input" not in fits:
    raise NslError(f"{path}: not a record of this nsl.scaling.fit (no 'input'/'families'); rerun the fit")
  return fits


def make_plots(root: str | Path | None = None, fits_path: str | Path | None = None,
               out_dir: str | Path | None = None) -> tuple[list[Path], dict[str, str]]:
  """Writes every figure the record supports; returns (files written, figure -> why skipped)."""
  if root is None and fits_path is None:
    raise NslError("pass --root=DIR (a grid root with fits.json) or --fits=PATH")
  fits_path = Path(fits_path) if fits_path else Path(root) / "fits.json"
  if not fits_path.is_file():
    if root is not None and not Path(root).is_dir():
      raise NslError(f"--root={root}: not a directory")
    raise NslError(f"{fits_path}: no such file; run python -m nsl.scaling.fit {root or 'SOURCE'} first")
  fits = _read_fits(fits_path)
  out_dir = Path(out_dir) if out_dir else (Path(root) if root else fits_path.parent) / "plots"
  out_dir.mkdir(parents=True, exist_ok=True)
  colors = family_colors(fits["families"])
  c_name = "stored FLOPs" if fits["method"]["compute"].startswith("stored") else "6ND"
  written = plot_loss_vs_compute(fits, colors, out_dir, c_name) + plot_loss_vs_tokens(fits, out_dir)
  skipped = {}
  for name, (paths, why) in {
      "isoflop": plot_isoflop(fits, out_dir),
      "optimal_vs_compute": plot_optimal_vs_compute(fits, colors, out_dir, c_name),
      "fitted_vs_observed": plot_fitted_vs_observed(fits, colors, out_dir),
      "multipliers": plot_multipliers(fits, colors, out_dir, c_name)}.items():
    written += paths or []
    if why:
      skipped[name] = why
  if fits["input"]["kind"] == "grid" and root is not None and Path(root).is_dir():
    runset = load_runs(root, fits["method"]["loss_key"])
    n_key = fits["method"]["N"] if fits["method"]["N"] in ("params_total", "params_non_embedding") else "params_total"
    paths, why = plot_window_ablation(runset.by_label(), colors, n_key, fits["method"]["loss_key"], out_dir)
    written += paths or []
    if why:
      skipped["window_ablation"] = why
  return written, skipped


@cli_main
def main(argv=None):
  p = ArgumentParser(prog="python -m nsl.scaling.plot", description=__doc__.split("\n")[0])
  p.add_argument("--root", default=None, help="grid root holding fits.json (from nsl.scaling.fit)")
  p.add_argument("--fits", default=None, help="a fit record elsewhere (default: ROOT/fits.json)")
  p.add_argument("--out", default=None, help="directory for the figures (default: ROOT/plots)")
  args = p.parse_args(argv)
  bucket = storage.resolve(args.root) if args.root and storage.is_remote(args.root) and not args.out else None
  if bucket:  # plot a local mirror of the bucket root's records, then put plots/ back
    storage.check_bucket(bucket, "--root")
    args.root = mirror.pull(bucket)
  written, skipped = make_plots(args.root, args.fits, args.out)
  if bucket:
    mirror.push(args.root, bucket, ("plots",))
    written = [storage.join(bucket, os.path.relpath(str(w), args.root)) for w in written]
  for path in written:
    print(f"wrote {path}")
  for name, why in skipped.items():
    print(f"skipped {name}: {why}")


if __name__ == "__main__":
  sys.exit(main())
