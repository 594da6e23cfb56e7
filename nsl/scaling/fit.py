"""`python -m nsl.scaling.fit SOURCE`: scaling laws by Chinchilla's three approaches, per family,
with bootstrap intervals, identifiability verdicts and architecture multipliers
(docs/guide/scaling.md).

SOURCE is a grid root (one directory per run; compute = each run's stored training FLOPs) or a
.csv/.jsonl table of N, D, loss [, family, C] (`nsl.scaling.points`). The three approaches are in
`nsl.scaling.approaches`, the parametric law in `nsl.scaling.law`.

Multipliers compare each family's approach-3 law with a baseline's: the data multiplier D_eq/D with
L_b(N, D_eq) = L_new(N, D) at the family's own (N, D) points (undefined where L_new is at or below
the baseline's asymptote E_b + A_b/N^α_b), and the effective-compute multiplier C_eq/C, the
baseline's least compute reaching the loss the family reaches at C on its own frontier, both in
stored training FLOPs (each family's FLOPs per token as fitted from its records). Beside them, with
no law at all, each run's D_eq/D read off the baseline's runs at the same size
(`observed_data_multiplier`) and each envelope point's C_eq/C read off the baseline's envelope
(`observed_compute_multiplier`): numbers that hold where the points cannot identify a law.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from nsl import storage
from nsl.errors import ArgumentParser, NslError, cli_main
from nsl.scaling import approaches as ap, mirror
# The approach-3 machinery lives in nsl.scaling.law; these names stay importable from here.
from nsl.scaling.approaches import CI_PERCENTILES, MIN_RUNS, interval  # noqa: F401
from nsl.scaling.law import (BOOTSTRAP_STARTS, DELTA, GRID, SIX_ND, Fit, Law, bootstrap_laws,  # noqa: F401
                             fit_law, huber_objective, laws_from_rows, start_grid)
from nsl.scaling.points import PARAM_KEYS, Point, PointSet, load_points

LAW_KEYS = ("E", "A", "B", "alpha", "beta")
DEFAULT_BASELINE = "standard"


def data_multiplier(base: Law, new: Law, N, D):
  """D_eq/D with L_b(N, D_eq) = L_new(N, D): D_eq = (B_b / (L_new − E_b − A_b/N^α_b))^{1/β_b}.
  Returns (multiplier, D_eq, defined); undefined (NaN) where L_new <= the baseline asymptote."""
  N, D = np.broadcast_arrays(np.asarray(N, dtype=float), np.asarray(D, dtype=float))
  with np.errstate(all="ignore"):
    gap = new.loss(N, D) - base.asymptote(N)
    defined = gap > 0
    d_eq = np.where(defined, (base.B / np.where(defined, gap, 1.0)) ** (1.0 / base.beta), np.nan)
    return d_eq / D, d_eq, defined & np.isfinite(d_eq)


def compute_multiplier(base: Law, new: Law, C, fpt_base=SIX_ND, fpt_new=SIX_ND):
  """C_eq/C: the baseline's least compute reaching the new family's frontier loss at C (each
  family's compute through its own FLOPs-per-token model). Returns (multiplier, C_eq, loss,
  defined); undefined (NaN) where that loss <= E_b."""
  C = np.asarray(C, dtype=float)
  with np.errstate(all="ignore"):
    loss = new.frontier_loss(C, fpt_new)
    c_eq = base.min_compute(loss, fpt_base)
    return c_eq / C, c_eq, loss, np.isfinite(c_eq)


CROSSING_RANGE = (1e3, 1e16)  # tokens searched for the point where two laws' losses meet
_CROSSING_GRID = 2401  # 0.0054 decades apart: log-linear interpolation between them is exact to ~1e-5


def crossing_tokens(base: Law, new: Law, N, d_range=CROSSING_RANGE):
  """At each size N, the tokens D where the laws meet, L_new(N, D) = L_b(N, D): the first sign
  change of their difference on a log grid over `d_range`, interpolated in log D. Returns
  (D_cross, new_ahead): D_cross NaN where they do not meet there; new_ahead, whether the new
  family's loss is the lower one past the crossing (where none, at every D searched). With
  L = E + A/N^α + B/D^β on both sides the difference is monotone in D for equal β, so there is
  at most one crossing then (two otherwise; the first is reported)."""
  N = np.atleast_1d(np.asarray(N, dtype=float))
  grid = np.geomspace(*d_range, _CROSSING_GRID)
  with np.errstate(all="ignore"):
    diff = new.loss(N[:, None], grid[None, :]) - base.loss(N[:, None], grid[None, :])
  sign = np.sign(diff)
  change = (sign[:, :-1] * sign[:, 1:] < 0) & np.isfinite(diff[:, :-1]) & np.isfinite(diff[:, 1:])
  d_cross = np.full(len(N), np.nan)
  ahead = np.array([bool(np.isfinite(r).any()) and np.median(r[np.isfinite(r)]) < 0 for r in diff])
  for i in np.flatnonzero(change.any(axis=1)):
    j = int(np.argmax(change[i]))
    lo, hi = np.log(grid[j]), np.log(grid[j + 1])
    d_cross[i] = float(np.exp(lo + (hi - lo) * diff[i, j] / (diff[i, j] - diff[i, j + 1])))
    ahead[i] = bool(diff[i, j + 1] < 0)
  return d_cross, ahead


SAME_SIZE_RTOL = 0.05  # a baseline run "at the same N" may differ by this much (e.g. a few vocabulary rows)


def _read_off(xs, losses, loss: float) -> tuple[float | None, list | None]:
  """Where a curve of runs (xs ascending, their losses) reaches `loss`: log x interpolated linearly
  between the first two neighbours whose losses bracket it. Returns (x, None), or (None, bound)
  with bound ["<", xs at the highest loss] or [">", xs at the lowest] when no pair brackets it."""
  xs, losses = np.asarray(xs, dtype=float), np.asarray(losses, dtype=float)
  for j in range(len(xs) - 1):
    if (losses[j] - loss) * (losses[j + 1] - loss) <= 0 and losses[j] != losses[j + 1]:
      t = (loss - losses[j]) / (losses[j + 1] - losses[j])
      return float(np.exp(np.log(xs[j]) + t * (np.log(xs[j + 1]) - np.log(xs[j])))), None
  return None, (["<", xs[np.argmax(losses)]] if loss > losses.max() else [">", xs[np.argmin(losses)]])


def _observed_row(key: str, x: float, loss: float, xs, losses, **extra) -> dict:
  x_eq, bound = _read_off(xs, losses, loss)
  side = None if bound is None else ("above every" if bound[0] == "<" else "below every")
  return {key: x, "loss": loss, **extra, f"{key}_eq": x_eq, "multiplier": None if x_eq is None else x_eq / x,
          "defined": x_eq is not None, "bound": None if bound is None else [bound[0], bound[1] / x],
          "reason": None if bound is None else f"loss {side} baseline run it is read against"}


def observed_data_multiplier(base_pts, N: float, D: float, loss: float, rtol: float = SAME_SIZE_RTOL) -> dict:
  """D_eq/D read off the baseline's own runs, no law: at the baseline size nearest N (within
  `rtol`), the tokens at which its loss reaches `loss` (`_read_off` over its budgets). Outside
  its losses at that size, `bound` says which side of the nearest budget D_eq lies on, e.g.
  ["<", 0.5]: the baseline's smallest run, at half the tokens, is already as good. One run per
  cell, so no interval; the law's multiplier carries those. `base_pts` is [k, 3] of (N, D, loss)."""
  base_pts = np.asarray(base_pts, dtype=float).reshape(-1, 3)
  sizes = np.unique(base_pts[:, 0])
  near = sizes[np.argmin(np.abs(np.log(sizes / N)))] if len(sizes) else None
  if near is None or abs(near / N - 1) > rtol:
    return {"N": N, "D": D, "loss": loss, "N_baseline": None, "D_eq": None, "multiplier": None, "defined": False,
            "bound": None, "reason": f"no baseline run within {rtol:.0%} of N"}
  at = base_pts[base_pts[:, 0] == near]
  at = at[np.argsort(at[:, 1])]
  if len(at) < 2:
    return {"N": N, "D": D, "loss": loss, "N_baseline": near, "D_eq": None, "multiplier": None, "defined": False,
            "bound": None, "reason": "fewer than 2 baseline budgets at this size"}
  return {"N": N, **_observed_row("D", D, loss, at[:, 1], at[:, 2], N_baseline=near)}


