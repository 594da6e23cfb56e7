"""Converts between nsl's standard transformer and a Hugging Face `LlamaForCausalLM` checkpoint.

`python -m nsl.hf export RUN_DIR OUT_DIR` writes a directory that `transformers` loads with
`LlamaForCausalLM.from_pretrained(OUT_DIR)` and `AutoTokenizer.from_pretrained(OUT_DIR)`:
`model.safetensors`, `config.json`, `generation_config.json` and the run's tokenizer
(nsl.hf_tokenizer). `python -m nsl.hf import HF_DIR OUT_DIR --config=FILE` turns a Llama
checkpoint into an nsl run directory (config.json and a step-0 checkpoint) that
`nsl.launch --restore_from=OUT_DIR`, `nsl.generate --run=OUT_DIR` and the evaluations read.

The mapping is exact (docs/guide/huggingface.md#the-mapping): nsl's standard model is Llama's
architecture (pre-norm RMSNorm, rotate-half RoPE over each head's two halves, SwiGLU, no biases,
scores scaled by 1/sqrt(head_dim)) with one K/V head per query head. Only the matrices' layout
differs: nsl stores `x @ W` weights [in, out] (attention split per head), torch's `nn.Linear`
[out, in]. Options Llama cannot hold (μP's logit and query multipliers, a GELU MLP, a final
LayerNorm, a sliding window) and every other family are refused with one line, as is a config
field this module does not know (it might change the model's function).

Only numpy and `safetensors` are needed (the `[hf]` extra); torch and transformers are used by
the tests that check the logits, not here.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from nsl.errors import ArgumentParser, ConfigError, NslError, cli_main

# config.model fields that do not change the function the parameters compute (how it is computed,
# stored or initialised), and the ones this module maps or checks. Anything else is refused.
_FUNCTION_FREE = {"variant", "init_std", "dtype", "remat", "scan_layers", "attention_impl", "attention_chunk",
                  "cpu_kernels", "init", "scaled_out_init", "scaled_mlp_out_init", "document_mask",
                  "mup_base_head_dim", "mup_readout"}
_MAPPED = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "rope_theta", "norm_eps", "tie_embeddings",
           "mup_base_width", "mlp", "final_norm", "window"}

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def require_safetensors():
  try:
    import safetensors.numpy as st
  except ImportError:
    raise NslError("nsl.hf needs the safetensors package: pip install -e '.[hf]'") from None
  return st


# ------------------------------------------------------------------------------------------ config


def check_exportable(config) -> None:
  """ConfigError (one line) unless `config` is a model LlamaForCausalLM holds exactly: its family
  maps onto that architecture (`Family.hugging_face`, which says why not) and its fields do."""
  architecture = _family_class(config).hugging_face()
  if architecture != "LlamaForCausalLM":
    raise ConfigError(f"family {config.family!r} maps onto {architecture}; nsl.hf converts LlamaForCausalLM")
  m = config.model
  unknown = sorted(set(m.keys()) - _FUNCTION_FREE - _MAPPED)
  if unknown:
    raise ConfigError(f"config.model.{unknown[0]} is not known to nsl.hf, so the export could change the model's "
                      "function; teach nsl/hf.py how Llama holds it")
  dims = _dims(config)  # the model's fields with the schema's defaults (`nsl.nn.layers.Dims`)
  if dims.mup_base_width:
    raise ConfigError(f"config.model.mup_base_width={dims.mup_base_width} (μP) multiplies the logits and queries by "
                      "width factors that LlamaForCausalLM has no field for; export a run trained with μP off")
  if dims.mlp != "swiglu":
    raise ConfigError(f"config.model.mlp={dims.mlp!r}: LlamaForCausalLM's MLP is SwiGLU; export a swiglu run")
  if dims.final_norm != "rmsnorm":
    raise ConfigError(f"config.model.final_norm={dims.final_norm!r}: LlamaForCausalLM ends with an RMSNorm; "
                      "export an rmsnorm run")
  if m.window is not None:
    raise ConfigError(f"config.model.window={m.window}: LlamaForCausalLM attends to every earlier token (no "
                      "sliding window); export a run with window None")


def _dims(config):
  from nsl.nn.layers import Dims

  return Dims.from_config(config)


def _family_class(config):
  from nsl.models import registry

  return registry.get_family_class(config.family)


def llama_config(config, eos_id: int | None) -> dict:
  """The `config.json` of the LlamaForCausalLM that holds `config`'s standard model."""
  check_exportable(config)
  m = config.model
  d, h = int(m.d_model), int(m.n_heads)
  theta = float(m.rope_theta)
  out = {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "vocab_size": int(m.vocab_size), "hidden_size": d, "intermediate_size": int(m.d_ff),
      "num_hidden_layers": int(m.n_layers), "num_attention_heads": h, "num_key_value_heads": h,
      "head_dim": d // h, "hidden_act": "silu", "max_position_embeddings": int(config.data.seq_len),
      "rms_norm_eps": float(m.norm_eps), "initializer_range": float(m.init_std),
      # transformers < 5 reads rope_theta, >= 5 rope_parameters (and converts the former)
      "rope_theta": theta, "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "rope_scaling": None,
      "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
      "tie_word_embeddings": bool(_dims(config).tie_embeddings), "torch_dtype": "float32", "use_cache": True,
  }
  if eos_id is not None:  # nsl has no BOS: documents are separated by EOS, as GPT-2's are
    out.update(bos_token_id=int(eos_id), eos_token_id=int(eos_id))
  return out


