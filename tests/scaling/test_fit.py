"""Chinchilla approach 3 fit (REFERENCES §5): recovery, compute-optimal formula, multipliers."""

import numpy as np
import pytest
from scipy import optimize

from nsl.scaling import fit as F
from nsl.scaling.fit import Law

HOFFMANN = Law(E=1.69337368, A=406.401018, B=410.722827, alpha=0.33917084, beta=0.2849083)
EPOCH = Law(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)


def synthetic_grid(law, noise=0.005, seed=0, data_scale=1.0):
  """10 sizes 1e7..1e10 x 6 token budgets (1..300 tokens/param); multiplicative noise.
  `data_scale` makes a family that learns as if it had seen data_scale x D tokens."""
  rng = np.random.default_rng(seed)
  N = np.repeat(np.logspace(7, 10, 10), 6)
  D = N * np.tile([1.0, 3.0, 10.0, 30.0, 100.0, 300.0], 10)
  return N, D, law.loss(N, data_scale * D) * np.exp(rng.normal(0.0, noise, N.shape))


@pytest.fixture(scope="module")
def fits():
  """The full-grid fits shared by the tests (each is a few seconds)."""
  out = {name: F.fit_law(*synthetic_grid(law)) for name, law in (("hoffmann", HOFFMANN), ("epoch", EPOCH))}
  # For speed these two start where the bootstrap does: the best starts of a full-grid fit.
  starts = np.concatenate([out["hoffmann"].theta[None], out["hoffmann"].best_starts])
  out["hoffmann_2x"] = F.fit_law(*synthetic_grid(HOFFMANN, noise=0.001, seed=1, data_scale=2.0), starts=starts)
  out["hoffmann_quiet"] = F.fit_law(*synthetic_grid(HOFFMANN, noise=0.001, seed=2), starts=starts)
  return out


@pytest.mark.parametrize("name,true", [("hoffmann", HOFFMANN), ("epoch", EPOCH)])
def test_recovers_constants(fits, name, true):
  fit = fits[name]
  assert fit.converged, fit.message
  assert fit.n_starts == 4500
  for key in ("E", "alpha", "beta"):
    got, want = getattr(fit.law, key), getattr(true, key)
    assert abs(got / want - 1) < 0.05, f"{name} {key}: fitted {got:.4f}, true {want:.4f}"


def test_objective_gradient_matches_finite_differences():
  N, D, L = synthetic_grid(EPOCH)
  logs = [np.log(v) for v in (N, D, L)]
  # δ large enough that the Huber is smooth at this scale, and one start near the optimum
  theta = np.array([[6.0, 7.5, 0.6, 0.35, 0.37], [3.0, 12.0, -0.5, 0.2, 0.6]])
  weights = np.arange(len(N)) % 3
  f, g = F.huber_objective(theta, *logs, weights=weights, delta=0.05)
  eps = 1e-6
  for p in range(5):
    step = np.zeros(5)
    step[p] = eps
    fp, _ = F.huber_objective(theta + step, *logs, weights=weights, delta=0.05)
    fm, _ = F.huber_objective(theta - step, *logs, weights=weights, delta=0.05)
    np.testing.assert_allclose(g[:, p], (fp - fm) / (2 * eps), rtol=1e-5, atol=1e-9)


def test_lockstep_search_matches_scipy_from_each_start():
  """The vectorised multi-start finds the same best objective as scipy run start by start."""
  N, D, L = synthetic_grid(EPOCH, seed=3)
  N, D, L = N[::2], D[::2], L[::2]
  starts = F.start_grid()[np.random.default_rng(0).choice(4500, 10, replace=False)]
  fit = F.fit_law(N, D, L, starts=starts)
  logs = [np.log(v) for v in (N, D, L)]
  def fg(th):
    f, g = F.huber_objective(th[None], *logs)
    return f[0] / F.DELTA**2, g[0] / F.DELTA**2
  best = min(optimize.minimize(fg, s, jac=True, method="L-BFGS-B").fun for s in starts) * F.DELTA**2
  assert fit.objective <= best * (1 + 1e-9)