def observed_compute_multiplier(base_front_C, base_front_L, C: float, loss: float) -> dict:
  """C_eq/C read off the baseline's envelope (approach 1's frontier: its best run per compute,
  kept where it beats every cheaper one), no law: the compute at which that envelope reaches the
  loss a run of the family reaches at C, log C interpolated between the envelope points that
  bracket it; a bound outside them (`observed_data_multiplier`)."""
  order = np.argsort(np.asarray(base_front_C, dtype=float))
  return _observed_row("C", C, loss, np.asarray(base_front_C, dtype=float)[order],
                       np.asarray(base_front_L, dtype=float)[order])


def _observed(fams_points: dict, fams: dict, baseline: str) -> dict:
  """Every other family against the baseline's runs: D_eq/D at each of its runs, C_eq/C at each
  point of its envelope."""
  base = np.array([[p.N, p.D, p.loss] for p in fams_points[baseline]])
  bf = fams[baseline]["approach1"]["frontier"]
  others = [n for n in fams_points if n != baseline]
  return {"data": {n: [observed_data_multiplier(base, p.N, p.D, p.loss)
                       for p in sorted(fams_points[n], key=lambda p: (p.N, p.D))] for n in others},
          "compute": {n: [observed_compute_multiplier(bf["C"], bf["loss"], c, l)
                          for c, l in zip(fams[n]["approach1"]["frontier"]["C"], fams[n]["approach1"]["frontier"]["loss"])]
                      for n in others}}