def check_importable(hf: dict, config, where: str) -> None:
  """NslError (one line) unless the HF Llama config `hf` is the architecture of nsl's `config`."""
  check_exportable(config)  # the config's family maps onto Llama, or one line says why not
  if hf.get("model_type") != "llama":
    raise NslError(f"{where}: model_type={hf.get('model_type')!r}; nsl.hf imports Llama checkpoints")
  heads = hf.get("num_attention_heads")
  if hf.get("num_key_value_heads", heads) != heads:
    raise NslError(f"{where}: num_key_value_heads={hf.get('num_key_value_heads')} != num_attention_heads={heads} "
                   "(grouped-query attention); nsl's attention has one K/V head per query head")
  for key, ok in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
    if hf.get(key, ok) != ok:
      raise NslError(f"{where}: {key}={hf.get(key)!r}; nsl's standard model has {key}={ok!r}")
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if rope.get("rope_type", rope.get("type", "default")) != "default":
    raise NslError(f"{where}: RoPE scaling {rope!r}; nsl implements plain RoPE (rope_type 'default')")
  hidden = hf.get("hidden_size")
  if heads and hidden and hf.get("head_dim", hidden // heads) != hidden // heads:
    raise NslError(f"{where}: head_dim={hf.get('head_dim')} != hidden_size/num_attention_heads; nsl's heads "
                   "split d_model evenly")
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
  pairs = (("vocab_size", "vocab_size", hf.get("vocab_size")), ("hidden_size", "d_model", hidden),
           ("num_hidden_layers", "n_layers", hf.get("num_hidden_layers")),
           ("num_attention_heads", "n_heads", heads), ("intermediate_size", "d_ff", hf.get("intermediate_size")),
           ("rms_norm_eps", "norm_eps", hf.get("rms_norm_eps")), ("rope_theta", "rope_theta", theta),
           ("tie_word_embeddings", "tie_embeddings", hf.get("tie_word_embeddings", True)))
  for hf_key, key, value in pairs:
    ours = getattr(_dims(config), key)
    if isinstance(ours, float) or isinstance(value, float):
      same = value is not None and np.isclose(float(value), float(ours), rtol=1e-6, atol=0)
    else:
      same = value == ours
    if not same:
      raise NslError(f"{where}: {hf_key}={value!r} but config.model.{key}={ours!r}; pass "
                     f"--config.model.{key}={value} (or a config of this checkpoint's shape)")


# ------------------------------------------------------------------------------------------ weights


def _layers(trunk, n_layers: int):
  from nsl.nn import layers

  return [layers.layer_params(trunk, i) for i in range(n_layers)]


def to_hf(config, params) -> dict[str, np.ndarray]:
  """nsl parameters (scanned or unrolled, unboxed) -> LlamaForCausalLM's state dict (float32,
  torch `nn.Linear` layout [out, in])."""
  check_exportable(config)
  f32 = lambda a: np.ascontiguousarray(np.asarray(a, np.float32))
  d = int(config.model.d_model)
  out = {"model.embed_tokens.weight": f32(params["embed"]["embedding"]),
         "model.norm.weight": f32(params["trunk"]["final_norm"]["scale"])}
  if not _dims(config).tie_embeddings:
    out["lm_head.weight"] = f32(params["embed"]["head"])
  for i, p in enumerate(_layers(params["trunk"], int(config.model.n_layers))):
    pre = f"model.layers.{i}."
    a, mlp = p["attn"], p["mlp"]
    for name, w in (("q", a["wq"]), ("k", a["wk"]), ("v", a["wv"])):  # [D, H, hd] -> [H·hd, D]
      out[pre + f"self_attn.{name}_proj.weight"] = f32(np.asarray(w).reshape(d, -1).T)
    out[pre + "self_attn.o_proj.weight"] = f32(np.asarray(a["wo"]).reshape(-1, d).T)  # [H, hd, D] -> [D, H·hd]
    out[pre + "mlp.gate_proj.weight"] = f32(np.asarray(mlp["w_gate"]).T)
    out[pre + "mlp.up_proj.weight"] = f32(np.asarray(mlp["w_up"]).T)
    out[pre + "mlp.down_proj.weight"] = f32(np.asarray(mlp["w_down"]).T)
    out[pre + "input_layernorm.weight"] = f32(p["attn_norm"]["scale"])
    out[pre + "post_attention_layernorm.weight"] = f32(p["mlp_norm"]["scale"])
  return out


def from_hf(config, tensors: dict[str, np.ndarray], abstract, where: str):
  """LlamaForCausalLM's state dict -> nsl parameters in `abstract`'s form (its shapes, scanned or
  not); NslError naming the first tensor that is missing or has another shape."""
  m = config.model
  d, h = int(m.d_model), int(m.n_heads)
  hd = d // h

  def get(name, shape):
    if name not in tensors:
      raise NslError(f"{where}: tensor {name} is missing; is this a LlamaForCausalLM checkpoint of "
                     f"{int(m.n_layers)} layers?")
    t = np.asarray(tensors[name], np.float32)
    if t.shape != shape:
      raise NslError(f"{where}: tensor {name} has shape {list(t.shape)}, the config needs {list(shape)}; "
                     "use the config this checkpoint was trained with")
    return t

  f, v = int(m.d_ff), int(m.vocab_size)
  embed = {"embedding": get("model.embed_tokens.weight", (v, d))}
  if not _dims(config).tie_embeddings:
    embed["head"] = get("lm_head.weight", (v, d))
  trunk = {"final_norm": {"scale": get("model.norm.weight", (d,))}}
  for i in range(int(m.n_layers)):
    pre = f"model.layers.{i}."
    qkv = {f"w{n}": get(pre + f"self_attn.{n}_proj.weight", (h * hd, d)).T.reshape(d, h, hd) for n in "qkv"}
    trunk[f"block_{i}"] = {
        "attn": {**qkv, "wo": get(pre + "self_attn.o_proj.weight", (d, h * hd)).T.reshape(h, hd, d)},
        "mlp": {"w_gate": get(pre + "mlp.gate_proj.weight", (f, d)).T, "w_up": get(pre + "mlp.up_proj.weight", (f, d)).T,
                "w_down": get(pre + "mlp.down_proj.weight", (d, f)).T},
        "attn_norm": {"scale": get(pre + "input_layernorm.weight", (d,))},
        "mlp_norm": {"scale": get(pre + "post_attention_layernorm.weight", (d,))},
    }
  if "layers" in abstract["trunk"]:
    trunk = _stacked(trunk, int(m.n_layers))
  params = {"embed": embed, "trunk": trunk}
  import jax

  want = jax.tree_util.tree_structure(abstract)
  if jax.tree_util.tree_structure(params) != want:
    raise NslError(f"{where}: the converted parameters do not have the config's structure ({want}); "
                   "is --config a standard model?")
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree_util.tree_leaves(abstract)):
    if tuple(a.shape) != tuple(b.shape):
      raise NslError(f"{where}: parameter {jax.tree_util.keystr(path)} has shape {list(a.shape)}, the config "
                     f"needs {list(b.shape)}")
  return params


