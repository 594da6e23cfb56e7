"""The three Chinchilla approaches on plain arrays, with bootstrap intervals and an honest verdict
on whether the points identify what is fitted (docs/guide/scaling.md, Hoffmann et al. 2022 §3).

  approach 1  the envelope: the runs no cheaper run beats (lowest loss at their compute), and
              power laws N_opt = k_N C^a, D_opt = k_D C^b fitted through them (log-log least squares);
  approach 2  IsoFLOP profiles: runs grouped into compute slices, a parabola of loss in log N per
              slice, its minimum N_opt(C) (D_opt = C / FLOPs-per-token(N_opt)), then the same power laws;
  approach 3  the parametric law L(N, D) = E + A/N^α + B/D^β (`nsl.scaling.law`).

C is the stored training compute of each point (FLOPs per token x tokens); a caller without it
passes C = 6ND. Each result is a JSON-able dict with `status` ("fitted" or "skipped"),
`identifiable` (True, False, or None when no bootstrap was run) and `reason` (why not, one line).

Intervals are 95% percentile-bootstrap intervals: points resampled with replacement (approach 2:
within each compute slice) and everything refitted. A fit is called not identifiable when a
positive quantity's interval spans more than `SPAN_MAX` x (E, A, B, α, β, k_N, k_D), an exponent's
interval is wider than `EXPONENT_WIDTH_MAX`, a parameter sits at a bound (E ≈ 0, α or β ≈ 0, α or
β beyond the start grid), or most resamples could not be fitted.
"""

from __future__ import annotations

import numpy as np

from nsl.scaling import law as law_lib

CI_PERCENTILES = (2.5, 97.5)
SPAN_MAX = 10.0  # hi/lo of a positive parameter's interval beyond which it is not determined
EXPONENT_WIDTH_MAX = 0.5  # an optimal-allocation exponent lies in [0, 1]: wider than half is noise
MIN_RUNS = 5  # the parametric law has 5 parameters
MIN_LEVELS = 3  # a curve in N (or D) with its own offset needs >= 3 distinct values to be seen
ISO_TOL_DEX = 0.1  # runs within 0.1 decades (26%) of a slice's cheapest run share an IsoFLOP slice
EXPONENT_BOUNDS = (0.02, 3.0)  # α, β outside: the term is flat or vanishes over the data
E_FLOOR = 1e-3  # E below this fraction of the lowest loss: at its bound 0
MAX_DROPPED = 0.5  # more resamples than this fraction unfittable: the fit hangs on a few points


def interval(samples) -> list[float] | None:
  """The 95% percentile interval of the finite samples; None when there are none."""
  samples = np.asarray(samples, dtype=float)
  samples = samples[np.isfinite(samples)]
  return None if samples.size == 0 else [float(v) for v in np.percentile(samples, CI_PERCENTILES)]


def _span_problem(name: str, ci) -> str | None:
  if ci is None:
    return None
  lo, hi = ci
  if not lo > 0 or hi / lo > SPAN_MAX:
    return f"{name}'s 95% interval [{lo:.3g}, {hi:.3g}] spans more than {SPAN_MAX:g}x"
  return None


def _width_problem(name: str, ci) -> str | None:
  if ci is not None and ci[1] - ci[0] > EXPONENT_WIDTH_MAX:
    return f"{name}'s 95% interval [{ci[0]:.3g}, {ci[1]:.3g}] is wider than {EXPONENT_WIDTH_MAX:g}"
  return None


def verdict(problems: list[str | None], n_boot: int) -> dict:
  """{identifiable, reason}: False with the first problem, None when unchecked (no bootstrap)."""
  problems = [p for p in problems if p]
  if problems:
    return {"identifiable": False, "reason": "; ".join(problems[:2])}
  if n_boot <= 0:
    return {"identifiable": None, "reason": "not checked: no bootstrap resamples (intervals unknown)"}
  return {"identifiable": True, "reason": None}


def skipped(reason: str) -> dict:
  return {"status": "skipped", "identifiable": False, "reason": reason}


def fpt_model(N, D, C) -> tuple[float, float]:
  """FLOPs per token as c·N^p, least squares in log space over the points (p = 1 when every
  point has one size): how compute maps to (N, D) for approach 2's D_opt and approach 3's optimum."""
  N, fpt = np.asarray(N, dtype=float), np.asarray(C, dtype=float) / np.asarray(D, dtype=float)
  if len(np.unique(N)) < 2:
    return float(np.median(fpt / N)), 1.0
  p, logc = np.polyfit(np.log(N), np.log(fpt), 1)
  return float(np.exp(logc)), float(p)