def _jsonable(v):
  """numpy -> Python, non-finite floats -> None (JSON has no NaN)."""
  if isinstance(v, dict):
    return {k: _jsonable(x) for k, x in v.items()}
  if isinstance(v, (list, tuple, np.ndarray)):
    return [_jsonable(x) for x in v]
  if isinstance(v, (np.bool_, bool)):
    return bool(v)
  if isinstance(v, (float, np.floating, np.integer, int)):
    v = v.item() if hasattr(v, "item") else v
    return v if not isinstance(v, float) or np.isfinite(v) else None
  return v


def _windows(points: list[Point]) -> list:
  ws = {"full" if p.window is None else p.window for p in points}
  return sorted(ws, key=lambda w: (isinstance(w, str), 0 if isinstance(w, str) else w))


def fit_family(points: list[Point], *, n_boot: int = 200, seed: int = 0) -> dict:
  """One family's record: its points, ranges, FLOPs-per-token model and the three approaches."""
  N, D, L, C = (np.array([getattr(p, k) for p in points], dtype=float) for k in ("N", "D", "loss", "C"))
  t0 = time.perf_counter()
  fits = ap.fit_points(N, D, L, C, n_boot=n_boot, seed=seed)
  return {"n_points": len(points), "n_sizes": len(np.unique(N)), "n_budgets": len(np.unique(D)),
          "windows": _windows(points), "flops_per_token_model": list(ap.fpt_model(N, D, C)),
          "range": {"N": [N.min(), N.max()], "D": [D.min(), D.max()], "C": [C.min(), C.max()]},
          **fits, "seconds": time.perf_counter() - t0,
          "points": [[p.N, p.D, p.loss, p.C] for p in points], "ids": [p.id for p in points]}


