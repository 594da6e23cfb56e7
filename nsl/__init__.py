"""nsl: pretraining research on transformers that separate state from prediction."""

__version__ = "0.1.0"

from nsl import hostmem as _hostmem

_hostmem.at_startup()  # `python -m nsl.…`: re-executes once with huge-page malloc, before JAX loads


def _leave_out_absent_tpu() -> None:
  """With libtpu installed (the `[tpu]` extra, which `nsl.compile` needs on any host) but no TPU
  chip on this machine, JAX would still try to start a TPU client at its first device query, and
  libtpu prints a screen of warnings to stderr on every command. When the hardware scan finds no
  chip and the user has not chosen platforms, JAX's TPU backend factory fails quietly instead (the
  platform stays registered, so TPU lowering rules still exist). Compile-only TPU topologies
  (`jax.experimental.topologies`) load libtpu directly and are unaffected."""
  import dataclasses
  import os

  if os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_FORCE_TPU_INIT"):
    return
  try:
    from jax._src import hardware_utils, xla_bridge  # private, hence the guard
    factories = xla_bridge._backend_factories  # pylint: disable=protected-access
    if "tpu" in factories and hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0:
      def no_chip():
        raise RuntimeError("no TPU chip on this host")
      factories["tpu"] = dataclasses.replace(factories["tpu"], factory=no_chip, fail_quietly=True)
  except Exception:  # another JAX version: at worst the warnings come back
    pass


_leave_out_absent_tpu()
