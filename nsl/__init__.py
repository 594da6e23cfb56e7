"""nsl: pretraining research on transformers that separate state from prediction."""

__version__ = "0.1.0"

import os as _os
import sys as _sys

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


class _CheckoutKernels:
  """Finds `nsl.kernels` in a source checkout: the top-level kernels/ folder, as a namespace package.

  The folder has no `__init__.py`, so from the checkout's root `import kernels` finds PyPI's
  package of that name (transformers >= 5 imports it) and never ours (docs/design.md#kernels-folder).
  A wheel holds the kernels as nsl/kernels/, found like any subpackage. In a checkout nothing else
  maps `nsl.kernels` to ../kernels: setuptools' editable finder maps only packages with an
  `__init__.py` to another folder (pypa/setuptools#4943), and Python started in the root finds nsl/
  alone. Last on sys.meta_path, this answers only what every other finder left unfound."""

  folder = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "kernels")

  @classmethod
  def find_spec(cls, fullname, path=None, target=None):
    del path, target
    if fullname != "nsl.kernels":
      return None
    from importlib.machinery import ModuleSpec

    spec = ModuleSpec(fullname, None, is_package=True)  # no loader: a namespace package
    spec.submodule_search_locations = [cls.folder]
    return spec


def _find_checkout_kernels() -> None:
  """Puts `_CheckoutKernels` on sys.meta_path where this nsl/ sits in a checkout (kernels/ beside it)
  rather than in an installed wheel (nsl/kernels/ inside it)."""
  here = _os.path.dirname(_os.path.abspath(__file__))
  if _os.path.isdir(_os.path.join(here, "kernels")):
    return
  if not _os.path.isfile(_os.path.join(_CheckoutKernels.folder, "cpu_build.py")):
    return
  if not any(getattr(f, "__qualname__", None) == "_CheckoutKernels" for f in _sys.meta_path):
    _sys.meta_path.append(_CheckoutKernels)


_find_checkout_kernels()