def law_of(fam: dict) -> Law | None:
  """A family's fitted law; None when approach 3 was skipped, or when a parameter ran past float
  range (an unidentifiable fit can push A there; fits.json then holds null): no curve to draw."""
  a3 = fam.get("approach3", {})
  values = [a3.get(k) for k in LAW_KEYS]
  if a3.get("status") != "fitted" or any(v is None for v in values):
    return None
  return Law(*values)


def _multipliers(fams: dict, baseline: str) -> dict:
  base = fams[baseline]
  law_b = law_of(base)
  if law_b is None:
    return {"baseline": baseline, "status": "skipped",
            "reason": f"baseline {baseline!r}: approach 3 skipped ({base['approach3']['reason']})"}
  fpt_b = tuple(base["approach3"]["flops_per_token_model"])
  boots_b = laws_from_rows(base["approach3"]["bootstrap"]["samples_E_A_B_alpha_beta"])
  out = {"baseline": baseline, "status": "ok", "data": {}, "compute": {}, "crossing": {}, "identifiable": {}}
  for name, fam in fams.items():
    law_n = law_of(fam)
    if name == baseline or law_n is None:
      continue
    fpt_n = tuple(fam["approach3"]["flops_per_token_model"])
    boots = list(zip(boots_b, laws_from_rows(fam["approach3"]["bootstrap"]["samples_E_A_B_alpha_beta"])))
    unidentified = [n for n, f in ((baseline, base), (name, fam)) if f["approach3"]["identifiable"] is False]
    out["identifiable"][name] = {
        "identifiable": not unidentified if base["approach3"]["identifiable"] is not None
        and fam["approach3"]["identifiable"] is not None else None,
        "reason": f"approach 3 is not identifiable for {' and '.join(unidentified)}" if unidentified else None}
    nd = sorted({(p[0], p[1]) for p in fam["points"]})
    N, D = np.array(nd).T
    mult, d_eq, ok = data_multiplier(law_b, law_n, N, D)
    bm = np.array([data_multiplier(b, n, N, D)[0] for b, n in boots]).reshape(len(boots), len(N))
    out["data"][name] = [
        {"N": N[i], "D": D[i], "loss_new": float(law_n.loss(N[i], D[i])), "D_eq": d_eq[i],
         "multiplier": mult[i], "defined": bool(ok[i]),
         "reason": None if ok[i] else "L_new(N, D) <= baseline asymptote E_b + A_b/N^alpha_b",
         "ci": interval(bm[:, i]),
         "ci_defined_fraction": float(np.isfinite(bm[:, i]).mean()) if boots else None}
        for i in range(len(N))]
    C = np.geomspace(*fam["range"]["C"], 7)
    mult, c_eq, loss, ok = compute_multiplier(law_b, law_n, C, fpt_b, fpt_n)
    bm = np.array([compute_multiplier(b, n, C, fpt_b, fpt_n)[0] for b, n in boots]).reshape(len(boots), len(C))
    out["compute"][name] = [
        {"C": C[i], "loss_new": loss[i], "C_eq": c_eq[i], "multiplier": mult[i], "defined": bool(ok[i]),
         "reason": None if ok[i] else "frontier loss <= baseline E", "ci": interval(bm[:, i])}
        for i in range(len(C))]
    sizes = np.unique(N)
    d_cross, ahead = crossing_tokens(law_b, law_n, sizes)
    seen = [p[1] for f in (base, fam) for p in f["points"]]  # the tokens either family trained on
    bc = np.array([crossing_tokens(b, n, sizes)[0] for b, n in boots]).reshape(len(boots), len(sizes))
    out["crossing"][name] = [
        {"N": sizes[i], "D_cross": d_cross[i], "tokens_per_param": d_cross[i] / sizes[i],
         "new_ahead": bool(ahead[i]),  # past the crossing; where there is none, at every D searched
         "extrapolated": bool(np.isfinite(d_cross[i]) and not min(seen) <= d_cross[i] <= max(seen)),
         "reason": None if np.isfinite(d_cross[i]) else
         f"the losses do not meet within {CROSSING_RANGE[0]:.0e}..{CROSSING_RANGE[1]:.0e} tokens",
         "ci": interval(bc[:, i]), "ci_defined_fraction": float(np.isfinite(bc[:, i]).mean()) if boots else None}
        for i in range(len(sizes))]
  return out


