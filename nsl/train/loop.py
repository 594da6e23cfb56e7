"""The training loop: data, jitted steps on the mesh, logging, evaluation, checkpoints, preemption.

Knows nothing about any family: it asks the Family for `init`, `loss`, `param_counts` and
`flops_per_token`, and records every run in the one record format (docs/design.md#checkpoints).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import nsl
from nsl import checkpoint, metrics, options, sharding, storage
from nsl import config as nsl_config
from nsl.data import mixture
from nsl.data import bytes_per_token, datadir, pipeline, prepare, rundata
from nsl.errors import ConfigError, NslError
from nsl.evals import evaluators, nll
from nsl.models import registry
from nsl.train import observe
from nsl.train import program as program_lib

FLOPS_CONVENTION = ("6 x params used per token (embedding counted once, as the tied head) + "
                    "12 x layers x d_model x visible attention pairs per token")


class _Preemption:
  """SIGTERM -> stop at the next step boundary with a checkpoint, every process at the same step
  (docs/guide/pods.md#preemption).

  One process: a Python SIGTERM handler sets a flag. Several: JAX's distributed runtime installs
  its own preemption notifier for SIGTERM (`jax.distributed.initialize`), which tells every host
  and agrees on a step to stop at (`reached_preemption_sync_point`); nsl leaves that handler in
  place, since a Python handler would replace it and a SIGTERM to one host would then reach no
  other. A runtime without the service (`jax_enable_preemption_service` off) falls back to the
  Python flag, agreed on at every step by a tiny all-gather.
  """

  def __init__(self):
    self.requested = False
    self._previous = None
    self._depth = 0  # re-entrant: the Trainer holds it from __init__ (compile) to the end of run()
    self.service = _preemption_service()

  def __enter__(self):
    if self._depth == 0 and not self.service:
      try:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
      except ValueError:  # not the main thread (tests driving run() from a thread)
        self._previous = None
    self._depth += 1
    return self

  def _handle(self, signum, frame):
    self.requested = True

  def __exit__(self, *exc):
    self._depth = max(0, self._depth - 1)
    if self._depth == 0 and self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def poll(self, step: int, save_due: bool = False) -> tuple[bool, bool]:
    """(stop, save): whether every process stops after `step`, and whether any asked for a timed
    save (`checkpoint.every_minutes`), agreed on by all processes."""
    if jax.process_count() == 1:
      return self.requested, save_due
    stop = self.service and multihost_utils.reached_preemption_sync_point(step)
    flags = multihost_utils.process_allgather(np.asarray([self.requested, save_due], np.int32))
    flags = np.asarray(flags).reshape(-1, 2)
    return bool(stop or np.any(flags[:, 0])), bool(np.any(flags[:, 1]))

  def should_stop(self, step: int) -> bool:
    return self.poll(step)[0]


def _preemption_service() -> bool:
  """Whether JAX's preemption notifier owns SIGTERM in this process (multi-process runs)."""
  from jax._src import distributed
  return jax.process_count() > 1 and distributed.global_state.preemption_sync_manager is not None


def prepare_data(config) -> dict[str, Any]:
  """Prepares the corpus on process 0 when missing (cached), then every process reads the manifest."""
  d = config.data
  if d.mixture:  # a mixture's dirs are prepared beforehand: check that they agree
    return mixture.load_manifests(d.mixture, config.model.vocab_size)
  if storage.is_remote(d.path):  # prepared elsewhere; every process reads its own local copy
    return prepare.load_manifest(datadir.fetch(d.path))
  kwargs = dict(sources=list(d.sources), tokenizer=d.tokenizer, vocab_size=d.tokenizer_vocab,
                gpt2_bpe=d.gpt2_bpe or None, val_fraction=d.val_fraction)
  if jax.process_index() == 0:
    prepare.ensure_prepared(d.path, **kwargs)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("nsl_data_prepared")
  manifest = prepare.load_manifest(d.path)
  if manifest["vocab_size"] > config.model.vocab_size:
    raise ConfigError(f"config.model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
                      f"{manifest['vocab_size']} ids in {d.path}; raise config.model.vocab_size")
  return manifest


def describe(config) -> dict[str, Any]:
  """Parameter counts and FLOPs from shapes only (`jax.eval_shape`): no parameter memory."""
  family = registry.get_family(config)
  counts = family.param_counts()
  return {"family": config.family, "variant": config.model.variant, **counts,
          "flops_per_token": family.flops_per_token(),
          "tokens_per_step": int(config.data.seq_len * config.train.batch_size)}


def check_resumable(saved: dict[str, Any], config, directory: str) -> None:
  """Every field must equal the checkpoint's (`saved`, in `directory`) except
  `nsl_config.RESUME_MAY_CHANGE` (run length, logging, evaluation, checkpointing, how attention is
  computed, the mesh): the others fix the parameters' shapes, the data stream or the model's
  function (docs/guide/training.md#checkpoints)."""
  diff = nsl_config.resume_differences(saved, nsl_config.to_dict(config))
  if diff:
    field, was, now = diff[0]
    more = f" (and {len(diff) - 1} more: {', '.join(d[0] for d in diff[1:4])})" if len(diff) > 1 else ""
    # Weights of another family do not fit this model: --restore_from would not help there.
    weights = "" if field in ("family", "model.variant") else " (with --restore_from to start from these weights)"
    raise ConfigError(f"config.{field}={now!r} differs from the checkpoint in {directory} "
                      f"({was!r}){more}; resume with the same value, or use a new --workdir{weights}")


def check_resume(config, workdir: str) -> None:
  """`check_resumable` against the newest checkpoint in `workdir`, read before the config is
  validated: a resume with another family is named as that, not as what the other family's own
  checks make of the config (its `<predict>` id, its missing section). Nothing to check when the
  workdir holds no checkpoint (or is no directory, which `launch.check_workdir` reports)."""
  directory = storage.join(storage.resolve(workdir), "checkpoints") if workdir else ""
  saved = checkpoint.saved_config(directory) if directory else None
  if saved is not None:
    check_resumable(saved, config, directory)


class Trainer:
  """Builds everything a run needs; `run()` trains to `config.train.steps` or a preemption."""

  def __init__(self, config, workdir: str, restore_from: str | None = None, progress: bool = True,
               devices=None):
    """`devices`: the devices of the mesh (default: all). Tests use a subset to compare meshes.
    A config built for an older nsl is read in today's layout (`nsl.options.upgrade`, in place)."""
    options.upgrade(config)
    self.config, self.workdir, self.restore_from = config, storage.resolve(workdir), restore_from
    # The records' local directory: the workdir itself, or a cache copied up to a gs:// workdir.
    self.records = storage.Records(self.workdir)
    self.progress = progress
    observe.check_wandb(config)  # a missing package fails before anything is built
    self._preemption = _Preemption().__enter__()  # SIGTERM while compiling still ends with a record
    devices = list(devices) if devices is not None else jax.devices()
    # The compiled program is built by the same code as `nsl.compile`'s (one path, not a copy);
    # it validates the config against the devices first.
    self.program = p = program_lib.Program(config, devices)
    # --restore_from is read before the workdir is made: weights of another architecture, or
    # damaged ones, are one line with nothing written (a resume leaves them unread).
    self._restored = None
    if restore_from and not checkpoint.step_dirs(storage.join(self.workdir, "checkpoints")):
      self._restored = checkpoint.restore_params(restore_from, p.abstract_state, config=config)
    self.is_main = jax.process_index() == 0
    self.lock = None
    if self.is_main:
      storage.makedirs(self.workdir)
      self.lock = checkpoint.WorkdirLock.acquire(self.workdir)  # a second trainer here refuses
      self.records.pull()
    self.mesh, self.family, self.optimizer = p.mesh, p.family, p.optimizer
    self.state_sharding, self.abstract_state = p.state_sharding, p.abstract_state
    self.counts, self.flops_per_token = p.counts, p.flops_per_token
    self._train_step, self._eval_step, self._init = p.train_step, p.eval_step, p.init
    self.manifest = prepare_data(config)
    self.data_path = datadir.fetch(config.data.path)  # config.data.path, or its local copy
    # The suffix of the view the eval step scores: "" for a family's default view (Family.views).
    self.eval_suffix = self.family.view_suffix(self.family.eval_view())
    t = config.train
    self.tokens_per_step = config.data.seq_len * t.batch_size
    self.base_rng = jax.random.fold_in(jax.random.PRNGKey(config.seed), 1)
    self.schedule = jax.tree.map(jnp.asarray, p.schedule)  # the LR schedule, an argument of every step
    # What the trainer reads: data.path's stream and split, or a weighted mixture of data dirs
    # (config.data.mixture) in its place; one interface, so the loop asks neither which.
    self.data = (mixture.for_trainer(config, jax.process_index(), jax.process_count())
                 or _DirData(config, self.data_path, jax.process_index(), jax.process_count()))
    self.train_iter = self.data.train_iter
    # config.evals, run beside the validation NLL; their data is checked here, before any step.
    self.evaluators = evaluators.build(evaluators.Context(
        config, self.family, self.mesh, self._eval_step, self.eval_suffix, t.batch_size // t.grad_accum,
        jax.process_index(), jax.process_count()))
    self.checkpointer = checkpoint.Checkpointer(storage.join(self.workdir, "checkpoints"),
                                                keep=config.checkpoint.keep,
                                                async_save=config.checkpoint.async_save)

  # -- state ------------------------------------------------------------------------------------
  def initial_state(self):
    """Latest checkpoint of this workdir, else --restore_from weights, else fresh parameters."""
    self.resumed_meta = {}
    restored = self.checkpointer.restore_latest(self.abstract_state, self.train_iter,
                                                check=lambda meta: self._check_resumable(meta.get("config", {})))
    if restored is not None:
      latest, state, self.resumed_meta = restored
      self._log(f"resumed from {self.checkpointer.directory}/{latest}")
      return state
    with self.program.mesh_context():
      state = self._init(jax.random.PRNGKey(nsl_config.init_seed(self.config)))
    if self.restore_from:
      params, step = self._restored or checkpoint.restore_params(self.restore_from, self.abstract_state,
                                                                 config=self.config)
      self._restored = None
      state = state.replace(params=params)
      self._log(f"initialised parameters from {self.restore_from} (step {step})")
    return state

  def _check_resumable(self, saved: dict[str, Any]) -> None:
    check_resumable(saved, self.config, self.checkpointer.directory)

  def _log(self, msg: str) -> None:
    if self.is_main and self.progress:
      print(f"nsl: {msg}", flush=True)

  def evaluations(self, params) -> dict[str, float]:
    """The metrics.jsonl fields of one evaluation: the validation NLL (a mixture's also per
    source; the same loop as `python -m nsl.evals.nll`) and every config.evals metric."""
    out = self.data.evaluate(lambda b: nll.summed_nll(self._eval_step, params, b, self.mesh), self.eval_suffix)
    with self.program.mesh_context():
      out.update(evaluators.run_all(self.evaluators, params))
    return out

  # -- the loop ---------------------------------------------------------------------------------
  # `run` is the step loop; each stage below is one named part of it (Levanter's hooks are one
  # model): `_log` every train.log_every steps, `_evaluate` every train.eval_every, `_checkpoint`
  # every checkpoint.every (or every_minutes, agreed in the preemption poll), which also says when
  # to stop; `_finish` evaluates and saves the last step, `_close` writes result.json whatever happened.
  def run(self) -> dict[str, Any]:
    t = self.config.train
    r = self._open()
    try:
      with self._preemption as preemption, self.program.mesh_context():
        if preemption.should_stop(r.step):  # SIGTERM arrived while compiling or restoring
          r.status = "preempted"
        while r.step < t.steps and r.status == "done":
          m = self._train_one(r)
          if r.step % t.log_every == 0 or r.step == t.steps:
            self._log_step(r, m)
          if r.step % t.eval_every == 0 and r.step < t.steps:
            self._evaluate(r)
          if self._checkpoint(r, preemption):
            r.status = "preempted"
            break
      self._finish(r)
    except BaseException:
      r.status = "failed"
      raise
    finally:
      self._close(r)
    self.final_state = r.state
    return r.result

  def _open(self) -> "_RunState":
    """The state to train from, the run's writers, and the counters a resumed run carries on."""
    cfg, t = self.config, self.config.train
    # CPU seconds beside wall seconds: on a shared host the wall time says little about a run's cost.
    r = _RunState(start_time=time.time(), start_cpu=time.process_time())
    r.state = self.initial_state()
    r.step = start = int(jax.device_get(r.state.step))
    if start >= t.steps:
      self._log(f"{self.workdir} already finished {start} steps; rewriting result.json from its checkpoint")
    if self.is_main:
      metrics.write_json(os.path.join(self.records.local, "config.json"), nsl_config.to_dict(cfg))
      rundata.save(self.workdir, cfg)  # its tokenizer travels with the run (nsl.data.rundata)
    # A resumed run replays the steps after its checkpoint: their old lines (and a partial last
    # line of a killed write) are dropped, so every step is logged once.
    sinks = [observe.WandbSink(cfg, self.records.local, nsl_config.to_dict(cfg))] if self.is_main and cfg.log.wandb else []
    r.writer = metrics.MetricsWriter(self.records.local, enabled=self.is_main, resume_step=start, sinks=sinks)
    r.profiler = observe.StepProfiler(t.profile_steps, self.records.local, self._log)
    r.trace = observe.DataTrace(bool(cfg.log.data_trace), self.records.local, start,
                                jax.process_index(), jax.process_count())
    r.bar = metrics.Progress(t.steps, initial=start, enabled=self.is_main and self.progress, every=t.log_every)
    r.meta = {"config": nsl_config.to_dict(cfg)}
    # The run's own counters travel in every checkpoint, so a resumed (or re-finished) run
    # reports the same figures as an uninterrupted one.
    carried = self.resumed_meta.get("record", {}) if int(self.resumed_meta.get("step", -1)) == start else {}
    r.last_loss, r.eval_loss = carried.get("last_loss"), carried.get("eval_val")
    r.eval_sources = carried.get("eval_sources") or {}  # a mixture's per-source validation NLLs
    r.eval_step = carried.get("eval_step")
    r.nonfinite_total = int(carried.get("nonfinite_total", 0))
    r.wall_before = float(carried.get("wall_time_sec", 0.0))
    r.cpu_before = float(carried.get("cpu_time_sec", 0.0))
    r.tick, r.tick_step = time.time(), start
    r.last_save = r.tick  # checkpoint.every_minutes counts from here (a restore is as good as a save)
    return r

  def _train_one(self, r: "_RunState"):
    """One train step on the next batch; its metrics, on the device."""
    local = next(self.train_iter)
    r.trace.write(r.step + 1, local)
    batch = sharding.global_batch(local, self.mesh)
    r.profiler.before_step(r.step + 1)
    r.state, m = self._train_step(r.state, batch, self.base_rng, self.schedule)
    r.step += 1
    r.profiler.after_step(r.step, r.state)
    r.nonfinite_since = m["nonfinite"] if r.nonfinite_since is None else r.nonfinite_since + m["nonfinite"]
    return m

  def _log_step(self, r: "_RunState", m) -> None:
    """The metrics.jsonl line of a step (loss, throughput, the data's shares); too many non-finite
    steps in a row stop the run."""
    t = self.config.train
    m = jax.device_get(m)
    now = time.time()
    perf = metrics.throughput((r.step - r.tick_step) * self.tokens_per_step, now - r.tick, self.flops_per_token,
                              self.mesh.size)
    r.tick, r.tick_step = now, r.step
    r.flush_nonfinite()
    r.last_loss = float(m["loss"])
    record = {k: float(v) for k, v in m.items() if k != "nonfinite"}
    record.update(perf, tokens=r.step * self.tokens_per_step, nonfinite=int(m["nonfinite"]),
                  nonfinite_total=r.nonfinite_total)
    record.update(self.data_fields())
    r.writer.write(r.step, record)
    r.bar.update(r.step, {"loss": r.last_loss, "tok/s": round(perf["tokens_per_sec"])})
    run_length = int(jax.device_get(r.state.nonfinite_run))
    if run_length >= t.max_nonfinite:
      r.status = "failed"
      raise NslError(f"{run_length} consecutive non-finite steps at step {r.step} "
                     f"(train.max_nonfinite={t.max_nonfinite}); the last good checkpoint is kept "
                     "in the workdir — lower train.lr or check the data")

  def _evaluate(self, r: "_RunState") -> None:
    """The validation NLL and every config.evals metric, logged and kept for the record."""
    evals = self.evaluations(r.state.params)
    (r.eval_loss, r.eval_sources), r.eval_step = self._val(evals), r.step
    r.writer.write(r.step, evals)

  def _checkpoint(self, r: "_RunState", preemption) -> bool:
    """Saves every checkpoint.every steps, or when checkpoint.every_minutes have passed (agreed by
    every process in the preemption poll); True when the run must stop (preempted)."""
    minutes = self.config.checkpoint.every_minutes
    stop, timed = preemption.poll(r.step, bool(minutes) and time.time() - r.last_save >= 60 * minutes)
    if (r.step % self.config.checkpoint.every == 0 or timed) and r.step < self.config.train.steps and not stop:
      self._save(r, force=timed)
      r.last_save = time.time()
    return stop

  def _save(self, r: "_RunState", force: bool) -> None:
    r.flush_nonfinite()  # the count in the checkpoint is exact at its step
    if self.is_main:  # before the save: a checkpoint's steps are always in the bucket's records
      self.records.push()
    self.checkpointer.save(r.step, r.state, self.train_iter, r.record_meta(), force=force)

  def _finish(self, r: "_RunState") -> None:
    """The last step's evaluation, then its checkpoint, which records it: a kill between the two
    writes costs only this evaluation, and a rerun rewrites result.json from the checkpoint."""
    r.flush_nonfinite()
    if r.status == "done" and r.eval_step != r.step:
      self._evaluate(r)
    if self.checkpointer.latest_step() != r.step:
      self._save(r, force=True)
    self.checkpointer.wait()

  def _close(self, r: "_RunState") -> None:
    """Closes the writers and the checkpointer, and writes result.json, whatever the run's end."""
    r.profiler.close()
    r.trace.close()
    r.bar.close()
    r.writer.close()
    try:
      self.checkpointer.close()
    finally:
      r.result = self._result(r.status, r.step, r.last_loss, r.eval_loss, r.timing(), r.nonfinite_total,
                              r.state if r.status != "failed" else None, r.eval_sources)
      if self.is_main:
        metrics.write_json(os.path.join(self.records.local, "result.json"), r.result)
        self.records.push()
      self._preemption.__exit__(None, None, None)
      if self.lock is not None:
        self.lock.release()

  def data_fields(self) -> dict[str, float]:
    """What the data pipeline adds to a step's line: a mixture's shares of each source ({} else)."""
    take = getattr(self.train_iter, "take_shares", None)  # a mixture's iterator counts them
    return take() if take is not None else {}

  def _val(self, evals: dict[str, float]) -> tuple[float, dict[str, float]]:
    """An evaluation's validation NLL and, for a mixture, each source's ({NAME: NLL}; {} otherwise)."""
    key = "eval_val_nll" + self.eval_suffix
    return evals[key], {s.name: evals[f"{key}/{s.name}"] for s in self.data.sources}

  def _result(self, status, step, last_loss, eval_loss, timing, nonfinite_total, state=None,
              eval_sources=None) -> dict[str, Any]:
    tokens = step * self.tokens_per_step
    evals = {"val" + self.eval_suffix: eval_loss} if eval_loss is not None else {}
    if eval_loss is not None:  # a mixture: each source's split beside the weighted mean
      evals.update({f"val{self.eval_suffix}/{n}": v for n, v in (eval_sources or {}).items()})
    byte_fields = self.data.record_fields(evals)
    return {
        "status": status, "family": self.config.family, "variant": self.config.model.variant,
        "seed": self.config.seed, "init_seed": nsl_config.init_seed(self.config),
        "steps": step, "tokens": tokens, **self.counts,
        "flops_per_token": self.flops_per_token, "flops": self.flops_per_token * tokens,
        "flops_convention": FLOPS_CONVENTION, "final_loss": last_loss,
        "eval": evals, **byte_fields,
        "unigram_entropy_nats": self.manifest.get("unigram_entropy_nats"),
        **timing, "nonfinite_steps": nonfinite_total, "devices": jax.device_count(),
        "processes": jax.process_count(), "nsl_version": nsl.__version__,
        # The final state's bits (docs/guide/determinism.md): equal digests, equal runs.
        "state_sha256": checkpoint.state_digest(state) if state is not None else None,
    }


class _DirData:
  """One data dir as the trainer reads it (data.path), with a mixture's interface
  (`nsl.data.mixture.TrainerData`): its train stream, its val split, its record's byte fields."""

  sources = ()  # no per-source splits

  def __init__(self, config, path: str, process_index: int, process_count: int):
    d, t = config.data, config.train
    self.path = path
    self.train_iter = pipeline.make_train_iterator(
        path, seq_len=d.seq_len, global_batch_size=t.batch_size, seed=config.seed,
        process_index=process_index, process_count=process_count, verify=d.verify)
    self.eval_batches = pipeline.make_eval_batches(
        path, "val", seq_len=d.seq_len, batch_size=t.batch_size // t.grad_accum, max_batches=t.eval_batches,
        process_index=process_index, process_count=process_count)

  def evaluate(self, summed_nll, suffix: str = "") -> dict[str, float]:
    total, count = summed_nll(self.eval_batches)
    return {"eval_val_nll" + suffix: total / max(count, 1.0)}

  def record_fields(self, evals: dict[str, float]) -> dict:
    return bytes_per_token.record_fields(self.path, evals)


class _RunState:
  """What one `Trainer.run` carries from stage to stage: the train state and step, how it ends
  (`status`), the writers, and the counters a checkpoint records (`record_meta`)."""

  def __init__(self, start_time: float, start_cpu: float):
    self.start_time, self.start_cpu = start_time, start_cpu
    self.status, self.state, self.step, self.result = "done", None, 0, None
    self.writer = self.profiler = self.trace = self.bar = None
    self.meta: dict[str, Any] = {}
    self.last_loss = self.eval_loss = self.eval_step = None
    self.eval_sources: dict[str, float] = {}
    self.nonfinite_total, self.nonfinite_since = 0, None  # the latter on the device, since the last flush
    self.wall_before = self.cpu_before = 0.0
    self.tick, self.tick_step, self.last_save = 0.0, 0, 0.0

  def flush_nonfinite(self) -> None:
    """Adds the on-device count of non-finite steps since the last flush to the total: the one place it is read."""
    if self.nonfinite_since is not None:
      self.nonfinite_total += int(jax.device_get(self.nonfinite_since))
      self.nonfinite_since = None

  def timing(self) -> dict[str, float]:
    return {"wall_time_sec": self.wall_before + time.time() - self.start_time,
            "cpu_time_sec": self.cpu_before + time.process_time() - self.start_cpu}

  def record_meta(self) -> dict[str, Any]:
    self.meta["record"] = {"last_loss": self.last_loss, "eval_val": self.eval_loss, "eval_sources": self.eval_sources,
                           "eval_step": self.eval_step, "nonfinite_total": self.nonfinite_total, **self.timing()}
    return self.meta