def _stacked(trunk, n_layers: int):
  """The unrolled `block_i` trunk in the scanned form (`layers` stacked on axis 0), in numpy."""
  blocks = [trunk[f"block_{i}"] for i in range(n_layers)]
  import jax

  return {"final_norm": trunk["final_norm"], "layers": jax.tree.map(lambda *a: np.stack(a), *blocks)}


def read_tensors(hf_dir: str) -> dict[str, np.ndarray]:
  """Every tensor of a safetensors checkpoint directory (one file, or shards named by the index)."""
  st = require_safetensors()
  single, index = os.path.join(hf_dir, WEIGHTS), os.path.join(hf_dir, INDEX)
  if os.path.isfile(single):
    files = [single]
  elif os.path.isfile(index):
    with open(index, encoding="utf-8") as fh:
      files = [os.path.join(hf_dir, n) for n in sorted(set(json.load(fh)["weight_map"].values()))]
  else:
    raise NslError(f"{hf_dir}: no {WEIGHTS} or {INDEX} (a .bin checkpoint must be saved with safetensors first: "
                   "model.save_pretrained(dir, safe_serialization=True))")
  out = {}
  for path in files:
    try:
      out.update(st.load_file(path))
    except Exception as e:  # a truncated or foreign file
      raise NslError(f"{path}: not a readable safetensors file ({' '.join(str(e).split())[:120]})") from None
  return out