def power_law(C, y) -> tuple[float, float]:
  """(exponent a, coefficient k) of y = k C^a by least squares in log-log; NaN if underdetermined."""
  C, y = np.asarray(C, dtype=float), np.asarray(y, dtype=float)
  if len(np.unique(C)) < 2:
    return float("nan"), float("nan")
  a, logk = np.polyfit(np.log(C), np.log(y), 1)
  return float(a), float(np.exp(logk))


def _resamples(n: int, n_boot: int, seed: int):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, n, n) for _ in range(n_boot)]


def _allocation(Cs, Ns, Ds, c_ref: float) -> dict:
  """The power laws N_opt = k_N C^a, D_opt = k_D C^b, and both at `c_ref` (a compute inside the
  data, where an interval on N_opt means something; k_N alone is an extrapolation to C = 1)."""
  a, k_n = power_law(Cs, Ns)
  b, k_d = power_law(Cs, Ds)
  return {"N_opt_exponent": a, "N_opt_coefficient": k_n, "D_opt_exponent": b, "D_opt_coefficient": k_d,
          "C_ref": c_ref, "N_opt_at_C_ref": k_n * c_ref**a, "D_opt_at_C_ref": k_d * c_ref**b}


def _allocation_ci(samples: list[dict]) -> dict:
  keys = ("N_opt_exponent", "N_opt_coefficient", "D_opt_exponent", "D_opt_coefficient",
          "N_opt_at_C_ref", "D_opt_at_C_ref")
  return {k: interval([s[k] for s in samples]) for k in keys}


def _allocation_problems(ci: dict, dropped: int, n_boot: int) -> list[str | None]:
  problems = [_width_problem("the N_opt exponent", ci["N_opt_exponent"]),
              _width_problem("the D_opt exponent", ci["D_opt_exponent"]),
              _span_problem("N_opt at C_ref", ci["N_opt_at_C_ref"])]
  if n_boot and dropped > MAX_DROPPED * n_boot:
    problems.append(f"{dropped} of {n_boot} resamples could not be fitted")
  return problems


# -- approach 1: the envelope ----------------------------------------------------------------------
def frontier(C, L, tol_dex: float = ISO_TOL_DEX) -> np.ndarray:
  """Indices of the envelope, in increasing compute: the lowest-loss point of each compute group
  (`isoflop_slices`, so runs meant to share a budget compete), kept when it beats every cheaper
  group's best. On a grid without shared budgets each run is its own group."""
  C, L = np.asarray(C, dtype=float), np.asarray(L, dtype=float)
  keep, best = [], np.inf
  for s in isoflop_slices(C, tol_dex):
    i = int(s[np.argmin(L[s])])
    if L[i] < best:
      keep.append(i)
      best = L[i]
  return np.array(keep, dtype=int)


def _approach1_once(N, D, L, C, c_ref):
  idx = frontier(C, L)
  if len(idx) < 2 or len(np.unique(C[idx])) < 2:
    return None, idx
  return _allocation(C[idx], N[idx], D[idx], c_ref), idx


def approach1(N, D, L, C, *, n_boot: int = 200, seed: int = 0) -> dict:
  """Approach 1 (module docstring). Needs >= 3 envelope points over >= 2 sizes and budgets."""
  N, D, L, C = (np.asarray(v, dtype=float) for v in (N, D, L, C))
  c_ref = float(np.exp(np.mean(np.log(C))))
  with np.errstate(all="ignore"):
    fit, idx = _approach1_once(N, D, L, C, c_ref)
    front = {"C": C[idx], "N": N[idx], "D": D[idx], "loss": L[idx]}
    if fit is None or len(idx) < 3 or len(np.unique(N[idx])) < 2 or len(np.unique(D[idx])) < 2:
      out = skipped(f"the envelope holds {len(idx)} points over {len(np.unique(N[idx]))} sizes and "
                    f"{len(np.unique(D[idx]))} budgets: power laws need >= 3 points over >= 2 of each")
      return {**out, "frontier": front}
    samples, dropped = [], 0
    for take in _resamples(len(N), n_boot, seed):
      one, _ = _approach1_once(N[take], D[take], L[take], C[take], c_ref)
      if one is None or not all(np.isfinite(list(one.values()))):
        dropped += 1
      else:
        samples.append(one)
    ci = _allocation_ci(samples)
  return {"status": "fitted", **fit, "ci": ci, "frontier": front,
          "bootstrap": {"n_resamples": n_boot, "n_dropped": dropped},
          **verdict(_allocation_problems(ci, dropped, n_boot), n_boot)}


