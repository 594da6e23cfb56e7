"""Cloud TPU slice names -> compile-only devices (`jax.experimental.topologies`), on any host.

Names as users write them: `v4-32`, `v5p-64` (v4 and v5p names count TensorCores, two per chip,
so v5p-64 is 32 chips), `v5e-256` or `v5litepod-256`, `v6e-64` (v5e and v6e names count chips),
and the explicit form `v5e:4x4` / `v5p:2x4x4`. The result holds the slice's devices (hosts
included: 4 chips per host, 8 on single-host v5e/v6e-8), the chip's HBM and its bf16 peak, which
is what `nsl.compile` needs to compile the launcher's step for that slice with libtpu.

`CHIPS` holds each accelerator's peak dense bf16 FLOP/s, HBM bandwidth and capacity as its
vendor publishes them (TPUs: the Cloud TPU system-architecture pages; GPUs: NVIDIA's H100 and
H200 datasheets, SXM parts, dense, i.e. without 2:4 sparsity): `nsl.compile`'s roofline bound and
the benchmarks' MFU divide by them (docs/guide/accelerators.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile

from nsl.errors import ConfigError

GIB = 1 << 30
GB = 10**9


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's published figures (per chip; a TPU v4/v5p chip is two TensorCores)."""

  name: str
  peak_bf16_flops: float  # dense matrix-unit peak, FLOP/s
  hbm_bandwidth: float  # bytes/s
  hbm_bytes: int
  source: str
  device_kinds: tuple[str, ...] = ()  # substrings of jax's `device_kind` naming this chip


CHIPS = {
    "v4": Chip("v4", 275e12, 1200 * GB, 32 * GIB, "cloud.google.com/tpu/docs/v4", ("TPU v4",)),
    "v5e": Chip("v5e", 197e12, 819 * GB, 16 * GIB, "cloud.google.com/tpu/docs/v5e", ("TPU v5 lite", "TPU v5e")),
    "v5p": Chip("v5p", 459e12, 2765 * GB, 95 * GIB, "cloud.google.com/tpu/docs/v5p", ("TPU v5p", "TPU v5")),
    "v6e": Chip("v6e", 918e12, 1640 * GB, 32 * GIB, "cloud.google.com/tpu/docs/v6e", ("TPU v6 lite", "TPU v6e")),
    "H100": Chip("H100", 989.4e12, 3350 * GB, 80 * GB, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)", ("H100",)),
    "H200": Chip("H200", 989.4e12, 4800 * GB, 141 * GB, "NVIDIA H200 Tensor Core GPU datasheet (SXM)", ("H200",)),
}


def chip_for_device(device_kind: str) -> Chip | None:
  """The `CHIPS` entry a jax `device_kind` names ("NVIDIA H100 80GB HBM3", "TPU v5 lite"), or None.
  The longest matching name wins, so "TPU v5 lite" is a v5e and "TPU v5" a v5p."""
  kind = device_kind.lower()
  best = max(((len(k), c) for c in CHIPS.values() for k in c.device_kinds if k.lower() in kind),
             default=None, key=lambda t: t[0])
  return None if best is None else best[1]


@dataclasses.dataclass(frozen=True)
class Generation:
  name: str
  dims: int  # torus dimensions: 3 (v4, v5p) or 2 (v5e, v6e)
  cores_per_name_unit: int  # TensorCores per chip counted by the slice name (2) or chips (1)
  chip_config: str
  aliases: tuple[str, ...] = ()

  @property
  def chip(self) -> Chip:
    return CHIPS[self.name]

  @property
  def hbm_bytes(self) -> int:  # per chip (Cloud TPU system architecture pages)
    return self.chip.hbm_bytes


GENERATIONS = {
    "v4": Generation("v4", 3, 2, "megacore"),
    "v5p": Generation("v5p", 3, 2, "default"),
    "v5e": Generation("v5e", 2, 1, "default", aliases=("v5litepod",)),
    "v6e": Generation("v6e", 2, 1, "default"),
}

# Chips -> physical shape of the slices Cloud TPU offers (2D for v5e/v6e, 3D tori for v4/v5p).
SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
             256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16)}


@dataclasses.dataclass
class Slice:
  name: str  # as the user wrote it
  generation: Generation
  shape: tuple[int, ...]
  devices: list

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def hosts(self) -> int:
    return len({d.process_index for d in self.devices})

  @property
  def topology_name(self) -> str:
    return f"{self.generation.name}:{'x'.join(map(str, self.shape))}"


