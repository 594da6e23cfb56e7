"""An SPS run trained end to end by the Trainer, then the two analyses of REFERENCES §1 on it."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.evals import common, gradflow, persistent_window
from nsl.train import loop
from nsl import runs
from tests.helpers import make_corpus, tiny_config

STEPS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """SPS with w = 0 (each ρ sees no other ρ) trained for a few steps on the byte corpus."""
  root = tmp_path_factory.mktemp("sps_run")
  data_dir = make_corpus(str(root / "corpus"), n=6, chars=3000)
  config = tiny_config(data_dir, **{"family": "sps", "model.variant": "sps", "model.window": 0,
                                    "model.attention_impl": "xla", "data.seq_len": 32, "model.vocab_size": 264,
                                    "train.steps": STEPS, "train.eval_every": 100, "checkpoint.every": 100})
  trainer = loop.Trainer(config, str(root / "run"), progress=False)
  result = trainer.run()
  return str(root / "run"), trainer, result


def test_trainer_records_an_sps_run(run):
  workdir, _, result = run
  assert result["status"] == "done" and result["family"] == "sps" and result["variant"] == "sps"
  saved = json.load(open(os.path.join(workdir, "result.json")))
  assert saved["params_embedding"] == 264 * 32 and np.isfinite(saved["eval"]["val"])  # ρ is an embedding row
  assert saved["flops_per_token"] > 6 * saved["params_total"]  # two slots per token
  losses = [json.loads(l)["loss"] for l in open(os.path.join(workdir, "metrics.jsonl")) if '"loss"' in l]
  assert len(losses) == STEPS and losses[-1] < losses[0]


def test_load_run_restores_the_final_parameters(run):
  workdir, trainer, _ = run
  config, family, params = runs.load_run(workdir)
  assert config.model.variant == "sps" and family.name == "sps"
  assert runs.checkpoint_step(workdir) == STEPS
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(jax.device_get(trainer.final_state.params))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_perturbed_forward_is_the_model(run):
  workdir, _, _ = run
  config, family, params = runs.load_run(workdir)
  batch = {k: jnp.asarray(v) for k, v in next(iter(common.eval_batches(config, 2, 1))).items()}
  want, _ = jax.jit(lambda p: common.token_nll(family, p, batch))(params)
  deltas = gradflow.zero_deltas(family, 2, config.data.seq_len)
  got, _ = jax.jit(lambda p, d: gradflow.perturbed_nll(family, p, batch, d))(params, deltas)
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_gradflow_routes_nothing_through_a_rho_that_no_one_sees(run, tmp_path):
  workdir, _, _ = run
  out = str(tmp_path / "gf" / "gradflow.json")
  assert gradflow.main([f"--workdir={workdir}", f"--out={out}", "--rows=2", "--max_offset=6"]) == 0
  res = json.load(open(out))
  assert os.path.exists(res["plot"]) and res["step"] == STEPS
  x, rho = res["streams"]["x"], res["streams"]["rho"]
  assert x["ratio_mean"][0] == pytest.approx(1.0) and rho["ratio_mean"][0] == pytest.approx(1.0)
  # w = 0: ρ_p is visible to ρ_p alone, so only ℓ_p trains the ρ weights at p ...
  assert all(r < 1e-6 for r in rho["ratio_mean"][1:]) and rho["count"][1] > 0
  # ... while the persistent x_p is read by every later slot of its document.
  assert all(r > 1e-4 for r in x["ratio_mean"][1:])


def test_persistent_window_probe(run, tmp_path):
  workdir, _, _ = run
  out = str(tmp_path / "pw.json")
  assert persistent_window.main([f"--workdir={workdir}", "--omega=4", "--docs=5", f"--out={out}"]) == 0
  res = json.load(open(out))
  assert res["docs"] == 5 and res["omega"] == 4 and os.path.exists(res["plot"])
  d = res["delta_by_position"]
  assert all(abs(v) < 1e-5 for v in d[:5] if v is not None)  # within ω nothing changes
  assert any(abs(v) > 1e-5 for v in d[5:] if v is not None) and res["targets_beyond_omega"] > 0
  assert res["probe_nll"] - res["base_nll"] == pytest.approx(
      sum(v * c for v, c in zip(d, res["count_by_position"]) if v is not None) / res["targets"], abs=1e-6)


def test_spans_split_packed_documents():
  seg = np.array([[1, 1, 2, 2, 2, 0], [3, 3, 3, 3, 3, 3]])
  w = np.ones_like(seg, dtype=float)
  w[0, 1] = 0
  assert persistent_window.spans(seg, w) == [(0, 0, 2), (0, 2, 5), (1, 0, 6)]
