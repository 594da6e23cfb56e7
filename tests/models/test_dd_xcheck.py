"""nsl's double decoder and decoder-only against the authors' code, without torch: their freshly
initialised weights (rounded to float16), a check batch and their logits, loss and labels on it,
made by `python tools/xcheck/dd.py fixture` (docs/xcheck/dd.md) and committed under fixtures/.
Their weights mapped into nsl (tools/xcheck/dd_port.py) must give their logits and loss to 1e-4,
and nsl's loss weights must be their labels' mask. The fixture's size (d 64, one head of 64, μP
base width 32 and base head size 32) makes every μP multiplier differ from its standard value."""

import os
import sys

import jax
import numpy as np
import pytest

from nsl.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "xcheck"))
import dd as xcheck_dd  # noqa: E402
import dd_port  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def _check(model: str, **overrides):
  ref = dict(np.load(os.path.join(FIXTURES, f"dd_xcheck_{model}.npz")))
  config = xcheck_dd.fixture_config(model)
  for k, v in overrides.items():
    config.model[k] = v
  family = registry.get_family(config)
  params = jax.tree.map(jax.numpy.asarray, dd_port.to_nsl(model, ref, config))
  return dd_port.nsl_check(model, family, params, ref, ref["__tokens"], ref["__blocks"])


@pytest.mark.parametrize("model", ["dd", "dec"])
def test_their_weights_give_their_logits_and_loss(model):
  res = _check(model)
  assert res["weights_equal_their_labels"], res
  assert res["max_abs_dlogit"] <= 1e-4 and res["abs_dce"] <= 1e-4, res


@pytest.mark.parametrize("field,value", [("mup_readout", "linear"), ("mup_base_head_dim", 1),
                                         ("document_mask", True), ("norm_eps", 1e-5)])
def test_each_earlier_reading_breaks_the_match(field, value):
  """nsl's earlier readings (logits × 1/m, q·k/d_head, documents masked, RMSNorm eps 1e-5 instead
  of torch's float32 epsilon) each move the logits well past the tolerance: the check can fail."""
  res = _check("dd", **{field: value})
  assert res["max_abs_dlogit"] > 1e-3, res  # ten times the tolerance