def fit_source(ps: PointSet, *, baseline: str | None = None, n_boot: int = 200, seed: int = 0,
               loss_key: str = "val", params: str = "total") -> dict:
  """Fits every family of a PointSet and compares them to `baseline`: the fits.json content.

  `baseline=None` compares with "standard" when that family is present and otherwise makes no
  comparison; a named baseline that no point carries is an error."""
  fams_points = ps.by_family()
  if baseline is not None and baseline not in fams_points:
    raise NslError(f"--baseline={baseline}: no point has that family; families: {sorted(fams_points)}")
  if n_boot < 0:
    raise NslError(f"--bootstrap={n_boot}: must be >= 0")
  fams = {name: fit_family(pts, n_boot=n_boot, seed=seed) for name, pts in fams_points.items()}
  base = baseline or (DEFAULT_BASELINE if DEFAULT_BASELINE in fams else None)
  if base is None or len(fams) < 2:
    mult = {"status": "skipped", "baseline": base,
            "reason": "one family: nothing to compare" if len(fams) < 2 else
                      f"no family {DEFAULT_BASELINE!r}: pass --baseline=FAMILY to compare families"}
  else:
    mult = _multipliers(fams, base)
    mult["observed"] = _observed(fams_points, fams, base)
  mult["requested"] = baseline is not None
  return _jsonable({
      "method": {"approach1": "envelope of loss vs compute; N_opt, D_opt = k C^a through it",
                 "approach2": f"IsoFLOP slices (within {ap.ISO_TOL_DEX} decades of compute), parabola "
                              "in ln N, minima; N_opt, D_opt = k C^a through them",
                 "approach3": "L(N,D) = E + A/N^alpha + B/D^beta, Huber(delta=1e-3) on log L, "
                              f"L-BFGS from {len(start_grid())} starts",
                 "N": PARAM_KEYS[params] if ps.kind == "grid" else "N", "D": "tokens", "loss_key": loss_key,
                 "compute": ps.compute, "ci": f"percentile bootstrap {CI_PERCENTILES[0]}/{CI_PERCENTILES[1]} (95%)",
                 "identifiability": {"span_max": ap.SPAN_MAX, "exponent_width_max": ap.EXPONENT_WIDTH_MAX},
                 "seed": seed},
      "input": {"source": ps.source, "kind": ps.kind, "n_points": len(ps.points),
                "skipped": ps.skipped, "excluded": ps.excluded},
      "families": fams,
      "multipliers": mult,
  })


# -- the printed table ---------------------------------------------------------------------------
def _g(v, fmt=".3g", zero=0.0) -> str:
  if v is None:
    return "-"
  return f"{0.0 if abs(v) < zero else v:{fmt}}"


def _with_ci(res: dict, key: str, fmt=".3g") -> str:
  # an exponent fitted by least squares prints 0, not -2.9e-16; E, A, B keep every digit
  zero = 1e-12 if key.endswith("exponent") else 0.0
  ci = res.get("ci", {}).get(key)
  return _g(res.get(key), fmt, zero) + (f" [{_g(ci[0], fmt, zero)}, {_g(ci[1], fmt, zero)}]" if ci else "")


def _verdict(res: dict) -> str:
  if res["identifiable"] is True:
    return "identifiable"
  if res["identifiable"] is None:
    return f"identifiability {res['reason']}"
  return f"NOT IDENTIFIABLE: {res['reason']}"