@pytest.mark.parametrize("law", [HOFFMANN, EPOCH])
def test_compute_optimal_matches_numerical_minimum(law):
  for C in (1e18, 1e21, 1e24):
    res = optimize.minimize_scalar(lambda logn: law.loss(np.exp(logn), C / (6 * np.exp(logn))),
                                   bounds=(np.log(1e3), np.log(C / 6 / 1e3)), method="bounded",
                                   options={"xatol": 1e-10})
    n_opt, d_opt = law.compute_optimal(C)
    assert n_opt == pytest.approx(np.exp(res.x), rel=1e-4)
    assert 6 * n_opt * d_opt == pytest.approx(C, rel=1e-12)
    assert law.frontier_loss(C) == pytest.approx(res.fun, rel=1e-10)
    assert law.min_compute(law.frontier_loss(C)) == pytest.approx(C, rel=1e-9)
  assert law.n_exponent() + law.d_exponent() == pytest.approx(1.0)


@pytest.mark.parametrize("fpt", [(6.0, 1.0), (9.0, 0.95), (4.0, 1.1)])
def test_compute_optimal_under_a_flops_per_token_model(fpt):
  """With C = c N^p D (stored FLOPs per token fitted as c N^p) the closed-form optimum is the
  numerical minimum of L along C = const, and min_compute inverts frontier_loss."""
  c, p = fpt
  for C in (1e18, 1e22):
    res = optimize.minimize_scalar(lambda logn: EPOCH.loss(np.exp(logn), C / (c * np.exp(logn) ** p)),
                                   bounds=(np.log(1e3), np.log(1e13)), method="bounded", options={"xatol": 1e-10})
    n_opt, d_opt = EPOCH.compute_optimal(C, fpt)
    assert n_opt == pytest.approx(np.exp(res.x), rel=1e-4)
    assert c * n_opt**p * d_opt == pytest.approx(C, rel=1e-12)
    assert EPOCH.frontier_loss(C, fpt) == pytest.approx(res.fun, rel=1e-10)
    assert EPOCH.min_compute(EPOCH.frontier_loss(C, fpt), fpt) == pytest.approx(C, rel=1e-9)


def test_data_multiplier_exact_for_scaled_data():
  # L(N, 2D) = E + A/N^α + (B 2^-β)/D^β: a family with twice the effective data.
  twice = Law(HOFFMANN.E, HOFFMANN.A, HOFFMANN.B * 2 ** -HOFFMANN.beta, HOFFMANN.alpha, HOFFMANN.beta)
  N, D = np.array([1e8, 1e9, 1e10]), np.array([2e9, 2e10, 2e11])
  mult, d_eq, ok = F.data_multiplier(HOFFMANN, twice, N, D)
  assert ok.all()
  np.testing.assert_allclose(mult, 2.0, rtol=1e-10)
  np.testing.assert_allclose(HOFFMANN.loss(N, d_eq), twice.loss(N, D), rtol=1e-12)
  # With equal exponents the frontier gain is 2^{β/(α+β)·...}: check against the definition.
  cm, c_eq, loss, ok = F.compute_multiplier(HOFFMANN, twice, np.array([1e19, 1e22]))
  assert ok.all() and (cm > 1).all()
  np.testing.assert_allclose(HOFFMANN.frontier_loss(c_eq), loss, rtol=1e-12)


def test_data_multiplier_from_fitted_laws(fits):
  """Fitting a family generated with 2x effective data recovers a multiplier close to 2."""
  mult, _, ok = F.data_multiplier(fits["hoffmann_quiet"].law, fits["hoffmann_2x"].law,
                                  np.array([1e8, 1e9]), np.array([2e9, 2e10]))
  assert ok.all()
  np.testing.assert_allclose(mult, 2.0, rtol=0.15)


def test_multiplier_undefined_below_baseline_asymptote():
  better_floor = Law(E=1.2, A=HOFFMANN.A, B=HOFFMANN.B, alpha=HOFFMANN.alpha, beta=HOFFMANN.beta)
  N, D = np.array([1e9, 1e9]), np.array([1e10, 1e14])
  mult, d_eq, ok = F.data_multiplier(HOFFMANN, better_floor, N, D)
  # at D = 1e14 the new loss (≈1.2 + 0.37 + 0.03) is below E_b + A_b/N^α_b ≈ 2.06
  assert not ok[1] and np.isnan(mult[1]) and np.isnan(d_eq[1])
  assert better_floor.loss(1e9, 1e14) <= HOFFMANN.asymptote(1e9)
  cm, _, _, cok = F.compute_multiplier(HOFFMANN, better_floor, np.array([1e30]))
  assert not cok[0] and np.isnan(cm[0])


