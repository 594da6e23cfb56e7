"""Chinchilla approach 3 scaling-law fits and architecture multipliers (REFERENCES §5).

Law:        L(N, D) = E + A/N^α + B/D^β; N = parameters (total by default, per REFERENCES §5
            "Counting"), D = training tokens, L = eval loss of the finished run.
Fit:        log L̂ = LSE(a − α log N, b − β log D, e) with A = e^a, B = e^b, E = e^e;
            minimise the sum Σ_i Huber_δ(log L̂_i − log L_i), δ = 1e-3, by L-BFGS from every
            point of the grid α, β ∈ {0, .5, …, 2}, e ∈ {−1, −.5, …, 1}, a, b ∈ {0, 5, …, 25}
            (4,500 starts); keep the best converged fit.
Optimum:    G = (αA/(βB))^{1/(α+β)}, N_opt = G (C/6)^{β/(α+β)}, D_opt = G⁻¹ (C/6)^{α/(α+β)}.
Multipliers: data D_eq/D with L_b(N, D_eq) = L_new(N, D) (undefined when L_new(N, D) is at or
            below the baseline's asymptote E_b + A_b/N^α_b); compute C_eq/C where C_eq is the least
            compute (C = 6ND, on the baseline's compute-optimal frontier) reaching the loss the new
            family reaches at C on its own frontier.

How the 4,500 starts stay fast: all starts run in lockstep through one vectorised L-BFGS
(`_lbfgs_batch`: two-loop recursion, memory 10, Armijo backtracking, each start with its own
history, step and stopping test), so one numpy call evaluates the objective for every start.
The 5 lowest end points are then polished by scipy's L-BFGS-B, whose convergence flag is the
one reported. Optimisers see the objective divided by δ², which leaves the minimiser unchanged but
makes the relative stopping tests meaningful (the raw sum is ~1e-4, below scipy's absolute floor).

Bootstrap: runs are resampled with replacement (a resample is a vector of multiplicity weights),
and each resample is refitted by the lockstep L-BFGS alone from the best fit and the grid starts
whose full-grid runs ended lowest (`BOOTSTRAP_STARTS`), not from the whole grid: on the grids we
tried those starts land in the basin the full grid picks, and 200 resamples then cost about as
much as one fit. A resample counts only if its fit met the stopping test.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy import optimize

from nsl.errors import ArgumentParser, NslError, cli_main
from nsl.scaling.records import RunRecord, RunSet, load_runs

DELTA = 1e-3
GRID = {"a": np.arange(0.0, 25.1, 5.0), "b": np.arange(0.0, 25.1, 5.0), "e": np.arange(-1.0, 1.01, 0.5),
        "alpha": np.arange(0.0, 2.01, 0.5), "beta": np.arange(0.0, 2.01, 0.5)}
BOOTSTRAP_STARTS = 8
CI_PERCENTILES = (2.5, 97.5)  # a 95% percentile-bootstrap interval
MIN_RUNS = 5  # the law has 5 parameters
PARAM_KEYS = {"total": "params_total", "non_embedding": "params_non_embedding"}


@dataclasses.dataclass(frozen=True)
class Law:
  """L(N, D) = E + A/N^α + B/D^β and what follows from it (vectorised over N, D, C, loss)."""

  E: float
  A: float
  B: float
  alpha: float
  beta: float

  @staticmethod
  def from_theta(theta) -> "Law":
    a, b, e, alpha, beta = (float(v) for v in theta)
    return Law(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=alpha, beta=beta)

  def loss(self, N, D):
    return self.E + self.A / np.power(N, self.alpha) + self.B / np.power(D, self.beta)

  def asymptote(self, N):
    """E + A/N^α: the loss of size N with unlimited data."""
    return self.E + self.A / np.power(N, self.alpha)

  @property
  def G(self) -> float:
    """(αA/(βB))^{1/(α+β)}; NaN where undefined (a non-positive exponent, e.g. a degenerate
    bootstrap resample), never a complex number."""
    base = self.alpha * self.A / (self.beta * self.B) if self.beta * self.B != 0 else float("nan")
    if not (base > 0 and self.alpha + self.beta > 0):
      return float("nan")
    return float(base ** (1.0 / (self.alpha + self.beta)))

  @property
  def n_exponent(self) -> float:
    """N_opt ∝ C^{β/(α+β)}."""
    return self.beta / (self.alpha + self.beta)

  @property
  def d_exponent(self) -> float:
    """D_opt ∝ C^{α/(α+β)}."""
    return self.alpha / (self.alpha + self.beta)

  def compute_optimal(self, C):
    """(N_opt, D_opt) minimising L(N, D) subject to 6ND = C."""
    c6 = np.asarray(C, dtype=float) / 6.0
    return self.G * c6 ** self.n_exponent, c6 ** self.d_exponent / self.G

  def frontier_loss(self, C):
    """L(N_opt(C), D_opt(C)) = E + K (C/6)^{−αβ/(α+β)}, K = A G^{−α} + B G^{β}."""
    return self.E + self._k * (np.asarray(C, dtype=float) / 6.0) ** (-self._gamma)

  def min_compute(self, loss):
    """The least C = 6ND reaching `loss` (inverse of `frontier_loss`); NaN when loss <= E."""
    gap = np.asarray(loss, dtype=float) - self.E
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.where(gap > 0, 6.0 * (self._k / gap) ** (1.0 / self._gamma), np.nan)

  @property
  def _k(self) -> float:
    return self.A * self.G ** (-self.alpha) + self.B * self.G ** self.beta

  @property
  def _gamma(self) -> float:
    return self.alpha * self.beta / (self.alpha + self.beta)


def start_grid() -> np.ndarray:
  """The 4,500 starting points θ = (a, b, e, α, β) of REFERENCES §5, shape [4500, 5]."""
  return np.array(list(itertools.product(*(GRID[k] for k in ("a", "b", "e", "alpha", "beta")))))


def huber_objective(theta_KP, logN_R, logD_R, logL_R, weights=None, delta=DELTA):
  """Σ_i w_i Huber_δ(LSE(a − α log N_i, b − β log D_i, e) − log L_i) and its gradient in θ,
  for K parameter vectors at once: θ [K, 5] -> (f [K], grad [K, 5]). `weights` [R] or [K, R]
  are multiplicities (bootstrap); None means 1 per run."""
  a, b, e, alpha, beta = (theta_KP[:, i:i + 1] for i in range(5))
  # In-place arithmetic: this is the inner loop of 4,500 starts, so temporaries are reused.
  u1_KR, u2_KR = a - alpha * logN_R, b - beta * logD_R
  m_KR = np.maximum(u1_KR, u2_KR)
  np.maximum(m_KR, e, out=m_KR)  # shift so exp never overflows
  u1_KR -= m_KR
  u2_KR -= m_KR
  e1, e2, e3 = np.exp(u1_KR, out=u1_KR), np.exp(u2_KR, out=u2_KR), np.exp(e - m_KR)
  s_KR = e1 + e2
  s_KR += e3
  r_KR = np.log(s_KR)
  r_KR += m_KR
  r_KR -= logL_R  # residual log L̂ − log L
  dh_KR = np.clip(r_KR, -delta, delta)  # Huber'(r)
  h_KR = r_KR  # Huber(r) = c (r − c/2), c = clip(r, ±δ): r²/2 inside, δ(|r| − δ/2) outside
  h_KR -= 0.5 * dh_KR
  h_KR *= dh_KR
  dh_KR /= s_KR  # ∂LSE/∂u_j = e_j / s
  if weights is not None:
    h_KR *= weights
    dh_KR *= weights
  e1 *= dh_KR
  e2 *= dh_KR
  e3 *= dh_KR
  grad = np.stack([e1.sum(1), e2.sum(1), e3.sum(1), -np.einsum("kr,r->k", e1, logN_R),
                   -np.einsum("kr,r->k", e2, logD_R)], axis=1)
  return h_KR.sum(1), grad


def _lbfgs_batch(fun, x0_KP, memory=10, max_iter=2000, ftol=2.2e-9, gtol=1e-5, c1=1e-4):
  """Minimises K independent problems in lockstep; `fun(x [k, P], rows [k]) -> (f [k], g [k, P])`.

  Per start: L-BFGS two-loop direction (curvature pairs with sᵀy <= 0 are dropped), Armijo
  backtracking from step 1, and scipy's stopping tests (relative decrease <= ftol with the
  max(|f|, 1) floor, or max |g| <= gtol). Returns (x, f, converged, iterations).
  """
  x = np.array(x0_KP, dtype=float)
  K, P = x.shape
  f, g = fun(x, np.arange(K))
  S, Y, rho = np.zeros((memory, K, P)), np.zeros((memory, K, P)), np.zeros((memory, K))
  active, converged, nit = np.ones(K, bool), np.zeros(K, bool), np.zeros(K, int)
  for it in range(max_iter):
    idx = np.flatnonzero(active)
    if idx.size == 0:
      break
    gi, q = g[idx], g[idx].copy()
    slots = [(it - 1 - j) % memory for j in range(min(it, memory))]  # newest first
    alphas = []
    for j in slots:
      aj = rho[j, idx] * np.einsum("kp,kp->k", S[j, idx], q)
      q -= aj[:, None] * Y[j, idx]
      alphas.append(aj)
    gamma = np.full(idx.size, np.nan)  # initial Hessian scale sᵀy/yᵀy from the newest valid pair
    for j in slots:
      take = np.isnan(gamma) & (rho[j, idx] > 0)
      yy = np.einsum("kp,kp->k", Y[j, idx], Y[j, idx])
      gamma[take] = 1.0 / (rho[j, idx][take] * yy[take])
    gnorm = np.linalg.norm(gi, axis=1)
    fresh = np.isnan(gamma)
    gamma[fresh] = 1.0 / np.maximum(gnorm[fresh], 1e-300)  # first step: unit length
    r = gamma[:, None] * q
    for j, aj in zip(reversed(slots), reversed(alphas)):
      bj = rho[j, idx] * np.einsum("kp,kp->k", Y[j, idx], r)
      r += S[j, idx] * (aj - bj)[:, None]
    d = -r
    slope = np.einsum("kp,kp->k", gi, d)
    uphill = ~(slope < 0)
    d[uphill] = -gi[uphill] / np.maximum(gnorm[uphill], 1e-300)[:, None]
    slope[uphill] = -gnorm[uphill]
    x0, f0 = x[idx], f[idx]
    x1, f1, g1 = x0.copy(), f0.copy(), gi.copy()
    found = np.zeros(idx.size, bool)
    # Backtracking: step 1 first; where it fails, halvings 1-3 in one call, then 8 at a time
    # (the largest step passing Armijo wins), so a hard start costs a few calls, not dozens.
    for exps in [np.zeros(1), np.arange(1.0, 4.0)] + [np.arange(4.0 + 8 * k, 12.0 + 8 * k) for k in range(7)]:
      sub = np.flatnonzero(~found)
      if sub.size == 0:
        break
      step_SE = np.broadcast_to(0.5 ** exps, (sub.size, exps.size))
      xt = (x0[sub, None, :] + step_SE[..., None] * d[sub, None, :]).reshape(-1, P)
      ft, gt = fun(xt, np.repeat(idx[sub], exps.size))
      ft = ft.reshape(sub.size, exps.size)
      ok = np.isfinite(ft) & (ft <= f0[sub, None] + c1 * step_SE * slope[sub, None])
      first = np.argmax(ok, axis=1)
      any_ok = ok[np.arange(sub.size), first]
      hit, pick = sub[any_ok], np.flatnonzero(any_ok) * exps.size + first[any_ok]
      x1[hit], f1[hit], g1[hit], found[hit] = xt[pick], ft.reshape(-1)[pick], gt[pick], True
    s, y = x1 - x0, g1 - gi
    sy = np.einsum("kp,kp->k", s, y)
    slot = it % memory
    S[slot, idx], Y[slot, idx] = s, y
    rho[slot, idx] = np.where(sy > 1e-300, 1.0 / np.where(sy > 1e-300, sy, 1.0), 0.0)
    x[idx], f[idx], g[idx] = x1, f1, g1
    nit[idx] += 1
    small_drop = (f0 - f1) <= ftol * np.maximum(np.maximum(np.abs(f0), np.abs(f1)), 1.0)
    small_grad = np.abs(g1).max(axis=1) <= gtol
    done = ~found | small_drop | small_grad
    converged[idx] = found & (small_drop | small_grad)
    active[idx[done]] = False
  return x, f, converged, nit


@dataclasses.dataclass
class Fit:
  law: Law
  theta: np.ndarray  # (a, b, e, α, β)
  objective: float  # Σ Huber_δ at θ (unscaled)
  converged: bool
  message: str
  n_starts: int
  n_starts_converged: int
  best_starts: np.ndarray  # grid starts whose runs ended lowest: the bootstrap's starts


def _logs(N, D, L):
  logs = [np.log(np.asarray(v, dtype=float)) for v in (N, D, L)]
  if not all(np.all(np.isfinite(v)) for v in logs):
    raise ValueError("N, D and L must be positive and finite")
  return logs


def _polish(theta0, start_converged, logs, weights, delta):
  """scipy L-BFGS-B from θ0 on the δ²-scaled objective; returns (θ, Σ Huber, converged, message).

  From a point where the lockstep L-BFGS already met scipy's stopping test, scipy often stops
  with ABNORMAL (its line search finds no lower value in float64: the minimum to precision);
  that counts as converged and says so. Any other non-success does not.
  """
  def fg(th):
    f, g = huber_objective(th[None], *logs, weights=weights, delta=delta)
    return f[0] / delta**2, g[0] / delta**2
  res = optimize.minimize(fg, theta0, jac=True, method="L-BFGS-B")
  message = str(res.message)
  stalled = start_converged and res.status == 2 and message.startswith("ABNORMAL")
  if stalled:
    message = "lockstep L-BFGS converged; scipy L-BFGS-B line search found no lower value"
  return res.x, float(res.fun) * delta**2, bool(res.success) or stalled, message


def fit_law(N, D, L, *, delta=DELTA, starts=None, weights=None, n_polish=5, chunk_elems=2_000_000) -> Fit:
  """Chinchilla approach 3 fit of L(N, D) = E + A/N^α + B/D^β (module docstring).

  `starts` defaults to the 4,500-point grid. The `n_polish` lowest end points of the batched
  L-BFGS are refined by scipy L-BFGS-B; the lowest converged one is returned (the lowest of all,
  with converged=False, if none converged).
  """
  logs = _logs(N, D, L)
  starts = start_grid() if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
  scale = 1.0 / delta**2
  x_all, f_all, conv_all = [], [], []
  chunk = max(1, chunk_elems // len(logs[0]))  # bound the [K, R] temporaries
  for lo in range(0, len(starts), chunk):
    fun = lambda th, rows: tuple(v * scale for v in huber_objective(th, *logs, weights=weights, delta=delta))
    x, f, conv, _ = _lbfgs_batch(fun, starts[lo:lo + chunk])
    x_all.append(x), f_all.append(f), conv_all.append(conv)
  x, f, conv = np.concatenate(x_all), np.concatenate(f_all), np.concatenate(conv_all)
  f = np.where(np.isfinite(f), f, np.inf)
  order = np.argsort(f, kind="stable")
  polished = [_polish(x[i], conv[i], logs, weights, delta) for i in order[:n_polish]]
  ok = [p for p in polished if p[2]] or polished
  theta, objective, success, message = min(ok, key=lambda p: p[1])
  return Fit(law=Law.from_theta(theta), theta=theta, objective=objective, converged=success,
             message=message, n_starts=len(starts), n_starts_converged=int(conv.sum()),
             best_starts=starts[order[:BOOTSTRAP_STARTS]])


def bootstrap_laws(N, D, L, fit: Fit, n_boot: int, seed: int = 0, delta=DELTA) -> tuple[np.ndarray, int]:
  """Refits `n_boot` resamples of the runs (with replacement) from the best fit and its best grid
  starts; returns ([n_ok, 5] rows (E, A, B, α, β), number of resamples dropped because they had
  fewer than 2 distinct N or D or did not converge)."""
  if n_boot <= 0:
    return np.zeros((0, 5)), 0
  logs = _logs(N, D, L)
  R = len(logs[0])
  rng = np.random.default_rng(seed)
  counts = np.stack([np.bincount(rng.integers(0, R, R), minlength=R) for _ in range(n_boot)])
  used = counts > 0
  usable = np.array([len(np.unique(logs[0][u])) >= 2 and len(np.unique(logs[1][u])) >= 2 for u in used])
  counts = counts[usable]
  if len(counts) == 0:
    return np.zeros((0, 5)), n_boot
  starts = np.concatenate([fit.theta[None], fit.best_starts])
  n_s = len(starts)
  W = np.repeat(counts, n_s, axis=0).astype(float)  # row k*n_s + j: resample k from start j
  fun = lambda th, rows: tuple(v / delta**2 for v in huber_objective(th, *logs, weights=W[rows], delta=delta))
  x, f, conv, _ = _lbfgs_batch(fun, np.tile(starts, (len(counts), 1)))
  # Each resample keeps its lowest converged end point (same stopping test as scipy's; no scipy
  # polish here: its per-call overhead would dominate 200 small refits).
  f = np.where(conv & np.isfinite(f), f, np.inf).reshape(len(counts), n_s)
  best = np.argmin(f, axis=1)
  keep = np.isfinite(f[np.arange(len(counts)), best])
  rows = [[law.E, law.A, law.B, law.alpha, law.beta]
          for law in (Law.from_theta(x[k * n_s + j]) for k, j in zip(np.flatnonzero(keep), best[keep]))]
  return np.array(rows).reshape(-1, 5), n_boot - len(rows)


def laws_from_rows(rows) -> list[Law]:
  return [Law(*map(float, r)) for r in rows]


def data_multiplier(base: Law, new: Law, N, D):
  """D_eq/D with L_b(N, D_eq) = L_new(N, D): D_eq = (B_b / (L_new − E_b − A_b/N^α_b))^{1/β_b}.
  Returns (multiplier, D_eq, defined); undefined (NaN) where L_new <= the baseline asymptote."""
  N, D = np.broadcast_arrays(np.asarray(N, dtype=float), np.asarray(D, dtype=float))
  gap = new.loss(N, D) - base.asymptote(N)
  defined = gap > 0
  with np.errstate(divide="ignore", invalid="ignore"):
    d_eq = np.where(defined, (base.B / np.where(defined, gap, 1.0)) ** (1.0 / base.beta), np.nan)
  return d_eq / D, d_eq, defined


def compute_multiplier(base: Law, new: Law, C):
  """C_eq/C: the baseline's least compute reaching the new family's frontier loss at C.
  Returns (multiplier, C_eq, loss, defined); undefined (NaN) where that loss <= E_b."""
  C = np.asarray(C, dtype=float)
  loss = new.frontier_loss(C)
  c_eq = base.min_compute(loss)
  return c_eq / C, c_eq, loss, np.isfinite(c_eq)


def _interval(samples) -> list[float] | None:
  samples = np.asarray(samples, dtype=float)
  samples = samples[np.isfinite(samples)]
  return None if samples.size == 0 else [float(v) for v in np.percentile(samples, CI_PERCENTILES)]


def _law_dict(law: Law) -> dict:
  return {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta, "G": law.G,
          "N_opt_exponent": law.n_exponent, "D_opt_exponent": law.d_exponent}


def _fit_family(runs: list[RunRecord], n_key: str, loss_key: str, n_boot: int, min_runs: int,
                seed: int) -> dict:
  N = np.array([getattr(r, n_key) for r in runs])
  D = np.array([r.tokens for r in runs])
  L = np.array([r.loss(loss_key) for r in runs])
  info = {"n_runs": len(runs), "n_distinct_N": len(np.unique(N)), "n_distinct_D": len(np.unique(D)),
          # runs of one label at several attention windows are pooled by the fit: say so
          "windows": sorted({"full" if r.window is None else r.window for r in runs},
                            key=lambda w: (isinstance(w, str), 0 if isinstance(w, str) else w))}
  too_few = len(runs) < min_runs or info["n_distinct_N"] < 2 or info["n_distinct_D"] < 2
  if too_few or np.any(N <= 0) or np.any(D <= 0):
    return {"status": "skipped", **info, "reason": (
        f"{len(runs)} runs with {info['n_distinct_N']} distinct N and {info['n_distinct_D']} distinct "
        f"D: fitting 5 parameters needs >= {min_runs} runs with >= 2 distinct positive N and D")}
  t0 = time.perf_counter()
  fit = fit_law(N, D, L)
  rows, dropped = bootstrap_laws(N, D, L, fit, n_boot, seed)
  boot_laws = laws_from_rows(rows)
  ci = {k: _interval([_law_dict(b)[k] for b in boot_laws]) for k in _law_dict(fit.law)}
  compute_6nd = 6.0 * N * D
  return {"status": "fitted", **info, **_law_dict(fit.law),
          "huber_objective": fit.objective, "converged": fit.converged, "optimizer_message": fit.message,
          "n_starts": fit.n_starts, "n_starts_converged": fit.n_starts_converged,
          "flops_over_6ND_median": float(np.median(np.array([r.flops for r in runs]) / compute_6nd)),
          "range": {"N": [N.min(), N.max()], "D": [D.min(), D.max()],
                    "C_6ND": [compute_6nd.min(), compute_6nd.max()]},
          "bootstrap": {"n_resamples": n_boot, "n_dropped": dropped, "percentiles": list(CI_PERCENTILES),
                        "ci": ci, "samples_E_A_B_alpha_beta": rows.tolist()},
          "seconds": time.perf_counter() - t0,
          "points": [[float(n), float(d), float(l)] for n, d, l in zip(N, D, L)]}


def _multipliers(fams: dict, baseline: str) -> dict:
  base = fams.get(baseline)
  if base is None or base["status"] != "fitted":
    return {"baseline": baseline, "status": "skipped",
            "reason": f"baseline family {baseline!r} was " + ("not found" if base is None else "not fitted")}
  law_b = Law(*(base[k] for k in ("E", "A", "B", "alpha", "beta")))
  boots_b = laws_from_rows(base["bootstrap"]["samples_E_A_B_alpha_beta"])
  out = {"baseline": baseline, "status": "ok", "data": {}, "compute": {}}
  for name, fam in fams.items():
    if name == baseline or fam["status"] != "fitted":
      continue
    law_n = Law(*(fam[k] for k in ("E", "A", "B", "alpha", "beta")))
    boots = list(zip(boots_b, laws_from_rows(fam["bootstrap"]["samples_E_A_B_alpha_beta"])))
    nd = sorted({(p[0], p[1]) for p in fam["points"]})
    N, D = np.array(nd).T
    mult, d_eq, ok = data_multiplier(law_b, law_n, N, D)
    bm = np.array([data_multiplier(b, n, N, D)[0] for b, n in boots]).reshape(len(boots), len(N))
    out["data"][name] = [
        {"N": N[i], "D": D[i], "loss_new": float(law_n.loss(N[i], D[i])), "D_eq": d_eq[i],
         "multiplier": mult[i], "defined": bool(ok[i]),
         "reason": None if ok[i] else "L_new(N, D) <= baseline asymptote E_b + A_b/N^alpha_b",
         "ci": _interval(bm[:, i]),
         "ci_defined_fraction": float(np.isfinite(bm[:, i]).mean()) if boots else None}
        for i in range(len(N))]
    lo, hi = fam["range"]["C_6ND"]
    C = np.geomspace(lo, hi, 7)
    mult, c_eq, loss, ok = compute_multiplier(law_b, law_n, C)
    bm = np.array([compute_multiplier(b, n, C)[0] for b, n in boots]).reshape(len(boots), len(C))
    adjust = base["flops_over_6ND_median"] / fam["flops_over_6ND_median"]
    # The multiplier in measured FLOPs: each family's C = 6ND scaled by its median flops/(6ND).
    out["compute"][name] = [
        {"C_6ND": C[i], "loss_new": loss[i], "C_eq": c_eq[i], "multiplier": mult[i],
         "defined": bool(ok[i]), "reason": None if ok[i] else "frontier loss <= baseline E",
         "ci": _interval(bm[:, i]), "multiplier_measured_flops": mult[i] * adjust}
        for i in range(len(C))]
  return out


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


def fit_runs(runset: RunSet, *, baseline: str | None = None, loss_key="val", params="total",
             n_boot=200, min_runs=MIN_RUNS, seed=0) -> dict:
  """Fits every family label of `runset` and compares them to `baseline`: the fits.json content.

  `baseline=None` means "standard" when present (multipliers skipped with a reason otherwise); a
  named baseline that no run carries is an error.
  """
  if not runset.runs:
    raise NslError(f"--root={runset.root}: no finished runs (status 'done') to fit; "
                   f"left out: {runset.skipped or 'nothing found'}")
  labels = runset.by_label()
  if baseline is not None and baseline not in labels:
    raise NslError(f"--baseline={baseline}: no finished run has that family label; labels: {sorted(labels)}")
  if min_runs < MIN_RUNS:
    raise NslError(f"--min_runs={min_runs}: must be >= {MIN_RUNS} (the law has 5 parameters)")
  if params not in PARAM_KEYS:
    raise NslError(f"--params={params}: must be one of {sorted(PARAM_KEYS)}")
  fams = {name: _fit_family(runs, PARAM_KEYS[params], loss_key, n_boot, min_runs, seed)
          for name, runs in labels.items()}
  return _jsonable({
      "method": {"law": "L(N,D) = E + A/N^alpha + B/D^beta",
                 "fit": "Chinchilla approach 3 (REFERENCES §5)", "delta": DELTA,
                 "n_starts": len(start_grid()), "N": PARAM_KEYS[params], "D": "tokens",
                 "loss_key": loss_key, "compute": "C = 6ND",
                 "bootstrap": "runs resampled with replacement, refit from the best fit and "
                              f"{BOOTSTRAP_STARTS} best grid starts",
                 "ci": f"percentile bootstrap {CI_PERCENTILES[0]}/{CI_PERCENTILES[1]} (95%)",
                 "seed": seed},
      "runs": {"done": len(runset.runs), "skipped": runset.skipped},
      "families": fams,
      "multipliers": _multipliers(fams, baseline or "standard"),
  })


def _fmt_ci(fam, k, fmt):
  ci = fam["bootstrap"]["ci"].get(k)
  return f"{fam[k]:{fmt}}" + (f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "")


def summary(report: dict) -> str:
  """A few human lines: the fits, then the multipliers' ranges."""
  skipped = report["runs"]["skipped"]
  lines = [f"{report['runs']['done']} finished runs" + (f" (left out: {skipped})" if skipped else "")]
  for name, fam in report["families"].items():
    if fam["status"] != "fitted":
      lines.append(f"  {name}: skipped: {fam['reason']}")
      continue
    lines.append(f"  {name}: n={fam['n_runs']} E={_fmt_ci(fam, 'E', '.3f')} A={_fmt_ci(fam, 'A', '.4g')} "
                 f"B={_fmt_ci(fam, 'B', '.4g')} alpha={_fmt_ci(fam, 'alpha', '.3f')} "
                 f"beta={_fmt_ci(fam, 'beta', '.3f')} N_opt~C^{fam['N_opt_exponent']:.3f} "
                 f"{'converged' if fam['converged'] else 'NOT CONVERGED'} ({fam['seconds']:.1f}s)")
    if len(fam["windows"]) > 1:
      lines.append(f"    note: {name} pools runs with model.window in {fam['windows']}")
  mult = report["multipliers"]
  if mult["status"] != "ok":
    lines.append(f"multipliers: {mult['reason']}")
    return "\n".join(lines)
  for name, rows in mult["data"].items():
    vals = [r["multiplier"] for r in rows if r["defined"]]
    cvals = [r["multiplier"] for r in mult["compute"][name] if r["defined"]]
    rng = lambda v: f"{min(v):.3g}..{max(v):.3g}" if v else "undefined"
    lines.append(f"  {name} vs {mult['baseline']}: data multiplier D_eq/D {rng(vals)} "
                 f"({len(rows) - len(vals)}/{len(rows)} undefined), compute multiplier C_eq/C {rng(cvals)}")
  return "\n".join(lines)


