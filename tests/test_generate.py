"""nsl.generate: the streamed greedy text is the family's `generate` output, top-1 sampling is greedy,
`decode.truncate` keeps what top-k / top-p say, and bad flags are one line, exit 2."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl import decode, generate
from nsl.data import prepare, tokenizers
from tests.helpers import fake_run, make_corpus, tiny_config

PROMPT = "Fellow citizens of the Senate"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(run dir, family, params, tokenizer) of a random tiny standard model on the byte corpus."""
  root = tmp_path_factory.mktemp("gen")
  data = make_corpus(str(root), n=3, chars=2000)
  run_dir, fam, params = fake_run(str(root / "run"), tiny_config(data))
  tok = tokenizers.load_tokenizer(prepare.load_manifest(data)["tokenizer"], data)
  return run_dir, fam, params, tok


def _generate(capsys, *flags):
  code = generate.main(list(flags))
  out, err = capsys.readouterr()
  return code, out, err


def test_greedy_stream_is_the_familys_generate(run, capsys):
  run_dir, fam, params, tok = run
  prompt = tok.encode(PROMPT)
  want = np.asarray(fam.generate(params, jnp.asarray([prompt]), 8)[0])[0].tolist()
  want = want[:want.index(tok.eos_id)] if tok.eos_id in want else want
  code, out, err = _generate(capsys, f"--run={run_dir}", f"--prompt={PROMPT}", "--max_new_tokens=8")
  assert code == 0 and out == tok.decode(want) + "\n", (out, err)


def test_truncate_keeps_top_k_then_the_nucleus():
  logits = jnp.log(jnp.asarray([[0.05, 0.4, 0.1, 0.3, 0.15]]))
  kept = lambda **kw: np.isfinite(np.asarray(decode.truncate(logits, **kw)))[0].tolist()
  assert kept(top_k=2) == [False, True, False, True, False]
  assert kept(top_p=0.7) == [False, True, False, True, False]  # 0.4 + 0.3 reaches 0.7
  assert kept(top_p=0.71) == [False, True, False, True, True]  # the crossing token stays
  assert kept(top_k=4, top_p=0.99) == [False, True, True, True, True]
  assert kept() == [True] * 5
  draws = jax.vmap(lambda k: decode.sample(decode.truncate(logits, top_k=2), k, 1.0))(
      jax.random.split(jax.random.PRNGKey(0), 64))
  assert set(np.asarray(draws)[:, 0].tolist()) == {1, 3}
  wide = jax.random.normal(jax.random.PRNGKey(1), (4, 300))
  greedy = generate.draw(wide, jax.random.PRNGKey(2), 0.0, 0, 1.0)
  for key in range(3):  # top-1 sampling at any temperature is greedy
    np.testing.assert_array_equal(generate.draw(wide, jax.random.PRNGKey(key), 0.7, 1, 1.0), greedy)


@pytest.mark.parametrize("flags, words", [
    (("--temperature=-1",), "--temperature"),
    (("--top_k=5",), "--temperature > 0"),
    (("--temperature=1", "--top_p=0"), "--top_p"),
    (("--max_new_tokens=0",), "--max_new_tokens"),
    (("--speculative",), "NextLat"),
    (("--prompt=",), "empty"),
])
def test_bad_flags_are_one_line(run, capsys, flags, words):
  code, out, err = _generate(capsys, f"--run={run[0]}", f"--prompt={PROMPT}", *flags)
  assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err
  code, _, err = _generate(capsys, f"--run={os.path.dirname(run[0])}/nowhere", "--prompt=x")
  assert code == 2 and "config.json" in err
