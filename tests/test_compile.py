"""Ahead-of-time TPU compiles from this CPU host (nsl.compile, nsl.topology, nsl.train.program).

libtpu's real XLA:TPU and Mosaic compilers run against the devices of a compile-only v5e 2x2
topology: the trainer's own train step must compile for every family with `attention_impl=auto`
choosing splash (Mosaic kernels in the executable), bfloat16 for `dtype=auto`, and a step that
cannot fit must be refused in one line. Shapes are tiny: one compile per family.
"""

import json
import os
import subprocess
import sys

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError

from tests.helpers import ROOT

pytest.importorskip("libtpu", reason="the [tpu] extra (libtpu) runs TPU compiles on any host")

from nsl import compile as nsl_compile  # noqa: E402
from nsl import topology  # noqa: E402
from nsl.train import program as program_lib  # noqa: E402


@pytest.fixture(scope="module")
def v5e_2x2():
  return topology.get("v5e-4")


def _config(name, **overrides):
  pairs = [("model.n_layers", "2"), ("train.batch_size", "4"), ("model.attention_impl", "auto")]
  pairs += [(k, str(v)) for k, v in overrides.items()]
  return nsl_config.load_config(os.path.join(ROOT, "configs", name), pairs)


# One config per family, tiny: the step the trainer runs, compiled for 4 v5e chips.
FAMILY_CONFIGS = ["standard_tiny.py", "sps_tiny.py", "dd_tiny.py", "sed_tiny.py", "lift_tiny.py",
                  "nextlat_tiny.py", "mtp_tiny.py"]


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_every_familys_train_step_compiles_for_a_tpu_slice_with_splash(v5e_2x2, name):
  # One layer: what this checks (splash under shard_map, dtype=auto, the fit) is per layer, and XLA:TPU
  # compile time grows with the unrolled depth (lift_tiny 32 s at 2 layers, 22 s at 1). Two layers and
  # their scan are compiled by the test below.
  overrides = {"model.dtype": "auto", "model.n_layers": 1}
  if name == "dd_tiny.py":
    overrides["model.n_layers"] = 3  # the 2:1 context/generation split
  if name == "sed_tiny.py":
    overrides["model.n_layers"] = 2  # one encoder and one decoder layer
    # Span corruption leaves encoder/decoder lengths off splash's 128-lane grid (114/24 at 128
    # tokens); at 680 tokens the decoder is 128 slots (splash) and the 604-slot encoder runs chunked.
    overrides["data.seq_len"] = 680
  config = _config(name, **overrides)
  program = program_lib.Program(config, v5e_2x2.devices)
  record, compiled = nsl_compile.report(config, program, v5e_2x2)
  # What the registry picked while tracing: splash, and chunked for what splash cannot take (the
  # double decoder's block-order cross attention, SED's 604-slot encoder).
  chunked = name in ("dd_tiny.py", "sed_tiny.py")
  assert record["platform"] == "tpu" and record["attention_impl"] == ("splash+chunked" if chunked else "splash")
  assert record["dtype"] == "bfloat16"  # dtype=auto follows the mesh, not this CPU host
  assert record["mosaic_kernels"] > 0, "splash must run compiled (Mosaic), under shard_map"
  assert record["fits"] and 0 < record["peak_bytes"] < record["hbm_bytes_per_chip"]
  assert record["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert compiled is not None


def test_scanned_layers_compile_to_one_body_with_the_same_parameters(v5e_2x2):
  from nsl.kernels import splash

  splash._kernel.cache_clear()  # the kernel is then first built inside the scan's gradient trace
  unrolled = program_lib.Program(_config("sps_tiny.py", **{"model.scan_layers": False}), v5e_2x2.devices)
  scanned = program_lib.Program(_config("sps_tiny.py", **{"model.scan_layers": True}), v5e_2x2.devices)
  assert scanned.counts == unrolled.counts
  assert scanned.flops_per_token == unrolled.flops_per_token
  layers = scanned.abstract_state.params["trunk"]["layers"]
  wq = layers["attn"]["wq"]
  assert wq.shape[0] == 2 and wq.sharding.spec[0] is None  # leading `layers` axis, unsharded
  record, _ = nsl_compile.report(scanned.config, scanned, v5e_2x2)
  assert record["scan_layers"] and record["mosaic_kernels"] == 3  # forward, dq, dkv: one layer body
  # XLA's cost analysis counts a loop body once; nsl.compile counts it per trip, so the scanned
  # step does the unrolled step's work (same analytic count), not one layer's.
  flat, _ = nsl_compile.report(unrolled.config, unrolled, v5e_2x2)
  assert not flat["scan_layers"] and 2 in record["loop_trip_counts"]
  assert record["xla_flops_per_step"] == pytest.approx(flat["xla_flops_per_step"], rel=0.05)
  assert record["xla_flops_loops_once_per_step"] < 0.8 * record["xla_flops_per_step"]
  for r in (record, flat):
    assert 0.7 <= r["flops_ratio"] <= 1.3, r["flops_ratio"]
    assert r["chip"] == "v5e" and 0 < r["roofline_mfu"] <= 1
    assert r["roofline_step_seconds"] == max(r["roofline_compute_seconds"], r["roofline_memory_seconds"])


def test_the_cli_prints_one_json_line_and_compiles_eval_too():
  proc = subprocess.run(
      [sys.executable, "-m", "nsl.compile", "--config=configs/sps_tiny.py", "--topology=v5e:2x2", "--eval",
       "--config.model.n_layers=1", "--config.train.batch_size=4"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1
  record = json.loads(lines[0])
  assert record["topology_name"] == "v5e:2x2" and record["chips"] == 4 and record["hosts"] == 1
  assert record["mosaic_kernels"] > 0 and record["eval"]["mosaic_kernels"] > 0
  assert 0.5 < record["flops_ratio"] < 1.5
  assert proc.stderr.strip() == "", "libtpu's start-up noise must not reach the user"


def test_a_step_that_cannot_fit_is_one_line_and_exit_2():
  # A 4M-token vocabulary replicated on 16 GiB chips: the logits alone overflow HBM.
  proc = subprocess.run(
      [sys.executable, "-m", "nsl.compile", "--config=configs/tiny.py", "--topology=v5e-4",
       "--config.model.vocab_size=4194304", "--config.train.batch_size=8", "--config.model.n_layers=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("nsl: error:")
  assert "does not fit on v5e-4" in err[0] and "GiB" in err[0] and "fsdp" in err[0]
  assert json.loads(proc.stdout)["fits"] is False


@pytest.mark.parametrize("name, generation, shape, chips", [
    ("v5p-64", "v5p", (2, 4, 4), 32),  # v4/v5p names count TensorCores: 2 per chip
    ("v4-32", "v4", (2, 2, 4), 16),
    ("v5e-256", "v5e", (16, 16), 256),  # v5e/v6e names count chips
    ("v5litepod-16", "v5e", (4, 4), 16),
    ("v6e-64", "v6e", (8, 8), 64),
    ("v5e:4x4", "v5e", (4, 4), 16),
    ("V5P:2x2x1", "v5p", (2, 2, 1), 4),
])
def test_topology_names_as_cloud_tpu_writes_them(name, generation, shape, chips):
  g, parsed = topology.parse(name)
  assert (g.name, parsed) == (generation, shape)
  assert topology.Slice(name, g, parsed, []).chips == chips


@pytest.mark.parametrize("name", ["v5p-63", "v7x-8", "tpu", "v5p-6", "v5e-12"])
def test_unknown_topologies_list_the_known_names(name):
  with pytest.raises(ConfigError, match="known: v4-8 .*v5p-64 .*v6e-256"):
    topology.parse(name)


def test_a_shape_of_the_wrong_rank_names_the_form():
  with pytest.raises(ConfigError, match="v5e slices are 2-D"):
    topology.parse("v5e:4x4x4")


def test_hosts_follow_cloud_tpus_four_chips_per_host():
  sl = topology.get("v5p-64")
  assert sl.chips == 32 and len(sl.devices) == 32 and sl.hosts == 8
  assert topology.get("v5e-8").hosts == 1  # the single-host v5e slice


def test_a_mesh_that_does_not_fit_the_slice_is_a_config_error(v5e_2x2):
  config = _config("tiny.py", **{"mesh.shape": "(3, -1, 1)"})
  with pytest.raises(ConfigError, match="mesh.shape"):
    program_lib.Program(config, v5e_2x2.devices)


def test_the_hbm_table_keeps_the_smallest_fitting_slice_per_generation(tmp_path):
  from nsl import hbm

  assert hbm.slices_for("v5p")[:3] == ["v5p-8", "v5p-16", "v5p-32"]
  assert hbm.slices_for("v5e")[:2] == ["v5e-1", "v5e-4"]
  rows = [
      {"config": "configs/sps.py:sps_xl", "generation": "v5p", "topology": "v5p-32", "chips": 16, "fits": False},
      {"config": "configs/sps.py:sps_xl", "generation": "v5p", "topology": "v5p-64", "chips": 32, "fits": True,
       "remat": "full", "peak_bytes": 40 * 2**30, "compile_seconds": 61.0},
      {"config": "configs/sps.py:sps_xl", "generation": "v5p", "done": True, "fits": False},
      {"config": "configs/sps.py:sps_xl", "generation": "v5e", "done": True, "fits": False},
  ]
  path = tmp_path / "hbm_fits.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"partial")  # an interrupted last line
  text = hbm.table(hbm.load(str(path)), ["v5p", "v5e", "v6e"])
  assert "| sps.py:sps_xl | v5p-64 fsdp 32, remat full, 40.0 GiB, 61 s | no slice (see text) | not run |" in text


def test_scanned_norm_gains_are_not_weight_decayed():
  import jax
  import flax.linen as nn
  from nsl.models import registry
  from nsl.train import state as train_state

  for scan in (False, True):
    config = _config("sps_tiny.py", **{"model.scan_layers": scan})
    params = nn.unbox(jax.eval_shape(registry.get_family(config).init, jax.random.PRNGKey(0)))
    mask = train_state._decay_mask(params)
    trunk = mask["trunk"]["layers"] if scan else mask["trunk"]["block_0"]
    assert trunk["attn_norm"]["scale"] is False and trunk["attn"]["wq"] is True
    assert mask["trunk"]["final_norm"]["scale"] is False


def test_loop_cost_counts_each_trip_of_nested_loops_on_the_host():
  """XLA:CPU keeps the trip-count annotation (XLA:TPU's text does not: the scanned-layer test
  above reads the loop condition instead); a scan of 3 inside a scan of 8 is 24 matmuls."""
  import jax
  import jax.numpy as jnp

  def f(x, w):
    def layer(c, w_i):
      return jax.lax.scan(lambda cc, _: (jnp.tanh(cc @ w_i), None), c, None, length=3)[0], None
    return jax.lax.scan(layer, x, w)[0].sum()

  compiled = jax.jit(f).lower(jnp.ones((64, 128)), jnp.ones((8, 128, 128))).compile()
  cost = nsl_compile.loop_cost(compiled, nsl_compile.cost_clients(jax.devices()))
  matmuls = 24 * 2 * 64 * 128 * 128
  assert sorted(cost.loops) == [3, 8] and cost.unknown_trip_loops == 0
  assert matmuls <= cost.full()["flops"] < 1.1 * matmuls
  assert nsl_compile.xla_flops(compiled) < matmuls / 8  # XLA's own count: one trip of each loop


def test_roofline_is_the_slower_of_compute_and_memory():
  chip = topology.CHIPS["v5p"]
  r = nsl_compile.roofline(chip, chips=4, xla_flops_step=2 * 459e12, analytic_flops_step=459e12,
                           bytes_per_chip=2765e9 * 0.25)
  assert r["roofline_compute_seconds"] == 0.5 and r["roofline_memory_seconds"] == 0.25
  assert r["roofline_bound"] == "compute" and r["roofline_step_seconds"] == 0.5
  assert r["roofline_mfu"] == 0.5  # recomputation doubles the work the model FLOPs count
  assert topology.chip_for_device("NVIDIA H100 80GB HBM3").name == "H100"
  assert topology.chip_for_device("TPU v5 lite").name == "v5e" and topology.chip_for_device("cpu") is None


# A counted loop as XLA:TPU prints it after unrolling a windowed einsum: no trip-count annotation,
# the counter stepping by 2 to 16 (8 trips), reached through a copy.
_UNROLLED_LOOP = """HloModule m

%body (bp: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %bp = (s32[], f32[8,8]) parameter(0)
  %bi = s32[] get-tuple-element(%bp), index=0
  %bc = s32[] copy(%bi)
  %bx = f32[8,8] get-tuple-element(%bp), index=1
  %two = s32[] constant(2)
  %next = s32[] add(%bc, %two)
  %y = f32[8,8] dot(%bx, %bx), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %bt = (s32[], f32[8,8]) tuple(%next, %y)
}

%cond (cp: (s32[], f32[8,8])) -> pred[] {
  %cp = (s32[], f32[8,8]) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant(16)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

ENTRY %main (x: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,8]) tuple(%zero, %x)
  %w = (s32[], f32[8,8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8,8] get-tuple-element(%w), index=1
}
"""


def test_loop_cost_reads_trips_from_the_condition_and_the_counters_step():
  import jax

  cost = nsl_compile.LoopCost(_UNROLLED_LOOP, jax.devices("cpu")[0].client)
  dot = 2 * 8 * 8 * 8
  assert 8 * dot <= cost.full()["flops"] < 8 * dot + 100 and cost.loops == [8]  # + the counter's adds
  assert dot <= cost.once(cost.entry)["flops"] < dot + 20
