"""`nsl.evals.nll --feed` on a LIFT run: own-state NLL (the paper's metric) equals a token-by-token
own-state decode of every document, and each feed is recorded under its own key."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from nsl.data import pipeline
from nsl.evals import nll
from nsl.models import lift
from tests.helpers import make_corpus, tiny_config
from tests.models.test_lift import loud_run


def test_nll_feeds_of_a_lift_run(tmp_path, capsys):
  data = make_corpus(str(tmp_path), n=60, chars=20)  # short documents: windows hold several
  c = tiny_config(data, **{"model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32, "data.seq_len": 24,
                           "model.attention_impl": "xla"})
  c.family, c.model.variant = "lift", "lift"
  c.lift = lift.default_lift_config()
  c.lift.teacher, c.lift.top_k, c.lift.adapt_fraction = "labels", 8, 0.0
  workdir, fam, params = loud_run(str(tmp_path / "run"), c)

  args = [f"--workdir={workdir}", "--max_batches=1", "--batch_size=8"]
  for feed in ("", "teacher", "bias"):  # the default feed is own
    assert nll.main(args + ([f"--view={feed}"] if feed else [])) == 0
    capsys.readouterr()
  with open(os.path.join(workdir, "result.json")) as f:
    result = json.load(f)
  ev = result["eval"]
  assert set(ev) == {"val", "val_feed_teacher", "val_feed_bias"} and len(set(ev.values())) == 3
  assert result["eval_details"]["val"]["view"] == "own"

  # Reference: every document of the scored batch alone (right-padded: causal), decoded token by
  # token by rerunning its prefix with the states of the previous run (`recompute_feedback_logits`).
  batch = next(iter(pipeline.make_eval_batches(data, "val", seq_len=24, batch_size=8, max_batches=1)))
  tokens, segment = np.asarray(batch["tokens"]), np.asarray(batch["segment"])
  docs = [tokens[r, segment[r] == d] for r in range(len(tokens)) for d in np.unique(segment[r]) if d > 0]
  docs = [d for d in docs if len(d) >= 2]
  assert len(docs) > int((segment.max(1) > 0).sum())  # packed rows really were split
  padded = np.zeros((len(docs), 24), np.int32)
  for i, d in enumerate(docs):
    padded[i, :len(d) - 1] = d[:-1]
  logits = np.asarray(jax.jit(fam.recompute_feedback_logits)(params, jnp.asarray(padded)))
  total = sum(float(optax.softmax_cross_entropy_with_integer_labels(jnp.asarray(logits[i, :len(d) - 1]),
                                                                     jnp.asarray(d[1:])).sum())
              for i, d in enumerate(docs))
  count = sum(len(d) - 1 for d in docs)
  np.testing.assert_allclose(ev["val"], total / count, rtol=1e-4)