# -- approach 2: IsoFLOP profiles ------------------------------------------------------------------
def isoflop_slices(C, tol_dex: float = ISO_TOL_DEX) -> list[np.ndarray]:
  """Groups points by compute: sorted by C, a slice takes every point within `tol_dex` decades of
  its cheapest one. Returns index arrays, cheapest slice first."""
  logc = np.log10(np.asarray(C, dtype=float))
  order = np.argsort(logc, kind="stable")
  slices, current = [], []
  for i in order:
    if current and logc[i] - logc[current[0]] > tol_dex:
      slices.append(np.array(current))
      current = []
    current.append(i)
  if current:
    slices.append(np.array(current))
  return slices


def parabola_minimum(N, L):
  """(N_opt, L_min, (a, b, c), interior) of L = a x² + b x + c, x = ln N; None when the slice has
  < 3 sizes or the parabola opens downward. `interior`: the minimum lies inside the sampled sizes."""
  x = np.log(np.asarray(N, dtype=float))
  if len(np.unique(x)) < 3:
    return None
  a, b, c = np.polyfit(x, np.asarray(L, dtype=float), 2)
  if not a > 0:
    return None
  x_opt = -b / (2 * a)
  return float(np.exp(x_opt)), float(c - b * b / (4 * a)), (float(a), float(b), float(c)), \
      bool(x.min() <= x_opt <= x.max())


def _approach2_once(N, L, C, slices, fpt, c_ref):
  rows = []
  for s in slices:
    m = parabola_minimum(N[s], L[s])
    if m is None or not m[3]:
      continue
    c_slice = float(np.exp(np.mean(np.log(C[s]))))
    rows.append((c_slice, m[0], c_slice / (fpt[0] * m[0] ** fpt[1])))
  if len(rows) < 2:
    return None
  Cs, Ns, Ds = np.array(rows).T
  return _allocation(Cs, Ns, Ds, c_ref)


def approach2(N, D, L, C, *, n_boot: int = 200, seed: int = 0, tol_dex: float = ISO_TOL_DEX) -> dict:
  """Approach 2 (module docstring). Needs >= 2 slices whose parabola has its minimum inside the
  slice's sizes; identifiable only with >= 3 such slices and tight intervals."""
  N, D, L, C = (np.asarray(v, dtype=float) for v in (N, D, L, C))
  fpt = fpt_model(N, D, C)
  with np.errstate(all="ignore"):
    slices, table = isoflop_slices(C, tol_dex), []
    for s in slices:
      m = parabola_minimum(N[s], L[s])
      row = {"C": float(np.exp(np.mean(np.log(C[s])))), "n_points": int(len(s)),
             "n_sizes": int(len(np.unique(N[s]))), "points": np.stack([N[s], D[s], L[s], C[s]], 1)}
      if m is None:
        row["reason"] = "fewer than 3 sizes" if row["n_sizes"] < 3 else "the parabola opens downward"
      else:
        row.update(N_opt=m[0], loss_min=m[1], parabola_a_b_c=list(m[2]), interior=m[3],
                   D_opt=row["C"] / (fpt[0] * m[0] ** fpt[1]))
        if not m[3]:
          row["reason"] = "minimum outside the slice's sizes (the slice does not bracket it)"
      table.append(row)
    good = [s for s, row in zip(slices, table) if row.get("interior")]
    if len(good) < 2:
      out = skipped(f"{len(good)} of {len(slices)} compute slices have a minimum inside their sizes "
                    "(a slice needs >= 3 sizes bracketing its optimum); >= 2 are needed")
      return {**out, "slices": table, "flops_per_token_model": list(fpt)}
    c_ref = float(np.exp(np.mean(np.log(C[np.concatenate(good)]))))
    fit = _approach2_once(N, L, C, good, fpt, c_ref)
    rng, samples, dropped = np.random.default_rng(seed), [], 0
    for _ in range(n_boot):
      picked = [s[rng.integers(0, len(s), len(s))] for s in good]
      one = _approach2_once(N, L, C, picked, fpt, c_ref)
      if one is None or not all(np.isfinite(list(one.values()))):
        dropped += 1
      else:
        samples.append(one)
    ci = _allocation_ci(samples)
  problems = _allocation_problems(ci, dropped, n_boot)
  if len(good) < 3:
    problems.insert(0, f"only {len(good)} compute slices bracket their optimum (>= 3 are needed)")
  return {"status": "fitted", **fit, "ci": ci, "slices": table, "n_slices_used": len(good),
          "flops_per_token_model": list(fpt), "bootstrap": {"n_resamples": n_boot, "n_dropped": dropped},
          **verdict(problems, n_boot)}