def _approach_line(k: int, res: dict) -> str:
  name = {1: "1 envelope", 2: "2 isoflop ", 3: "3 law     "}[k]
  if res["status"] != "fitted":
    return f"    {name}  skipped: {res['reason']}"
  if k == 3:
    body = (f"E={_with_ci(res, 'E')} A={_with_ci(res, 'A')} B={_with_ci(res, 'B')} "
            f"alpha={_with_ci(res, 'alpha')} beta={_with_ci(res, 'beta')}")
  else:
    body = (f"N_opt~C^{_with_ci(res, 'N_opt_exponent')} D_opt~C^{_with_ci(res, 'D_opt_exponent')}"
            + (f" ({res['n_slices_used']} slices)" if k == 2 else f" ({len(res['frontier']['C'])} points)"))
  return f"    {name}  {body}\n{' ' * 18}-> {_verdict(res)}"


def summary(report: dict) -> str:
  """The compact printed table: input, then per family one line per approach, then multipliers."""
  inp, method = report["input"], report["method"]
  head = f"{inp['n_points']} points from {inp['source']} ({inp['kind']}); compute = {method['compute']}"
  notes = [f"left out: {inp['skipped']}"] if inp["skipped"] else []
  notes += [f"excluded {n} by {rule!r}" for rule, n in inp["excluded"].items()]
  lines = [head] + [f"  {n}" for n in notes]
  for name, fam in report["families"].items():
    r = fam["range"]
    lines.append(f"  {name}: {fam['n_points']} points, {fam['n_sizes']} sizes N {_g(r['N'][0])}..{_g(r['N'][1])}, "
                 f"{fam['n_budgets']} budgets D {_g(r['D'][0])}..{_g(r['D'][1])}, C {_g(r['C'][0])}..{_g(r['C'][1])}")
    if len(fam["windows"]) > 1:
      lines.append(f"    note: {name} pools runs with model.window in {fam['windows']}")
    lines += [_approach_line(k, fam[f"approach{k}"]) for k in (1, 2, 3)]
  mult = report["multipliers"]
  if mult["status"] != "ok":
    if mult.get("requested") or len(report["families"]) > 1:
      lines.append(f"  multipliers: {mult['reason']}")
    lines += [f"  {line}" for n in mult.get("observed", {}).get("data", {}) for line in _observed_lines(n, mult)]
    return "\n".join(lines)
  rng = lambda v: f"{min(v):.3g}..{max(v):.3g}" if v else "undefined"
  for name, rows in mult["data"].items():
    vals = [r["multiplier"] for r in rows if r["defined"]]
    cvals = [r["multiplier"] for r in mult["compute"][name] if r["defined"]]
    ident = mult["identifiable"][name]
    tail = "" if ident["identifiable"] else f" ({ident['reason'] or 'identifiability not checked'})"
    lines.append(f"  {name} vs {mult['baseline']}: data multiplier D_eq/D {rng(vals)} "
                 f"({len(rows) - len(vals)}/{len(rows)} undefined), compute multiplier C_eq/C {rng(cvals)}{tail}")
    lines.append(f"    {_crossing_line(name, mult['baseline'], mult['crossing'][name])}")
    lines += [f"    {line}" for line in _observed_lines(name, mult)]
  return "\n".join(lines)


def _observed_lines(name: str, mult: dict) -> list[str]:
  """Two lines: the law-free multipliers read off the baseline's runs (data, then compute)."""
  base, out = mult["baseline"], []
  for kind, against in (("data", "runs at the same size"), ("compute", "envelope")):
    rows = mult["observed"][kind][name]
    vals = [r["multiplier"] for r in rows if r["defined"]]
    worse, better = (sum(1 for r in rows if r["bound"] and r["bound"][0] == side) for side in "<>")
    rest = len(rows) - len(vals) - worse - better
    bounds = ([f"{worse} worse than all of {base}'s"] if worse else []) \
        + ([f"{better} better than all of {base}'s"] if better else []) \
        + ([f"{rest} without a {base} size within {SAME_SIZE_RTOL:.0%}"] if rest else [])
    ratio = "D_eq/D" if kind == "data" else "C_eq/C"
    body = f"{min(vals):.3g}..{max(vals):.3g} at {len(vals)}/{len(rows)} points" if vals else f"at 0/{len(rows)} points"
    out.append(f"read off {base}'s {against} (no law): {name} {ratio} {body}" + (f" ({'; '.join(bounds)})" if bounds else ""))
  return out


