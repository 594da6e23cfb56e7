"""nsl.hf: a random tiny standard model exported to LlamaForCausalLM gives nsl's logits (1e-4, fp32)
and greedy tokens in transformers, its tokenizer encodes as nsl's, and the import gives nsl's logits
back; other families and mismatched checkpoints are one line, exit 2."""

import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl import hf, hf_tokenizer, runs
from nsl.data import prepare, tokenizers
from tests.helpers import ROOT, fake_run, sotu_texts, tiny_config

# The [hf] extra (make install brings it): without it these fail at import, not skip.
import torch  # noqa: E402
import transformers  # noqa: E402
SAMPLE = "The Congress of 1790 — naïve café, 日本!\n  Peace,  and  trade's law."


# The logit comparison's bound (fp32, measured within 2.4e-7), which a small RoPE or norm error breaks
# by more than 5x (test_a_small_rope_or_norm_error_fails_the_comparison).
TOL = 1e-4


def _noisy(params):
  """Random norm gains (all ones would hide a swapped or missing norm), query and key projections
  10x their init, and a non-zero everything. At init the attention logits are ~0 and attention is
  uniform, which no position changes: RoPE's θ off by 10% moved the logits by 3e-5 and the default
  θ in place of 500 by 5e-4, hidden by or near TOL; at 10x, θ 2% off moves them by 1e-3."""
  key = iter(jax.random.split(jax.random.PRNGKey(3), 64))

  def bump(path, a):
    if path[-1].key == "scale":
      return a + 0.3 * jax.random.normal(next(key), a.shape)
    return a * 10 if path[-1].key in ("wq", "wk") else a
  return jax.tree_util.tree_map_with_path(bump, params)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(run dir, family, params, HF dir, tokenizer): a scanned 2-layer model, BPE of 300 ids,
  RoPE θ 500 and eps 1e-6 (not the defaults, so a dropped field shows)."""
  root = tmp_path_factory.mktemp("hf")
  text_dir = root / "text"
  text_dir.mkdir()
  for i, text in enumerate(sotu_texts(4, 3000)):
    (text_dir / f"d{i}.txt").write_text(text)
  data = str(root / "data")
  prepare.ensure_prepared(data, sources=[str(text_dir / "*.txt")], tokenizer="bpe", vocab_size=300, val_fraction=0.25)
  config = tiny_config(data, **{"data.tokenizer": "bpe", "data.tokenizer_vocab": 300, "model.vocab_size": 320,
                                "model.rope_theta": 500.0, "model.norm_eps": 1e-6, "model.scan_layers": True})
  run, fam, params = fake_run(str(root / "run"), config, transform=_noisy)
  out = str(root / "hf")
  assert hf.main(["export", run, out]) == 0
  tok = tokenizers.load_tokenizer(prepare.load_manifest(data)["tokenizer"], data)
  return run, fam, params, out, tok


def _nsl_logits(fam, params, ids):
  return np.asarray(fam.model.apply({"params": params}, jnp.asarray(ids), jnp.ones_like(jnp.asarray(ids))))


def test_transformers_gives_nsls_logits_and_greedy_tokens(exported):
  _, fam, params, out, _ = exported
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert (cfg["rope_theta"], cfg["rms_norm_eps"], cfg["tie_word_embeddings"]) == (500.0, 1e-6, True)
  model = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  ids = _ids()
  with torch.no_grad():
    theirs = model(torch.tensor(ids)).logits.numpy()
  ours = _nsl_logits(fam, params, ids)
  assert np.abs(theirs - ours).max() < TOL, np.abs(theirs - ours).max()
  prompt = ids[:1, :10]
  nsl_tokens = np.asarray(fam.generate(params, prompt, 8)[0])[0]
  with torch.no_grad():
    hf_tokens = model.generate(torch.tensor(prompt), max_new_tokens=8, do_sample=False, eos_token_id=None,
                               pad_token_id=0).numpy()[0, 10:]
  assert hf_tokens.tolist() == nsl_tokens.tolist()


@pytest.mark.parametrize("field,value", [("rope_theta", 510.0), ("rms_norm_eps", 2e-6)])
def test_a_small_rope_or_norm_error_fails_the_comparison(exported, tmp_path, field, value):
  """The export's RoPE θ 2% off (500 -> 510) or its norms' eps doubled, in the config transformers
  reads: its logits move by more than 5x TOL (measured ~1e-3 each), so the test above has a margin."""
  _, fam, params, out, _ = exported
  bad = tmp_path / "bad"
  shutil.copytree(out, bad)
  cfg = json.load(open(bad / "config.json"))
  cfg[field] = value
  if field == "rope_theta":  # transformers >= 5 reads rope_parameters
    cfg["rope_parameters"]["rope_theta"] = value
  json.dump(cfg, open(bad / "config.json", "w"))
  model = transformers.LlamaForCausalLM.from_pretrained(str(bad), dtype=torch.float32).eval()
  ids = _ids()
  with torch.no_grad():
    theirs = model(torch.tensor(ids)).logits.numpy()
  assert np.abs(theirs - _nsl_logits(fam, params, ids)).max() > 5 * TOL


def _ids():
  return np.random.default_rng(0).integers(0, 300, (2, 24))


def test_tokenizer_encodes_as_nsls(exported):
  *_, out, tok = exported
  theirs = transformers.AutoTokenizer.from_pretrained(out)
  text = SAMPLE + " " + sotu_texts(1, 800)[0]
  assert theirs(text)["input_ids"] == tok.encode(text)
  assert theirs.eos_token_id == tok.eos_id and theirs.decode(tok.encode(text)) == text


def test_import_gives_nsls_logits_and_a_restorable_run(exported, tmp_path):
  run, fam, params, out, _ = exported
  config = runs.load_config(run)
  hf.import_(out, str(tmp_path / "back"), config)
  config2, fam2, params2 = runs.load_run(str(tmp_path / "back"))
  ids = np.random.default_rng(1).integers(0, 320, (1, 16))
  np.testing.assert_allclose(_nsl_logits(fam2, params2, ids), _nsl_logits(fam, params, ids), atol=1e-6)
  assert nsl_config.to_dict(config2) == nsl_config.to_dict(config)


def test_a_checkpoint_saved_by_transformers_imports(tmp_path):
  """The real import case: LlamaForCausalLM's own save_pretrained directory, bfloat16 weights."""
  cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=500.0,
                                 tie_word_embeddings=True, max_position_embeddings=64)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(str(tmp_path / "hf"))
  config = tiny_config(str(tmp_path / "nodata"), **{"model.vocab_size": 96, "model.norm_eps": 1e-6,
                                                   "model.rope_theta": 500.0})
  hf.import_(str(tmp_path / "hf"), str(tmp_path / "run"), config)
  _, fam, params = runs.load_run(str(tmp_path / "run"))
  ids = np.random.default_rng(2).integers(0, 96, (2, 20))
  with torch.no_grad():
    theirs = model.float()(torch.tensor(ids)).logits.numpy()
  assert np.abs(theirs - _nsl_logits(fam, params, ids)).max() < 1e-4


