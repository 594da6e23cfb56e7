"""Elastic resume (docs/guide/training.md#elastic-resume): the data position is global, so a run
checkpointed by 2 processes continues on 1 process (4, then 2 devices) and on 2 processes again
with every step's global batch, row by row, equal to an uninterrupted 2-process run's, and every
loss within a few float32 ulps of it (rtol 5e-7: measured bit-equal, but the steps on one process
sum their gradients in another order, so the last bits may differ).

The end-to-end test drives real processes on localhost through `launch/local_multiprocess.sh`
(JAX's distributed runtime, gloo), as tests/train/test_multiprocess.py does, and reads each
step's rows from the runs' `log.data_trace`.
"""

import os
import subprocess
import sys

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from nsl import checkpoint
from nsl.data import pipeline
from nsl.errors import ConfigError, NslError
from nsl.train import loop, observe
from tests.helpers import ROOT, tiny_config
from tests.train.test_multiprocess import _env, _losses, _result, _write_config, corpus  # noqa: F401

STEPS = 6
# decay_steps=0: a step's learning rate does not depend on train.steps, so a run stopped by a
# smaller train.steps and resumed with a larger one follows the uninterrupted run's schedule.
OVERRIDES = {"train.steps": STEPS, "train.decay_steps": 0, "checkpoint.every": 2, "train.eval_every": 100,
             "log.data_trace": True}


def _two(config, workdir, *flags):
  env = dict(_env(2), NSL_LOCAL_DEVICES="2")
  proc = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", config, str(workdir), *flags], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def _one(config, workdir, devices, *flags):
  proc = subprocess.run([sys.executable, "-m", "nsl.launch", f"--config={config}", f"--workdir={workdir}", "--quiet",
                         *flags], cwd=ROOT, env=_env(devices), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def _final_params(workdir):
  """The newest checkpoint's parameters on this process's first device (a checkpoint written by
  several processes is read with target shardings, from its own shapes)."""
  mgr = ocp.CheckpointManager(str(workdir / "checkpoints"), item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                                       "meta": ocp.JsonCheckpointHandler()})
  step = mgr.latest_step()
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  tree = mgr.item_metadata(step)["state"]
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), tree)
  state = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
  mgr.close()
  return step, [np.asarray(x) for x in jax.tree.leaves(state["params"])]


@pytest.mark.slow
def test_two_to_one_to_two_processes_sees_the_uninterrupted_examples(corpus, tmp_path):
  config = _write_config(tmp_path, corpus, **OVERRIDES)
  reference = tmp_path / "reference"
  _two(config, reference)

  run = tmp_path / "elastic"
  _two(config, run, "--config.train.steps=2")  # 2 processes x 2 devices: steps 1-2
  for steps, devices in ((3, 4), (4, 2)):  # 1 process: 4 devices for step 3, then 2 for step 4
    _one(config, run, devices, f"--config.train.steps={steps}")
    assert (_result(run)["processes"], _result(run)["devices"], _result(run)["steps"]) == (1, devices, steps)
  _two(config, run)  # 2 processes x 2 devices again: steps 5-6
  assert (_result(run)["status"], _result(run)["processes"], _result(run)["steps"]) == ("done", 2, STEPS)

  want, got = observe.read_data_trace(reference), observe.read_data_trace(run)
  assert sorted(want) == sorted(got) == list(range(1, STEPS + 1))
  for step in want:
    assert len(got[step]) == 8 and got[step] == want[step], step
  seen = [r for s in sorted(got) for r in got[s]]
  assert len(set(seen)) == len(seen)  # 48 rows of an epoch of ~880 windows: none read twice
  a, b = _losses(reference), _losses(run)
  # Measured bit-equal at every step, but steps 3-4 summed their gradients in another order (one
  # process, other device counts), so the parameters differ in their last bits (measured at most
  # 9.3e-9 in two runs, 1.2e-7 in a third, on parameters of size ~1) and a loss may differ by an ulp of float32 (1.2e-7
  # relative): both are compared within a few ulps.
  np.testing.assert_allclose([b[s] for s in range(1, STEPS + 1)], [a[s] for s in range(1, STEPS + 1)], rtol=5e-7)
  (s1, p1), (s2, p2) = _final_params(reference), _final_params(run)
  assert s1 == s2 == STEPS
  worst = max(float(np.max(np.abs(x - y))) for x, y in zip(p1, p2))
  print(f"elastic: losses {[b[s] for s in sorted(b)]}, bit-equal: {[a[s] == b[s] for s in sorted(a)]}; "
        f"final parameters differ by at most {worst:.3g}")
  assert worst < 1e-6