# -- approach 3: the parametric law ----------------------------------------------------------------
def law_dict(law: law_lib.Law, fpt=law_lib.SIX_ND) -> dict:
  return {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta, "G": law.G(fpt),
          "N_opt_exponent": law.n_exponent(fpt), "D_opt_exponent": law.d_exponent(fpt)}


def _law_problems(fit, L, ci, dropped, n_boot) -> list[str | None]:
  law = fit.law
  problems = [] if fit.converged else [f"the optimiser did not converge ({fit.message})"]
  if law.E < E_FLOOR * float(np.min(L)):
    problems.append(f"E = {law.E:.3g} is at its bound 0")
  for name in ("alpha", "beta"):
    v = getattr(law, name)
    if not EXPONENT_BOUNDS[0] <= v <= EXPONENT_BOUNDS[1]:
      problems.append(f"{name} = {v:.3g} is at a bound (outside [{EXPONENT_BOUNDS[0]:g}, {EXPONENT_BOUNDS[1]:g}])")
  problems += [_span_problem(k, ci[k]) for k in ("E", "A", "B", "alpha", "beta")]
  if n_boot and dropped > MAX_DROPPED * n_boot:
    problems.append(f"{dropped} of {n_boot} resamples could not be fitted")
  return problems


def approach3(N, D, L, C=None, *, n_boot: int = 200, seed: int = 0, starts=None) -> dict:
  """Approach 3 (module docstring). Needs >= 5 points over >= 3 sizes and >= 3 budgets.
  `C` (stored compute) sets the FLOPs-per-token model of the optimum; None means 6ND."""
  N, D, L = (np.asarray(v, dtype=float) for v in (N, D, L))
  n_n, n_d = len(np.unique(N)), len(np.unique(D))
  if len(N) < MIN_RUNS or n_n < MIN_LEVELS or n_d < MIN_LEVELS:
    return skipped(f"{len(N)} points over {n_n} sizes and {n_d} budgets: the 5-parameter law needs "
                   f">= {MIN_RUNS} points over >= {MIN_LEVELS} sizes and >= {MIN_LEVELS} budgets")
  fpt = law_lib.SIX_ND if C is None else fpt_model(N, D, C)
  fit = law_lib.fit_law(N, D, L, starts=starts)
  rows, dropped = law_lib.bootstrap_laws(N, D, L, fit, n_boot, seed)
  boots = law_lib.laws_from_rows(rows)
  with np.errstate(all="ignore"):
    point = law_dict(fit.law, fpt)
    samples = [law_dict(b, fpt) for b in boots]
    ci = {k: interval([s[k] for s in samples]) for k in point}
    pred = fit.law.loss(N, D)
  return {"status": "fitted", **point, "ci": ci, "flops_per_token_model": list(fpt),
          "huber_objective": fit.objective, "converged": fit.converged, "optimizer_message": fit.message,
          "n_starts": fit.n_starts, "n_starts_converged": fit.n_starts_converged,
          "rms_log_residual": float(np.sqrt(np.mean(np.log(pred / L) ** 2))),
          "bootstrap": {"n_resamples": n_boot, "n_dropped": dropped, "samples_E_A_B_alpha_beta": rows},
          **verdict(_law_problems(fit, L, ci, dropped, n_boot), n_boot)}


def fit_points(N, D, L, C=None, *, n_boot: int = 200, seed: int = 0) -> dict:
  """All three approaches on plain arrays, each with 95% bootstrap intervals and its verdict:
  {"approach1": ..., "approach2": ..., "approach3": ...}. `C` defaults to 6ND."""
  N, D, L = (np.asarray(v, dtype=float) for v in (N, D, L))
  if not (N.shape == D.shape == L.shape and N.ndim == 1):
    raise ValueError("N, D and L must be 1-d arrays of one length")
  if not all(np.all(np.isfinite(v) & (v > 0)) for v in (N, D, L)):
    raise ValueError("N, D and L must be positive and finite")
  C6 = C is None
  C = 6.0 * N * D if C6 else np.asarray(C, dtype=float)
  return {"approach1": approach1(N, D, L, C, n_boot=n_boot, seed=seed),
          "approach2": approach2(N, D, L, C, n_boot=n_boot, seed=seed),
          "approach3": approach3(N, D, L, None if C6 else C, n_boot=n_boot, seed=seed)}