# ------------------------------------------------------------------------------------------ commands


def run_config(run_dir: str, flag: str):
  """`nsl.runs.load_config`, its error naming the argument `flag` that gave the path."""
  from nsl import runs

  try:
    return runs.load_config(run_dir)
  except NslError as e:
    raise NslError(str(e).replace("--workdir=", f"{flag}=", 1)) from None


def export(run_dir: str, out_dir: str, data: str | None = None) -> dict:
  """Writes the HF directory for a standard run; returns what was written."""
  from nsl import runs
  from nsl import hf_tokenizer
  from nsl.data import rundata

  config = run_config(run_dir, "RUN_DIR")
  check_exportable(config)  # before the parameters load
  tok = rundata.tokenizer(run_dir, config, data)  # (tokenizer, eos id, its dir), or a clear error
  _, _, params = runs.load_run(run_dir, flag="RUN_DIR")
  import flax.linen as nn

  tensors = to_hf(config, nn.unbox(params))
  os.makedirs(out_dir, exist_ok=True)
  st = require_safetensors()
  st.save_file(tensors, os.path.join(out_dir, WEIGHTS), metadata={"format": "pt"})
  eos = tok[1]
  _write_json(os.path.join(out_dir, "config.json"), llama_config(config, eos))
  _write_json(os.path.join(out_dir, "generation_config.json"),
              {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos, "do_sample": False})
  files = hf_tokenizer.write(tok[0], tok[2], int(config.data.seq_len), out_dir)
  return {"out_dir": out_dir, "tensors": len(tensors), "params": int(sum(t.size for t in tensors.values())),
          "tokenizer": tok[0].name, "tokenizer_files": files}