def _iterator(data_dir, process_index=0, process_count=1):
  return pipeline.make_train_iterator(data_dir, seq_len=64, global_batch_size=8, seed=0, process_index=process_index,
                                      process_count=process_count, read_threads=0, prefetch=0)


def _tiny_state():
  return {"w": np.arange(4, dtype=np.float32)}


def _abstract():
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), _tiny_state())


def test_data_position_is_global_and_restores_onto_another_process_count(corpus, tmp_path):
  it = _iterator(corpus)
  batches = [next(it)["tokens"] for _ in range(4)]
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"), keep=1, async_save=False)
  reference = _iterator(corpus)
  for _ in range(3):
    next(reference)
  ck.save(3, _tiny_state(), reference, {})
  ck.wait()
  meta = ck.metadata(3)
  assert meta["data_state"] == {"next_index": 3} and meta["process_count"] == 1
  for p in range(2):  # each of 2 processes continues with its half of global batch 4
    it = _iterator(corpus, p, 2)
    ck.restore(3, _abstract(), it)
    np.testing.assert_array_equal(next(it)["tokens"], batches[3][4 * p:4 * (p + 1)])
  ck.close()


def _old_format_checkpoint(directory, data_dir, process_count):
  """A step as nsl wrote it before the data position was global: Grain's per-process file, no
  `data_state` in the metadata."""
  it = _iterator(data_dir)
  next(it)
  mgr = ocp.CheckpointManager(str(directory), options=ocp.CheckpointManagerOptions(create=True))
  mgr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(_tiny_state()),
                                      meta=ocp.args.JsonSave({"step": 1, "process_count": process_count}),
                                      data=grain.checkpoint.CheckpointSave(it)))
  mgr.wait_until_finished()
  mgr.close()


def test_older_per_process_checkpoints_restore_on_their_count_and_refuse_another(corpus, tmp_path):
  abstract = _abstract()
  _old_format_checkpoint(tmp_path / "same", corpus, process_count=1)
  ck = checkpoint.Checkpointer(str(tmp_path / "same"), keep=1, async_save=False)
  it = _iterator(corpus)
  ck.restore(1, abstract, it)
  assert it.get_state() == {"next_index": 1}
  ck.close()
  # Written "by 2 processes" (its metadata says so); this is 1.
  _old_format_checkpoint(tmp_path / "other", corpus, process_count=2)
  ck = checkpoint.Checkpointer(str(tmp_path / "other"), keep=1, async_save=False)
  with pytest.raises(NslError, match=r"older nsl with a data position per process \(2 processes; this run has 1\); "
                                     "resume it once with 2 processes"):
    ck.restore(1, abstract, _iterator(corpus))
  ck.close()


def test_resume_onto_devices_that_do_not_divide_the_global_batch_is_one_line(corpus, tmp_path):
  config = tiny_config(corpus)  # global batch 8
  with pytest.raises(ConfigError, match=r"not divisible by the 3 data-parallel devices .*; use a device count "
                                        r"or config.mesh.shape whose data x fsdp divides it \(a resumed run keeps"):
    loop.Trainer(config, str(tmp_path / "run"), progress=False, devices=jax.devices()[:3])


def test_data_trace_drops_replayed_steps_and_joins_processes_by_row(tmp_path):
  rows = lambda step, p: {"tokens": np.full((2, 5), 10 * step + p, np.int32)}  # process p's 2 rows
  for p in range(2):  # 2 processes traced steps 1-3; the checkpoint they left is at step 2
    trace = observe.DataTrace(True, str(tmp_path), 0, p, 2)
    for step in (1, 2, 3):
      trace.write(step, rows(step, p))
    trace.close()
  one = observe.DataTrace(True, str(tmp_path), 2, 0, 1)  # resumed at 2 on 1 process: step 3 replays
  one.write(3, {"tokens": np.concatenate([rows(3, 0)["tokens"], rows(3, 1)["tokens"]])})
  one.close()
  got = observe.read_data_trace(str(tmp_path))  # step 3 twice at row 0 would be an error
  assert sorted(got) == [1, 2, 3]
  for step in got:  # 4 rows each: 2 alike from process 0, then 2 alike from process 1
    a, b, c, d = got[step]
    assert a == b != c == d
  os.remove(tmp_path / "data_trace" / "process_0-of-2.jsonl")
  os.remove(tmp_path / "data_trace" / "process_0-of-1.jsonl")
  with pytest.raises(ValueError, match=r"step 1 has rows 0\.\.1 missing"):
    observe.read_data_trace(str(tmp_path))