def known_names() -> list[str]:
  names = []
  for g in GENERATIONS.values():
    shapes = SHAPES_3D if g.dims == 3 else SHAPES_2D
    names += [f"{g.name}-{c * g.cores_per_name_unit}" for c in shapes]
  return names


def parse(name: str) -> tuple[Generation, tuple[int, ...]]:
  """`v5p-64` / `v5e:4x4` -> (generation, physical shape); a ConfigError lists the known names."""
  text = name.strip().lower()
  by_name = {alias: g for g in GENERATIONS.values() for alias in (g.name,) + g.aliases}
  hint = (f"--topology={name!r} is not a known TPU slice; use a Cloud TPU name such as "
          f"{', '.join(known_names()[:4])}, ... (known: {' '.join(known_names())}) or the form v5e:4x4 / v5p:2x4x4")
  m = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  if m and m.group(1) in by_name:
    g = by_name[m.group(1)]
    units = int(m.group(2))
    chips, rem = divmod(units, g.cores_per_name_unit)
    shapes = SHAPES_3D if g.dims == 3 else SHAPES_2D
    if rem or chips not in shapes:
      raise ConfigError(hint)
    return g, shapes[chips]
  m = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)+)", text)
  if m and m.group(1) in by_name:
    g = by_name[m.group(1)]
    shape = tuple(int(s) for s in m.group(2).split("x"))
    if len(shape) == 3 and g.dims == 2 and shape[2] == 1:
      shape = shape[:2]
    if len(shape) != g.dims or min(shape) < 1:
      raise ConfigError(f"--topology={name!r}: {g.name} slices are {g.dims}-D (e.g. "
                        f"{g.name}:{'x'.join(['2'] * g.dims)})")
    return g, shape
  raise ConfigError(hint)


def _host_bounds(g: Generation, shape: tuple[int, ...]) -> tuple[int, int, int]:
  """Chips per host: 4 (2x2) on multi-host slices; single-host v5e/v6e-8 has all 8 on one host."""
  chips = math.prod(shape)
  if chips <= 4:
    full = tuple(shape) + (1,) * (3 - len(shape))
    return full  # one host holds the whole slice
  if g.dims == 2 and chips == 8:
    return (2, 4, 1)
  return (2, 2, 1)


def get(name: str, num_slices: int = 1) -> Slice:
  """The compile-only devices of a TPU slice (needs libtpu: `pip install 'nsl[tpu]'`)."""
  g, shape = parse(name)
  try:
    from jax.experimental import topologies
  except ImportError as e:  # very old jax
    raise ConfigError(f"--topology needs jax.experimental.topologies ({e})") from e
  topo_name = f"{g.name}:{'x'.join(map(str, shape))}"
  _allow_concurrent_libtpu()
  with _quiet_stderr() as captured:
    try:
      desc = topologies.get_topology_desc(platform="tpu", topology_name=topo_name, chip_config_name=g.chip_config,
                                          chips_per_host_bounds=_host_bounds(g, shape), num_slices=num_slices)
    except Exception as e:  # no libtpu, or libtpu refused the topology
      detail = " ".join(str(e).split())[:200]
      raise ConfigError(f"--topology={name!r}: could not build the TPU topology {topo_name} ({detail}); "
                        "install libtpu with `pip install -e '.[tpu]'` (it runs on any host)") from e
  del captured
  return Slice(name, g, shape, list(desc.devices))


def _allow_concurrent_libtpu() -> None:
  """libtpu takes a host-wide lock file (/tmp/libtpu_lockfile) so two processes never drive the
  same chips. A host without chips only compiles, so several compiles (parallel test workers, a
  grid of `nsl.compile` runs) may load it at once; on a TPU host the lock is left alone."""
  try:
    from jax._src import hardware_utils
    chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
  except Exception:
    return
  if chips == 0:
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


class _quiet_stderr:
  """libtpu writes initialisation warnings straight to fd 2 when it finds no TPU; keep them out
  of a command whose contract is one JSON line or one error line."""

  def __enter__(self):
    self._saved = os.dup(2)
    self._file = tempfile.TemporaryFile()
    os.dup2(self._file.fileno(), 2)
    return self._file

  def __exit__(self, *exc):
    os.dup2(self._saved, 2)
    os.close(self._saved)
    self._file.close()
