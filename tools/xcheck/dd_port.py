"""The double-decoder authors' weights in nsl, and nsl's forward on their check batch (numpy + nsl
only: the fast test tests/models/test_dd_xcheck.py runs it on a committed fixture without torch).

`to_nsl(model, state, config)` maps their state_dict (PyTorch names, Linear weights [out, in]) onto
nsl's parameter tree: Linear weights transposed, fused projections split, q/k head columns
permuted from torchtune's interleaved RoPE pairs (2j, 2j+1) to nsl's rotate-half pairs
(j, j + d_head/2), which leaves every q·k unchanged. `nsl_check(model, params, config, ...)`
gives nsl's logits and loss on the batch their side scored.
"""

from __future__ import annotations

import numpy as np

CONFIGS = {"dd": "configs/dd.py:dd_tiny", "dec": "configs/dd.py:decoder_only_tiny", "sed": "configs/dd.py:sed_tiny"}


def rope_perm(head_dim: int) -> np.ndarray:
  return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


class _Mapper:
  def __init__(self, state, d: int, h: int):
    self.s, self.d, self.h, self.hd = state, d, h, d // h
    self.used: set[str] = set()

  def get(self, key):
    self.used.add(key)
    return np.asarray(self.s[key], np.float32)

  def heads(self, w_out_in, rope: bool):
    """A [d_out = H·Dh, d] projection -> nsl's [d, H, Dh] (RoPE columns permuted)."""
    w = w_out_in.T.reshape(self.d, self.h, self.hd)
    return w[..., rope_perm(self.hd)] if rope else w

  def attn(self, prefix, fused: bool):
    if fused:
      q, k, v = np.split(self.get(prefix + "qkv.weight"), 3, axis=0)
    else:
      q = self.get(prefix + "q_proj.weight")
      k, v = np.split(self.get(prefix + "kv_proj.weight"), 2, axis=0)
    wo = self.get(prefix + "out_proj.weight").T.reshape(self.h, self.hd, self.d)
    return {"wq": self.heads(q, True), "wk": self.heads(k, True), "wv": self.heads(v, False), "wo": wo}

  def mlp(self, prefix):
    return {"w_in": self.get(prefix + "mlp.0.weight").T, "w_out": self.get(prefix + "mlp.2.weight").T}

  def norm(self, key, bias: bool = False):
    out = {"scale": self.get(key + ".weight")}
    if bias:
      out["bias"] = self.get(key + ".bias")
    return out

  def basic(self, prefix):
    """Their BasicLayer (RMSNorm, self attention, RMSNorm, GELU MLP) -> nsl's Block."""
    return {"attn": self.attn(prefix + "self_attn.", True), "attn_norm": self.norm(prefix + "norm1"),
            "mlp_norm": self.norm(prefix + "norm2"), "mlp": self.mlp(prefix)}

  def stack(self, prefix: str, n: int, final_norm: str):
    """n of their BasicLayers and the LayerNorm after them -> nsl's layers.Stack."""
    out = {f"block_{i}": self.basic(f"{prefix}.{i}.") for i in range(n)}
    out["final_norm"] = self.norm(final_norm, bias=True)
    return out

  def two_stacks(self, n_layers: int, n_second: int, names: tuple[str, str, str], layer):
    """Their DD and SED share a layout: `encoder_layers` (BasicLayers) and `encoder_norm`, then
    `decoder_layers.i.` and `output_norm`. -> nsl's first stack, its second model's layers
    (`layer(prefix)` maps one) and final norm, under `names` (stack, layer prefix, norm)."""
    stack, prefix, norm = names
    out = {stack: self.stack("encoder_layers", n_layers - n_second, "encoder_norm"),
           norm: self.norm("output_norm", bias=True)}
    out.update({f"{prefix}_{i}": layer(f"decoder_layers.{i}.") for i in range(n_second)})
    return out

  def gen_layer(self, p):
    """Their DD decoder layer (RMSNorm, combo attention, RMSNorm, GELU MLP) -> nsl's GenLayer."""
    return {"combo": {"attn": self.attn(p + "combo_attn.", False)}, "attn_norm": self.norm(p + "norm1"),
            "mlp_norm": self.norm(p + "norm2"), "mlp": self.mlp(p)}

  def sed_layer(self, p):
    """Their SED decoder layer (self, cross, MLP, each after its RMSNorm) -> nsl's DecoderLayer."""
    return {"attn": self.attn(p + "self_attn.", True), "cross": self.attn(p + "cross_attn.", False),
            "attn_norm": self.norm(p + "norm1"), "cross_norm": self.norm(p + "norm2"),
            "mlp_norm": self.norm(p + "norm3"), "mlp": self.mlp(p)}