def _crossing_line(name: str, baseline: str, rows: list[dict]) -> str:
  """One line: where the two laws' losses meet, over the family's sizes, and who leads past it."""
  met = [r for r in rows if r["D_cross"] is not None and np.isfinite(r["D_cross"])]
  lead = lambda rs: {name if r["new_ahead"] else baseline for r in rs}
  if not met:
    who = lead(rows)
    return (f"losses meet at no size within {CROSSING_RANGE[0]:.0e}..{CROSSING_RANGE[1]:.0e} tokens ("
            + (f"{who.pop()} ahead at every D)" if len(who) == 1 else "which one leads varies by size)"))
  d, tpp, who = [r["D_cross"] for r in met], [r["tokens_per_param"] for r in met], lead(met)
  beyond = f"{who.pop()} ahead beyond" if len(who) == 1 else "the side past it varies by size"
  outside = sum(r["extrapolated"] for r in met)
  note = f"; {outside} of them outside the tokens trained on: extrapolated" if outside else ""
  return (f"losses meet at D {min(d):.3g}..{max(d):.3g} tokens ({min(tpp):.3g}..{max(tpp):.3g} per parameter; "
          f"{len(met)}/{len(rows)} sizes{note}), {beyond}")


def write_json(report: dict, out: Path) -> None:
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(out.name + ".tmp")  # never leave a half-written file for the plots
  tmp.write_text(json.dumps(report, indent=1) + "\n")
  os.replace(tmp, out)


@cli_main
def main(argv=None):
  p = ArgumentParser(prog="python -m nsl.scaling.fit", description=__doc__.split("\n")[0])
  p.add_argument("source", nargs="?", help="grid root (a directory of runs) or a .csv/.jsonl table")
  p.add_argument("--root", default=None, help="grid root (same as SOURCE)")
  p.add_argument("--out", default=None, help="where to write the record (default: ROOT/fits.json for "
                 "a grid root, TABLE.fits.json beside a table)")
  p.add_argument("--exclude", action="append", default=[], metavar="RULE",
                 help="leave out points matching FIELD OP VALUE, e.g. 'D<1e5', 'D/N<5', 'family==sps' "
                 "(repeatable)")
  p.add_argument("--baseline", default=None, help="family the multipliers compare against "
                 "(default: standard, when present)")
  p.add_argument("--loss_key", default="val", help="eval split used as the loss (grid roots)")
  p.add_argument("--params", default="total", choices=sorted(PARAM_KEYS),
                 help="N = total or non-embedding parameters (grid roots)")
  p.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples (0 = none)")
  p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  args = p.parse_args(argv)
  source = args.source or args.root
  if source is None or (args.source and args.root and args.source != args.root):
    raise NslError("pass one grid root or table: python -m nsl.scaling.fit SOURCE (or --root=DIR)")
  if args.bootstrap < 0:
    raise NslError(f"--bootstrap={args.bootstrap}: must be >= 0")
  remote = storage.is_remote(source) and args.out is None and not source.endswith((".csv", ".jsonl"))
  if remote:  # a bucket root: fit a local mirror of its records, then put fits.json back
    storage.check_bucket(source, "--root")
    source, bucket = mirror.pull(source), storage.resolve(source)
  ps = load_points(source, loss_key=args.loss_key, params=args.params, exclude=args.exclude)
  report = fit_source(ps, baseline=args.baseline, n_boot=args.bootstrap, seed=args.seed,
                      loss_key=args.loss_key, params=args.params)
  src = Path(source)
  out = Path(args.out) if args.out else (src / "fits.json" if src.is_dir() else src.with_name(src.name + ".fits.json"))
  write_json(report, out)
  if remote:
    mirror.push(source, bucket, ("fits.json",))
    out = storage.join(bucket, "fits.json")
  print(summary(report))
  print(f"wrote {out}")


if __name__ == "__main__":
  sys.exit(main())
