"""`python -m nsl.bench.attention`: attention under nsl's mask rules, every implementation side by side.

For each rule (causal, window, sps_interleaved, sps_stream_major, delayed, dd_self, dd_cross) and
each length S (slots), prints one JSON line with
- `visible_fraction`: visible (query, key) pairs / S², with the benchmark's segment and block ids;
- `tile_fraction`: (query tile, key tile) pairs a block-sparse kernel visits / all tiles (the
  static block map of `nsl.nn.masks.block_map` at `--block`), and `tiles_vs_causal_triangle`;
- `time_s`: forward + backward wall time (median of `--repeats` runs after one compile/warm-up
  call) of each implementation, measured in the same process, and `chunked_over_xla`.

Pallas kernels are timed only on their own platform (splash on TPU, pallas_gpu on GPU); in
interpret mode they are correctness tools, not speed measurements, and the line says so under
`not_timed`. A last line (`"summary": true`) repeats the two SPS figures when S = 4096 is
in the run: chunked/dense time for SPS stream-major and its tile count over the interleaved
causal triangle.

All rules use the same S slots; the SPS rules have S/2 tokens. `--tokens` is an alias of
`--slots` (T counted in slots).

`--block=0` (default) times each implementation at its own default tile (`attention.tile_size`:
64 for the `flash_cpu` kernel, 128 for the chunked path on CPU, 512 for the accelerator kernels;
`block_by_impl`) and counts tiles at the chunked path's; `--block=N` uses N for all.

`--torch_python=PY` (a Python with PyTorch) adds, for the `causal` rule, PyTorch's fused causal
`scaled_dot_product_attention` on the same [B, H, T, D] fp32 inputs, forward + backward, with as
many threads as this machine has cores, in rounds alternating with nsl's CPU paths (`chunked`
and the `flash_cpu` kernel, those in `--impls`; `--rounds`): `torch_sdpa_s` (median per round),
`IMPL_s_by_round`, and `IMPL_over_torch_sdpa` (median of the per-round ratios; < 1 = nsl faster). The torch process
inherits this one's environment, huge pages included (docs/benchmarks.md#huge-pages), so both run under
the same allocator.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from nsl import hostmem
from nsl.nn import attention, masks
from nsl.errors import ArgumentParser, ConfigError, NslError, cli_main
from nsl.kernels import rules as kernel_rules
from nsl.models import sps

RULES = ("causal", "window", "sps_interleaved", "sps_stream_major", "delayed", "dd_self", "dd_cross")
KERNEL_PLATFORM = {"splash": "tpu", "pallas_gpu": "gpu", "flash_cpu": "cpu"}
AGAINST_TORCH = ("chunked", "flash_cpu")  # the CPU paths timed against torch's SDPA


def _dd_blocks(slots: int, seed: int = 0) -> np.ndarray:
  """Double-decoder block ids: 4 boundaries drawn uniformly in [2, L-2] (docs/papers/double_decoder.md#blocks)."""
  rng = np.random.default_rng(seed)
  bounds = np.sort(rng.choice(np.arange(2, slots - 1), size=4, replace=False))
  return np.searchsorted(bounds, np.arange(slots), side="right").astype(np.int32)[None]


def make_case(name: str, slots: int, window: int, batch: int):
  """(rule, q Slots, k Slots, description) for one benchmark rule. One document per row."""
  segment = jnp.ones((batch, slots), jnp.int32)
  causal = masks.Layout.causal(slots)
  if name == "causal":
    return masks.Rule(), attention.Slots(causal, segment), {"layout": "causal"}
  if name == "window":
    return masks.Rule(persistent_window=window), attention.Slots(causal, segment), {"layout": "causal"}
  if name in ("sps_interleaved", "sps_stream_major", "delayed"):
    if slots % 2:
      raise ConfigError(f"--slots: SPS rules need an even number of slots, got {slots}")
    order = "interleaved" if name == "sps_interleaved" else "stream_major"
    lay = sps.slot_layout("delayed_state" if name == "delayed" else "sps", slots // 2, order)
    return masks.Rule(window=window), attention.Slots(lay, segment), {"layout": order}
  if name in ("dd_self", "dd_cross"):
    block = jnp.asarray(_dd_blocks(slots))
    s = attention.Slots(causal, segment, block)
    rule = masks.Rule(block="same") if name == "dd_self" else masks.Rule(causal=False, block="earlier", sink=True)
    return rule, s, {"layout": "causal", "blocks": int(block.max()) + 1}
  raise ConfigError(f"--rules: unknown rule {name!r}; choose from {', '.join(RULES)}")


def _fwd_bwd(impl: str, rule, q_slots, k_slots, block: int):
  def loss(q, k, v, ct):
    out = attention.attend(q, k, v, rule, q_slots, k_slots, impl=impl, chunk_q=block, chunk_k=block)
    return jnp.sum(out.astype(jnp.float32) * ct)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _time(fn, args, repeats: int) -> tuple[float, float]:
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))  # compile + warm-up
  first = time.perf_counter() - t0
  runs = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    runs.append(time.perf_counter() - t0)
  return statistics.median(runs), first