def to_nsl(model: str, state, config) -> dict:
  """Their state_dict (a mapping of numpy arrays) -> nsl params for `config` (an *_tiny config)."""
  m = config.model
  mp = _Mapper(state, m.d_model, m.n_heads)
  n_layers = m.n_layers
  if model == "dec":
    params = {"trunk": mp.stack("layers", n_layers, "output_norm")}
  elif model == "dd":
    params = mp.two_stacks(n_layers, int(config.double_decoder.gen_layers), ("context", "gen", "gen_norm"), mp.gen_layer)
  elif model == "sed":
    params = mp.two_stacks(n_layers, int(config.sed.gen_layers), ("encoder", "dec", "dec_norm"), mp.sed_layer)
  else:
    raise ValueError(f"model {model!r} is not one of {tuple(CONFIGS)}")
  params["embed"] = {"embedding": mp.get("embedding.weight")}
  left = {k for k in state if not k.startswith("__")} - mp.used - {"output_projection.weight"}
  if left:
    raise ValueError(f"their parameters {sorted(left)} have no place in nsl's {model} model")
  return params


def load_config(model: str, **overrides):
  from nsl import config as nsl_config

  c = nsl_config.load_config(CONFIGS[model], [(k, str(v)) for k, v in overrides.items()])
  nsl_config.validate(c)
  return c


def check_batch(tokens_BT1):
  """nsl's batch for rows of T + 1 tokens (segment ids from the EOS positions, as the pipeline)."""
  from nsl.data import pipeline

  return {"tokens": np.asarray(tokens_BT1, np.int32), "segment": pipeline.segment_ids(np.asarray(tokens_BT1), 0)}


def sed_inputs(sed_arr):
  """Their SED batch [4, B, L] (encoder ids, decoder ids, labels, encoder lengths) -> nsl's
  (enc_tokens, enc_segment, dec_inputs, dec_segment), targets, weights."""
  enc, dec, labels, lens = (np.asarray(a) for a in sed_arr)
  enc_seg = (np.arange(enc.shape[1])[None] < lens[:, :1]).astype(np.int32)
  weights = (labels != -100)
  dec_seg = np.ones_like(dec, dtype=np.int32)  # their decoder self attention is causal over the padded row
  return (enc.astype(np.int32), enc_seg, dec.astype(np.int32), dec_seg), np.where(weights, labels, 0).astype(np.int32), \
      weights.astype(np.float32)


def nsl_logits(model: str, family, params, tokens_BT1=None, blocks_T=None, sed_arr=None):
  """nsl's logits [B, T, V], targets, weights on their check batch."""
  import jax.numpy as jnp
  from nsl.nn import cross_entropy

  if model == "sed":
    inputs, targets, weights = sed_inputs(sed_arr)
    logits = family.model.apply({"params": params}, *map(jnp.asarray, inputs))
    return logits, jnp.asarray(targets), jnp.asarray(weights)
  batch = check_batch(tokens_BT1)
  _, targets, _, weights = cross_entropy.next_token_targets(batch)
  if model == "dd":
    logits = family.token_logits(params, batch, block_BT=jnp.asarray(blocks_T, jnp.int32)[None])
  else:
    logits = family.token_logits(params, batch)
  return logits, targets, weights


def nsl_check(model: str, family, params, ref: dict, tokens_BT1=None, blocks_T=None) -> dict:
  """Max |Δlogit| and |ΔCE| of nsl against their `ref` (the init npz: __logits, __loss, __labels),
  and whether nsl's loss weights are their labels' mask."""
  from nsl.nn import cross_entropy

  logits, targets, weights = nsl_logits(model, family, params, tokens_BT1, blocks_T, ref.get("__sed"))
  ce, _ = cross_entropy.masked_cross_entropy(logits, targets, weights)
  logits = np.asarray(logits)
  their = np.asarray(ref["__logits"])
  real = np.asarray(ref["__labels"]) != -100
  return {"max_abs_dlogit": float(np.abs(logits - their)[real].max()),
          "max_abs_dlogit_all": float(np.abs(logits - their).max()),
          "ce_nsl": float(ce), "ce_theirs": float(ref["__loss"]), "abs_dce": abs(float(ce) - float(ref["__loss"])),
          "weights_equal_their_labels": bool((np.asarray(weights) > 0).tolist() == real.tolist())}
