"""nsl's NextLat held against the authors' code in CI, without torch (issue #45;
docs/xcheck/nextlat.md): their freshly initialised weights at a tiny size, one path-star batch,
and their logits and loss terms on it (data written by `tools/xcheck/nextlat.py port --fixture`
from their own model, not code), ported into nsl through the harness's own mapping: nsl must give
the same logits and the same CE, L_next-h and L_KL to 1e-4."""

import importlib.util
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "nextlat_port_fixture.npz")
TOOL = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "xcheck", "nextlat.py")


def _tool():
  spec = importlib.util.spec_from_file_location("xcheck_nextlat", TOOL)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_authors_initial_weights_give_their_logits_and_loss_terms():
  tool = _tool()
  with np.load(FIXTURE) as z:
    data = {k: z[k] for k in z.files}
  family = tool._family(size="fixture")
  params = tool.ported_params(family, {k[2:]: v for k, v in data.items() if k.startswith("w/")})
  terms = dict(zip(tool.TERMS, data["terms"].tolist()))
  out = tool.port_check(family, params, data["tokens"], data["segment"], data["logits"], terms, tol=1e-4)
  assert out["pass"], out
  assert min(terms["next_h"], terms["kl"]) > 1e-3  # every term is live, so each comparison means something