def test_crossing_where_a_lower_floor_overtakes_a_faster_start():
  """E_n < E_b but B_n > B_b: the new family is behind on few tokens and ahead past
  D* = ((B_n − B_b)/(E_b − E_n))^{1/β}; a family with 2x the effective data never meets it."""
  late = Law(E=HOFFMANN.E - 0.05, A=HOFFMANN.A, B=HOFFMANN.B * 1.5, alpha=HOFFMANN.alpha, beta=HOFFMANN.beta)
  want = (0.5 * HOFFMANN.B / 0.05) ** (1 / HOFFMANN.beta)
  N = np.array([1e7, 1e9])
  d, ahead = F.crossing_tokens(HOFFMANN, late, N)
  np.testing.assert_allclose(d, want, rtol=1e-4)
  assert ahead.all()
  np.testing.assert_allclose(late.loss(N, d), HOFFMANN.loss(N, d), rtol=1e-6)
  d, ahead = F.crossing_tokens(late, HOFFMANN, N)  # the other way round: the baseline leads past it
  np.testing.assert_allclose(d, want, rtol=1e-4)
  assert not ahead.any()
  twice = Law(HOFFMANN.E, HOFFMANN.A, HOFFMANN.B * 2 ** -HOFFMANN.beta, HOFFMANN.alpha, HOFFMANN.beta)
  d, ahead = F.crossing_tokens(HOFFMANN, twice, N)
  assert np.isnan(d).all() and ahead.all()


def test_observed_multiplier_reads_the_baseline_runs_at_the_same_size():
  """No law: the baseline's budgets at the nearest size (within 5%), log-linear in D between the
  two whose losses bracket the new loss; outside them a bound, elsewhere a reason."""
  base = np.array([[1e6, 1e6, 3.0], [1e6, 4e6, 2.2], [1e6, 2e6, 2.5], [3e6, 1e6, 2.8]])
  at = lambda N, D, loss: F.observed_data_multiplier(base, N, D, loss)
  r = at(1.01e6, 1e6, 2.5)  # exactly the baseline's 2M-token loss, one vocabulary row bigger
  assert r["defined"] and r["N_baseline"] == 1e6 and r["D_eq"] == pytest.approx(2e6) and r["multiplier"] == pytest.approx(2.0)
  r = at(1e6, 1e6, 2.75)  # half-way between 1M (3.0) and 2M (2.5): sqrt(2)M in log D
  assert r["D_eq"] == pytest.approx(np.sqrt(2) * 1e6) and r["multiplier"] == pytest.approx(np.sqrt(2))
  r = at(1e6, 2e6, 3.2)  # worse than the baseline's smallest run: D_eq < 1M, i.e. multiplier < 0.5
  assert not r["defined"] and r["bound"] == ["<", 0.5] and "above every baseline run" in r["reason"]
  r = at(1e6, 1e6, 2.0)  # better than its largest run: multiplier > 4
  assert not r["defined"] and r["bound"] == [">", 4.0] and "below every baseline run" in r["reason"]
  assert "fewer than 2 baseline budgets" in at(3e6, 1e6, 2.9)["reason"]
  r = at(1.5e6, 1e6, 2.5)
  assert not r["defined"] and r["N_baseline"] is None and "within 5% of N" in r["reason"]


def test_observed_compute_multiplier_reads_the_baseline_envelope():
  C_b, L_b = [4e15, 1e15, 2e15], [2.0, 3.0, 2.4]  # any order: sorted by compute
  r = F.observed_compute_multiplier(C_b, L_b, 4e15, 2.4)  # 4x the compute for the baseline's 2e15 loss
  assert r["defined"] and r["C_eq"] == pytest.approx(2e15) and r["multiplier"] == pytest.approx(0.5)
  r = F.observed_compute_multiplier(C_b, L_b, 1e15, 2.2)  # half-way (in loss) from 2e15 to 4e15
  assert r["C_eq"] == pytest.approx(np.sqrt(8) * 1e15)
  r = F.observed_compute_multiplier(C_b, L_b, 1e15, 1.9)
  assert not r["defined"] and r["bound"] == [">", 4.0]


def test_bootstrap_refits_resamples(fits):
  N, D, L = synthetic_grid(EPOCH)
  rows, dropped = F.bootstrap_laws(N, D, L, fits["epoch"], n_boot=6, seed=0)
  assert rows.shape == (6 - dropped, 5) and dropped <= 1
  assert np.all(np.isfinite(rows))
  # E, α, β of every resample stay near the truth on this well-determined grid
  assert np.all(np.abs(rows[:, [0, 3, 4]] / [EPOCH.E, EPOCH.alpha, EPOCH.beta] - 1) < 0.1)