def test_untied_head_round_trips_through_the_state_dict():
  config = tiny_config("unused", **{"model.tie_embeddings": False})
  from nsl.models import registry

  fam = registry.get_family(config)
  params = jax.tree.map(np.asarray, nn.unbox(fam.init(jax.random.PRNGKey(0))))
  sd = hf.to_hf(config, params)
  assert "lm_head.weight" in sd and hf.llama_config(config, 256)["tie_word_embeddings"] is False
  back = hf.from_hf(config, sd, params, "test")
  jax.tree.map(np.testing.assert_array_equal, back, params)


@pytest.mark.parametrize("spec, word", [("configs/sps.py:sps_tiny", "SPS"), ("configs/nextlat.py:nextlat_tiny", "NextLat"),
                                        ("configs/dd.py:dd_tiny", "double decoder"), ("configs/lift.py:lift_tiny", "LIFT")])
def test_other_families_are_refused_with_why(spec, word, tmp_path, capsys):
  config = nsl_config.load_config(os.path.join(ROOT, spec))
  (tmp_path / "config.json").write_text(json.dumps(nsl_config.to_dict(config)))
  assert hf.main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "no Hugging Face architecture" in err and word in err, err


def test_a_mismatched_checkpoint_and_mup_are_one_line(exported, tmp_path, capsys):
  *_, out, _ = exported
  code = hf.main(["import", out, str(tmp_path / "x"), f"--config={ROOT}/configs/tiny.py"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1 and "--config.model.vocab_size=320" in err, err
  bad = tmp_path / "bad"  # config.json agrees, a tensor does not
  bad.mkdir()
  (bad / "config.json").write_text(open(os.path.join(out, "config.json")).read())
  sd = hf.read_tensors(out)
  sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"][:, :-1]
  hf.require_safetensors().save_file(sd, str(bad / hf.WEIGHTS))
  run_config = runs.load_config(exported[0])
  with pytest.raises(Exception, match=r"up_proj.weight has shape \[96, 31\], the config needs \[96, 32\]"):
    hf.import_(str(bad), str(tmp_path / "y"), run_config)
  with pytest.raises(Exception, match="μP"):
    hf.check_exportable(tiny_config("unused", **{"model.mup_base_width": 16}))
  with pytest.raises(Exception, match="window"):
    hf.check_exportable(tiny_config("unused", **{"model.window": 8}))


def test_tiktoken_ranks_become_the_same_bpe():
  """Ranks of a BPE trained here (bytes, then each merge's token) encode as tiktoken does."""
  import tiktoken

  text = " ".join(sotu_texts(3, 4000))
  tok = tokenizers.BpeTokenizer.train([text], 400)
  vocab = json.loads(tok.to_json())["model"]["vocab"]
  decode = {c: b for b, c in hf_tokenizer.bytes_to_unicode().items()}
  ranks = {bytes(decode[c] for c in s): i for s, i in vocab.items() if s != tokenizers.EOS_TEXT}
  ranks = {t: r for r, t in enumerate(sorted(ranks, key=lambda t: (len(t) > 1, ranks[t])))}
  ours = hf_tokenizer.from_ranks(ranks, len(ranks))
  theirs = tiktoken.Encoding("t", pat_str=tokenizers.GPT2_PAT, mergeable_ranks=ranks, special_tokens={})
  sample = SAMPLE + sotu_texts(5, 3000)[4]
  assert ours.encode(sample).ids == theirs.encode_ordinary(sample)