@cli_main
def main(argv=None):
  p = ArgumentParser(prog="python -m nsl.scaling.fit", description=__doc__.split("\n")[0])
  p.add_argument("--root", required=True, help="grid root: one directory per run")
  p.add_argument("--baseline", default=None, help="family label the multipliers compare against "
                 "(default: standard, when present)")
  p.add_argument("--loss_key", default="val", help="eval split used as the loss")
  p.add_argument("--params", default="total", choices=sorted(PARAM_KEYS),
                 help="N = total (default, REFERENCES §5) or non-embedding parameters")
  p.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples (0 = none)")
  p.add_argument("--min_runs", type=int, default=MIN_RUNS, help="fewest runs a family needs to be fitted")
  p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  args = p.parse_args(argv)
  if args.bootstrap < 0:
    raise NslError(f"--bootstrap={args.bootstrap}: must be >= 0")
  report = fit_runs(load_runs(args.root, args.loss_key), baseline=args.baseline,
                    loss_key=args.loss_key, params=args.params, n_boot=args.bootstrap,
                    min_runs=args.min_runs, seed=args.seed)
  out = Path(args.root) / "fits.json"
  tmp = out.with_suffix(".json.tmp")  # never leave a half-written fits.json for the plots
  tmp.write_text(json.dumps(report, indent=1) + "\n")
  os.replace(tmp, out)
  print(summary(report))
  print(f"wrote {out}")


if __name__ == "__main__":
  sys.exit(main())
