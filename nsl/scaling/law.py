"""Chinchilla approach 3: L(N, D) = E + A/N^α + B/D^β fitted by multi-start L-BFGS (docs/guide/scaling.md).

Law:        N = parameters (total by default), D = training tokens, L = eval loss of the finished run.
Fit:        log L̂ = LSE(a − α log N, b − β log D, e) with A = e^a, B = e^b, E = e^e;
            minimise the sum Σ_i Huber_δ(log L̂_i − log L_i), δ = 1e-3, by L-BFGS from every
            point of the grid α, β ∈ {0, .5, …, 2}, e ∈ {−1, −.5, …, 1}, a, b ∈ {0, 5, …, 25}
            (4,500 starts); keep the best converged fit (Hoffmann et al. 2022, §3.3 and D.2).
Optimum:    training FLOPs per token are modelled per family as c·N^p (c = 6, p = 1 is the usual
            C = 6ND; `fpt` below); minimising L subject to C = c·N^p·D gives
            G = (αA/(pβB))^{1/(α+pβ)}, N_opt = G (C/c)^{β/(α+pβ)}, D_opt = C/(c N_opt^p),
            and on that frontier L = E + K (C/c)^{−γ}, γ = αβ/(α+pβ), K = A G^{−α} (1 + α/(pβ)).

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

Far from a good fit the exponentials over- and underflow; those evaluations are rejected by the
line search (non-finite values), so floating-point warnings are silenced inside the optimisers.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
from scipy import optimize

DELTA = 1e-3
GRID = {"a": np.arange(0.0, 25.1, 5.0), "b": np.arange(0.0, 25.1, 5.0), "e": np.arange(-1.0, 1.01, 0.5),
        "alpha": np.arange(0.0, 2.01, 0.5), "beta": np.arange(0.0, 2.01, 0.5)}
BOOTSTRAP_STARTS = 8
SIX_ND = (6.0, 1.0)  # FLOPs per token = c N^p with (c, p) = (6, 1): C = 6ND


@dataclasses.dataclass(frozen=True)
class Law:
  """L(N, D) = E + A/N^α + B/D^β and what follows from it (vectorised over N, D, C, loss).

  Compute C enters only through the FLOPs-per-token model `fpt = (c, p)`: C = c·N^p·D
  (module docstring); the default (6, 1) is C = 6ND. Undefined quantities are NaN, never
  a warning or a complex number."""

  E: float
  A: float
  B: float
  alpha: float
  beta: float

  @staticmethod
  def from_theta(theta) -> "Law":
    a, b, e, alpha, beta = (float(v) for v in theta)
    with np.errstate(over="ignore"):
      return Law(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=alpha, beta=beta)

  def loss(self, N, D):
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      return self.E + self.A / np.power(N, self.alpha) + self.B / np.power(D, self.beta)

  def asymptote(self, N):
    """E + A/N^α: the loss of size N with unlimited data."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      return self.E + self.A / np.power(N, self.alpha)

  def G(self, fpt=SIX_ND) -> float:
    """(αA/(pβB))^{1/(α+pβ)}; NaN where undefined (a non-positive exponent or coefficient)."""
    p = fpt[1]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      base = self.alpha * self.A / (p * self.beta * self.B) if p * self.beta * self.B != 0 else float("nan")
      if not (np.isfinite(base) and base > 0 and self.alpha + p * self.beta > 0):
        return float("nan")
      return float(np.power(base, 1.0 / (self.alpha + p * self.beta)))

  def n_exponent(self, fpt=SIX_ND) -> float:
    """N_opt ∝ C^{β/(α+pβ)}."""
    den = self.alpha + fpt[1] * self.beta
    return self.beta / den if den else float("nan")

  def d_exponent(self, fpt=SIX_ND) -> float:
    """D_opt ∝ C^{(α + (1−p)β)/(α+pβ)} (α/(α+β) when p = 1)."""
    den = self.alpha + fpt[1] * self.beta
    return (self.alpha + (1 - fpt[1]) * self.beta) / den if den else float("nan")

  def compute_optimal(self, C, fpt=SIX_ND):
    """(N_opt, D_opt) minimising L(N, D) subject to c·N^p·D = C."""
    c, p = fpt
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      n_opt = self.G(fpt) * (np.asarray(C, dtype=float) / c) ** self.n_exponent(fpt)
      return n_opt, np.asarray(C, dtype=float) / (c * n_opt**p)

  def frontier_loss(self, C, fpt=SIX_ND):
    """L(N_opt(C), D_opt(C)) = E + K (C/c)^{−γ}."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      return self.E + self._k(fpt) * (np.asarray(C, dtype=float) / fpt[0]) ** (-self._gamma(fpt))

  def min_compute(self, loss, fpt=SIX_ND):
    """The least C reaching `loss` (inverse of `frontier_loss`); NaN when loss <= E."""
    gap = np.asarray(loss, dtype=float) - self.E
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      return np.where(gap > 0, fpt[0] * (self._k(fpt) / gap) ** (1.0 / self._gamma(fpt)), np.nan)

  def _k(self, fpt) -> float:
    p = fpt[1]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
      return self.A * self.G(fpt) ** (-self.alpha) * (1.0 + self.alpha / (p * self.beta))

  def _gamma(self, fpt) -> float:
    den = self.alpha + fpt[1] * self.beta
    return self.alpha * self.beta / den if den else float("nan")


def _quiet(fn):
  """Runs `fn` with numpy's floating-point warnings off: the optimisers probe far-off points whose
  exponentials overflow, and reject them by their non-finite value."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with np.errstate(all="ignore"):
      return fn(*args, **kwargs)
  return wrapped


def start_grid() -> np.ndarray:
  """The 4,500 starting points θ = (a, b, e, α, β) of docs/papers/scaling_laws.md#approach-3, shape [4500, 5]."""
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


@_quiet
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


@_quiet
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
  """Laws from (E, A, B, α, β) rows as fits.json stores them; rows holding a None or a
  non-finite value (JSON has no NaN: an overflowed resample) are left out."""
  out = []
  for r in ([] if rows is None else rows):
    if r is None or len(r) != 5 or any(v is None for v in r):
      continue
    vals = [float(v) for v in r]
    if all(np.isfinite(vals)):
      out.append(Law(*vals))
  return out