# Run by `--torch_python` with argv [batch, heads, tokens, head_dim, repeats, threads]: one JSON line.
_TORCH_SDPA = """
import json, statistics, sys, time, torch
b, h, t, d, repeats, threads = (int(x) for x in sys.argv[1:7])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(b, h, t, d, generator=g, requires_grad=True) for _ in range(3))
ct = torch.randn(b, h, t, d, generator=g)
def step():
  out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
  return torch.autograd.grad((out * ct).sum(), (q, k, v))
step()
runs = []
for _ in range(repeats):
  t0 = time.perf_counter(); step(); runs.append(time.perf_counter() - t0)
print(json.dumps({"torch": torch.__version__, "median_s": statistics.median(runs), "threads": threads}))
"""


def check_torch_python(path: str) -> str:
  """The executable `--torch_python` names, if it imports torch; else a ConfigError."""
  exe = shutil.which(path)
  if exe is None:
    raise ConfigError(f"--torch_python={path!r}: no such executable; give the path of a Python that has PyTorch")
  probe = subprocess.run([exe, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
  if probe.returncode != 0:
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    raise ConfigError(f"--torch_python={path!r} cannot import torch ({last}); pip install torch into it")
  return exe


def torch_sdpa_seconds(exe: str, batch: int, heads: int, tokens: int, head_dim: int, repeats: int) -> dict:
  """One process of torch's fused causal SDPA, forward + backward: {"torch", "median_s", "threads"}."""
  argv = [str(x) for x in (batch, heads, tokens, head_dim, repeats, os.cpu_count() or 1)]
  run = subprocess.run([exe, "-c", _TORCH_SDPA, *argv], capture_output=True, text=True)
  if run.returncode != 0:
    raise NslError(f"--torch_python: the SDPA run failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
  return json.loads(run.stdout.strip().splitlines()[-1])


def _against_torch(rec: dict, fns: dict, args_, args) -> None:
  """Rounds alternating a torch SDPA process with each of nsl's compiled `fns` (module docstring)."""
  ours, theirs = {name: [] for name in fns}, []
  for _ in range(args.rounds):
    t = torch_sdpa_seconds(args.torch_python, args.batch, args.heads, rec["slots"], args.head_dim, args.repeats)
    theirs.append(t["median_s"])
    for name, fn in fns.items():
      ours[name].append(_time(fn, args_, args.repeats)[0])
  rec.update({"torch": t["torch"], "torch_threads": t["threads"], "rounds": args.rounds,
              "torch_sdpa_s_by_round": [round(x, 5) for x in theirs],
              "torch_sdpa_s": round(statistics.median(theirs), 5)})
  for name, runs in ours.items():
    rec[f"{name}_s_by_round"] = [round(x, 5) for x in runs]
    rec[f"{name}_over_torch_sdpa"] = round(statistics.median(a / b for a, b in zip(runs, theirs)), 4)


def bench_one(name: str, slots: int, args, platform: str) -> dict:
  rule, s, desc = make_case(name, slots, args.window, args.batch)
  block = args.block or attention.tile_size("chunked")
  if slots % block:
    raise ConfigError(f"--block={block} must divide every length in --slots (got {slots})")
  dyn = s.dynamic()
  vis = masks.dense_mask(rule, s.layout, s.layout, {n: np.asarray(a) for n, a in dyn.items()},
                         {n: np.asarray(a) for n, a in dyn.items()})
  tiles = kernel_rules.tile_lists(rule, s.layout, s.layout, block, block)
  triangle = kernel_rules.causal_triangle_tiles(slots, block)
  rec = {"bench": "attention", "rule": name, "slots": slots, "host_huge_pages": hostmem.status(),
         "tokens": slots // 2 if name.startswith(("sps", "delayed")) else slots, **desc,
         "window": args.window if name in ("window", "sps_interleaved", "sps_stream_major", "delayed") else None,
         "block": block,
         "visible_fraction": round(float(np.broadcast_to(vis, (args.batch, slots, slots)).mean()), 5),
         "tiles_visited": tiles.num_visited, "tiles_total": int(tiles.block_map.size),
         "tile_fraction": round(tiles.fraction_visited, 5),
         "tiles_vs_causal_triangle": round(tiles.num_visited / triangle, 5),
         "time_s": {}, "not_timed": {}}
  key = jax.random.PRNGKey(slots)
  shape = (args.batch, slots, args.heads, args.head_dim)
  dtype = jnp.dtype(args.dtype)
  qkv_ct = [jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in jax.random.split(key, 4)]
  qkv_ct[3] = qkv_ct[3].astype(jnp.float32)
  compile_s, fns, rec["block_by_impl"] = {}, {}, {}
  for impl in args.impls:
    native = KERNEL_PLATFORM.get(impl)
    if native is not None and platform != native:
      rec["not_timed"][impl] = (f"a {native} kernel: not run on {platform}" if impl == "flash_cpu" else
                                f"interpret mode on {platform}: a correctness tool, not a speed measurement")
      continue
    rec["block_by_impl"][impl] = args.block or attention.tile_size(impl)
    fn = _fwd_bwd(impl, rule, s, s, rec["block_by_impl"][impl])
    try:
      rec["time_s"][impl], compile_s[impl] = _time(fn, qkv_ct, args.repeats)
    except NslError as e:
      rec["not_timed"][impl] = str(e)
      continue
    fns[impl] = fn
  if name == "causal" and args.torch_python:
    _against_torch(rec, {i: f for i, f in fns.items() if i in AGAINST_TORCH}, qkv_ct, args)
  rec["time_s"] = {k: round(v, 5) for k, v in rec["time_s"].items()}
  rec["first_call_s"] = {k: round(v, 3) for k, v in compile_s.items()}
  for impl in ("chunked", "flash_cpu"):
    if impl in rec["time_s"] and "xla" in rec["time_s"]:
      rec[f"{impl}_over_xla"] = round(rec["time_s"][impl] / rec["time_s"]["xla"], 4)
  if not rec["not_timed"]:
    del rec["not_timed"]
  return rec


def _parse(argv):
  p = ArgumentParser(prog="python -m nsl.bench.attention", description=__doc__.split("\n")[0])
  p.add_argument("--slots", "--tokens", dest="slots", default="1024,2048,4096",
                 help="comma-separated sequence lengths in slots (--tokens is an alias)")
  p.add_argument("--impls", default=None,
                 help="comma-separated from xla,chunked,splash,pallas_gpu,flash_cpu (default: xla,chunked "
                      "plus the platform's kernel)")
  p.add_argument("--rules", default=",".join(RULES), help="comma-separated attention rules to time")
  p.add_argument("--batch", type=int, default=1, help="rows per call")
  p.add_argument("--heads", type=int, default=4, help="attention heads")
  p.add_argument("--head_dim", type=int, default=64, help="dimension of each head")
  p.add_argument("--block", type=int, default=0,
                 help="tile size of every implementation and the tile counts (0: each one's own, docstring)")
  p.add_argument("--window", type=int, default=64, help="SPS temporary-key window w / sliding window")
  p.add_argument("--repeats", type=int, default=3, help="timed repetitions per measurement (the median is reported)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="dtype of q, k and v")
  p.add_argument("--torch_python", default=None,
                 help="a Python with PyTorch: time its fused causal SDPA beside the causal rule (docstring)")
  p.add_argument("--rounds", type=int, default=3, help="alternating nsl / torch rounds with --torch_python")
  args = p.parse_args(argv)
  try:
    args.slots = [int(x) for x in args.slots.split(",") if x]
  except ValueError as e:
    raise ConfigError(f"--slots must be comma-separated integers, got {args.slots!r}") from e
  args.rules = [r for r in args.rules.split(",") if r]
  for r in args.rules:
    if r not in RULES:
      raise ConfigError(f"--rules: unknown rule {r!r}; choose from {', '.join(RULES)}")
  platform = jax.default_backend()
  if args.impls is None:
    args.impls = ["xla", "chunked"] + [k for k, v in KERNEL_PLATFORM.items() if v == platform]
  else:
    args.impls = [i for i in args.impls.split(",") if i]
  for i in args.impls:
    if i not in attention.IMPLS or i == "auto":
      raise ConfigError(f"--impls: unknown implementation {i!r}; choose from {', '.join(attention.IMPLS[1:])}")
  if args.repeats < 1 or args.batch < 1 or args.heads < 1 or args.block < 0 or args.rounds < 1:
    raise ConfigError("--repeats, --batch, --heads and --rounds must be >= 1, --block >= 0")
  if args.torch_python:
    if args.dtype != "float32" or "causal" not in args.rules or not set(AGAINST_TORCH) & set(args.impls):
      raise ConfigError("--torch_python compares the causal rule's CPU paths in float32: keep "
                        "'causal' in --rules, 'chunked' or 'flash_cpu' in --impls and --dtype=float32")
    args.torch_python = check_torch_python(args.torch_python)
  return args, platform


@cli_main
def main(argv=None) -> int:
  args, platform = _parse(sys.argv[1:] if argv is None else argv)
  setup = {"platform": platform, "device": jax.devices()[0].device_kind, "jax": jax.__version__,
           "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype,
           "repeats": args.repeats, "timing": "forward+backward (grad of sum(out*ct) w.r.t. q, k, v), "
           "median after one compile/warm-up call"}
  summary = {}
  for slots in args.slots:
    for name in args.rules:
      rec = bench_one(name, slots, args, platform)
      rec["setup"] = setup
      print(json.dumps(rec), flush=True)
      if slots == 4096 and name in ("sps_stream_major", "sps_interleaved"):
        summary[name] = rec
  if "sps_stream_major" in summary:
    sm = summary["sps_stream_major"]
    line = {"bench": "attention", "summary": True, "slots": 4096, "tokens": 2048,
            "window": args.window, "block": sm["block"],
            "sps_stream_major_tiles_vs_interleaved_causal_triangle": sm["tiles_vs_causal_triangle"],
            "target_tiles": 0.6}
    if "chunked_over_xla" in sm:
      line["sps_stream_major_chunked_over_dense"] = sm["chunked_over_xla"]
      line["target_time"] = 0.7
    if "sps_interleaved" in summary and "chunked_over_xla" in summary["sps_interleaved"]:
      line["sps_interleaved_chunked_over_dense"] = summary["sps_interleaved"]["chunked_over_xla"]
    print(json.dumps(line), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
