"""A missing optional extra is one line naming it: `make demo` installs nsl's core dependencies
only (README.md, "The two commands"), so a user who then reaches for GCS, lm-eval, the Hugging Face
export, a hub corpus or W&B learns the `pip install -e '.[EXTRA]'` from the error itself. The
package is made unimportable here (`sys.modules[name] = None`); libtpu's message (nsl.topology) is
checked by hand in a core-only venv, since JAX finds its TPU plugin once per process."""

import os
import re
import subprocess
import sys
import tomllib

import ml_collections
import pytest

from nsl.errors import NslError
from tests.helpers import ROOT


def _gcs():
  """In a fresh interpreter: fsspec and etils.epath keep the gs:// class of a test that ran before in
  this one, so gcsfs would never be imported again here. A closed localhost port stands in for GCS:
  the suite never sends a request off this host."""
  code = ("import sys; sys.modules['gcsfs'] = None\n"
          "from nsl import storage\nfrom nsl.errors import NslError\n"
          "try:\n  storage.check_bucket('gs://nsl-no-such-bucket/run', '--workdir')\n"
          "except NslError as e:\n  print(e)\n")
  env = dict(os.environ, STORAGE_EMULATOR_HOST="http://127.0.0.1:9")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
  raise NslError(out.stdout.strip() or out.stderr.strip()[-500:])


def _lmeval():
  from nsl.evals import zeroshot_tasks
  zeroshot_tasks.require_lm_eval()


def _hf():
  from nsl import hf
  hf.require_safetensors()


def _hub():
  from nsl.data import sources
  list(sources.iter_source("hf:wikitext:wikitext-2-raw-v1:train"))


def _tfds():
  from nsl.data import sources
  list(sources.iter_source("tfds:c4/en:3.0.1:train"))


def _wandb():
  from nsl.train import observe
  observe.check_wandb(ml_collections.ConfigDict({"log": {"wandb": True}}))


SITES = [("gcsfs", _gcs, "gcs"), ("lm_eval", _lmeval, "lmeval"), ("safetensors", _hf, "hf"),
         ("datasets", _hub, "data"), ("tensorflow_datasets", _tfds, "data"), ("wandb", _wandb, "wandb")]


@pytest.mark.parametrize("package, call, extra", SITES, ids=[s[0] for s in SITES])
def test_a_missing_extra_is_one_line_naming_it(package, call, extra, monkeypatch):
  for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + [package]:
    monkeypatch.setitem(sys.modules, name, None)  # `import package` raises ImportError
  with pytest.raises(NslError) as raised:
    call()
  message = str(raised.value)
  assert "\n" not in message and f"pip install -e '.[{extra}]'" in message, message
  with open(f"{ROOT}/pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  assert any(re.match(re.escape(package).replace("_", "[-_]"), dep, re.I) for dep in extras[extra]), (
      f"the [{extra}] extra that the message names does not install {package}")