def import_(hf_dir: str, out_dir: str, config) -> dict:
  """Writes an nsl run directory (config.json, checkpoints/0) holding a HF Llama checkpoint."""
  import flax.linen as nn
  import jax

  from nsl import checkpoint
  from nsl import config as nsl_config
  from nsl.models import registry
  from nsl.train import state as train_state

  path = os.path.join(hf_dir, "config.json")
  if not os.path.isfile(path):
    raise NslError(f"HF_DIR={hf_dir}: no config.json (is it a save_pretrained directory?)")
  with open(path, encoding="utf-8") as fh:
    hf = json.load(fh)
  nsl_config.validate(config)
  check_importable(hf, config, path)
  family = registry.get_family(config)
  abstract = nn.unbox(family.abstract_params())
  params = from_hf(config, read_tensors(hf_dir), abstract, hf_dir)
  if os.path.isdir(os.path.join(out_dir, "checkpoints")):
    raise NslError(f"OUT_DIR={out_dir} already holds checkpoints; choose a new directory")
  os.makedirs(out_dir, exist_ok=True)
  params = jax.tree.map(jax.numpy.asarray, params)
  state = train_state.create(params, train_state.make_optimizer(config))
  saver = checkpoint.Checkpointer(os.path.join(out_dir, "checkpoints"), keep=1, async_save=False)
  try:
    meta = {"config": nsl_config.to_dict(config), "imported_from": os.path.abspath(hf_dir)}
    saver.save(0, state, None, meta, force=True)
  finally:
    saver.close()
  _write_json(os.path.join(out_dir, "config.json"), nsl_config.to_dict(config))
  return {"out_dir": out_dir, "step": 0, "params": int(sum(np.size(x) for x in jax.tree.leaves(params)))}


def _write_json(path: str, obj) -> None:
  with open(path, "w", encoding="utf-8") as fh:
    json.dump(obj, fh, indent=2, sort_keys=True)
    fh.write("\n")


def parse_args(argv):
  parser = ArgumentParser(prog="python -m nsl.hf", description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True, metavar="{export,import}")
  ex = sub.add_parser("export", help="a standard run -> a LlamaForCausalLM directory")
  ex.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (config.json, checkpoints/)")
  ex.add_argument("out_dir", metavar="OUT_DIR", help="the directory to write")
  ex.add_argument("--data", default=None, help="a data directory whose tokenizer is exported instead of the "
                                               "run's own copy (WORKDIR/tokenizer; a run recorded without one: its data.path)")
  im = sub.add_parser("import", help="a LlamaForCausalLM directory -> an nsl run directory")
  im.add_argument("hf_dir", metavar="HF_DIR", help="a save_pretrained directory (config.json, safetensors)")
  im.add_argument("out_dir", metavar="OUT_DIR", help="the run directory to write")
  im.add_argument("--config", required=True, help="the nsl config of the checkpoint's shape (FILE.py or FILE.py:ARG); "
                                                  "--config.a.b=VALUE overrides a field")
  for p in (parser, ex, im):
    p.error = parser.error  # one line, exit 2, from every level
  from nsl.config import split_overrides

  overrides, rest = split_overrides(argv)
  args = parser.parse_args(rest)
  if overrides and args.command != "import":
    raise ConfigError(f"--config.{overrides[0][0]} applies to `import` only")
  return args, overrides


@cli_main
def main(argv: list[str] | None = None) -> int:
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  if args.command == "export":
    summary = export(args.run_dir, args.out_dir, args.data)
  else:
    from nsl import config as nsl_config

    summary = import_(args.hf_dir, args.out_dir, nsl_config.load_config(args.config, overrides))
  print(json.dumps(summary, sort_keys=True))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
