"""What a run compiles: the mesh, the sharded abstract state and the jitted train/eval/init steps.

One builder for the trainer (`nsl.train.loop.Trainer`) and the ahead-of-time compiler
(`nsl.compile`), so the program compiled for a TPU slice from a laptop is the one `nsl.launch`
runs on the pod (MaxText's `train_compile.py` idea, without a second copy of the step). Needs no
data and no live devices: `devices` may be a compile-only topology's.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from nsl import config as nsl_config
from nsl import sharding
from nsl.kernels import registry as kernel_registry
from nsl.models import registry
from nsl.train import state as train_state
from nsl.train import step as train_step_lib


class Program:
  """The jitted steps of `config` on a mesh of `devices`, with their abstract arguments."""

  def __init__(self, config, devices):
    devices = list(devices)
    self.config = config
    self.num_processes = len({d.process_index for d in devices})
    nsl_config.validate(config, len(devices), self.num_processes)
    self.mesh = sharding.make_mesh(config, devices)
    self.family = registry.get_family(config)
    t = config.train
    self.tokens_per_step = config.data.seq_len * t.batch_size
    self.optimizer = train_state.make_optimizer(config)
    # The LR schedule's numbers: the train step's last argument, so budgets share its compile.
    self.schedule = train_state.schedule_args(config)
    self.rules = sharding.rules(config)

    boxed = jax.eval_shape(lambda r: train_state.create(self.family.init(r), self.optimizer),
                           jax.random.PRNGKey(0))
    with nn.logical_axis_rules(self.rules):
      self.state_sharding = sharding.logical_sharding(boxed, self.mesh, config)
    sharding.check_divisible(nn.unbox(boxed), self.state_sharding)
    self.abstract_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                       nn.unbox(boxed), self.state_sharding)
    self.counts = self.family.param_counts(boxed.params)
    self.flops_per_token = self.family.flops_per_token()

    self.batch_sharding = sharding.batch_sharding(self.mesh)
    repl = sharding.replicated(self.mesh)
    step_fn = train_step_lib.make_train_step(self.family, config, t.grad_accum)
    self._train_fn = self._with_rules(step_fn, "train_step")
    self.train_step = jax.jit(self._train_fn, in_shardings=(self.state_sharding, self.batch_sharding, repl, repl),
                              out_shardings=(self.state_sharding, repl), donate_argnums=(0,))
    self.eval_step = jax.jit(self._with_rules(train_step_lib.make_eval_step(self.family), "eval_step"),
                             in_shardings=(self.state_sharding.params, self.batch_sharding), out_shardings=repl)
    init = lambda r: train_state.create(nn.unbox(self.family.init(r)), self.optimizer)
    self.init = jax.jit(self._with_rules(init, "init_state"), out_shardings=self.state_sharding)

  def _with_rules(self, fn, name: str):
    """`fn` traced under the config's logical axis rules and kernel switch (`model.cpu_kernels`),
    named `name` so a profile (`train.profile_steps`) and the compiled module say which step it is."""
    cpu_kernels = self.config.model.cpu_kernels

    def wrapped(*args):
      with nn.logical_axis_rules(self.rules), kernel_registry.use(cpu_kernels=cpu_kernels):
        return fn(*args)
    wrapped.__name__ = wrapped.__qualname__ = name
    return wrapped

  def mesh_context(self):
    """Enter around every call or lowering of the steps (`sharding.use_mesh`)."""
    return sharding.use_mesh(self.mesh)

  # -- abstract arguments (for `.lower`) --------------------------------------------------------
  def abstract_batch(self, batch_size: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch as the pipeline yields it (the family's `dummy_batch` shapes), sharded."""
    b = batch_size or self.config.train.batch_size
    shapes = jax.eval_shape(lambda: self.family.dummy_batch(b))
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sharding) for k, v in shapes.items()}

  def abstract_rng(self) -> jax.ShapeDtypeStruct:
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding.replicated(self.mesh))

  def abstract_schedule(self) -> train_state.Schedule:
    repl = sharding.replicated(self.mesh)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl), self.schedule)

  def lower_train(self):
    with self.mesh_context():
      return self.train_step.lower(self.abstract_state, self.abstract_batch(), self.abstract_rng(),
                                   self.abstract_schedule())

  def lower_eval(self):
    t = self.config.train
    with self.mesh_context():
      return self.eval_step.lower(self.abstract_state.params, self.abstract_batch(t.batch_size // t.grad_accum))

  def describe(self) -> dict[str, Any]:
    """Choices the platform made for this program: the kernels the kernel registry picked while
    the train step was traced (shapes only) under its mesh, per kind, each name once
    ("cudnn+pallas_gpu" where cuDNN takes some attentions and the Pallas kernel the rest)."""
    with self.mesh_context(), kernel_registry.record() as picks:
      # A new function object: JAX's trace cache would otherwise replay an earlier trace unseen.
      jax.eval_shape(lambda *args: self._train_fn(*args), self.abstract_state, self.abstract_batch(),
                     self.abstract_rng(), self.abstract_schedule())
      kernels = picks.summary()
      return {"platform": sharding.platform(), "attention_impl": kernels.get("attention", "none"),
              "kernels": kernels, "dtype": str(np.dtype(self.family.dims.compute_dtype))}
