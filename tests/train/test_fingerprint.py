"""The arrays' fingerprint saved with each checkpoint (nsl/fingerprint.py): the same numbers on any
mesh, and a changed bit, a swapped pair or another dtype changes them."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from nsl import fingerprint


def _tree(rng):
  return {"w": jnp.asarray(rng.standard_normal((64, 48)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal(48), jnp.bfloat16),
          "count": jnp.asarray(7, jnp.int32), "mask": jnp.asarray(rng.random(10) > 0.5)}


def test_the_fingerprint_does_not_depend_on_the_mesh():
  tree = _tree(np.random.default_rng(0))
  tree["f64"] = np.random.default_rng(2).standard_normal(5)  # a host array: summed as JAX holds it (float32)
  devices = np.array(jax.devices())
  assert devices.size == 8, "the suite runs with 8 CPU devices (tests/conftest.py)"
  mesh = Mesh(devices.reshape(4, 2), ("a", "b"))
  sharded = dict(tree, w=jax.device_put(tree["w"], NamedSharding(mesh, P("a", "b"))),
                 b=jax.device_put(tree["b"], NamedSharding(mesh, P("a"))))
  one = fingerprint.of(tree)
  assert fingerprint.of(sharded) == one and sorted(one) == ["['b']", "['count']", "['f64']", "['mask']", "['w']"]
  # numpy sums a CPU run's arrays in place, the jitted pass an accelerator's: the same numbers
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  jitted = np.asarray(fingerprint._sums([x for _, x in leaves]))
  assert {jax.tree_util.keystr(p): f"{int(a):08x}{int(b):08x}" for (p, _), (a, b) in zip(leaves, jitted)} == one
  assert all(len(v) == 16 for v in one.values())


def test_any_changed_bit_or_swapped_pair_changes_the_fingerprint():
  rng = np.random.default_rng(1)
  w = np.asarray(rng.standard_normal((64, 48)), np.float32)
  base = fingerprint.of({"w": jnp.asarray(w)})["['w']"]
  seen = {base}
  for i, bit in ((0, 0), (1000, 31), (3071, 7), (512, 22)):
    flipped = w.copy().reshape(-1).view(np.uint32)
    flipped[i] ^= np.uint32(1 << bit)
    seen.add(fingerprint.of({"w": jnp.asarray(flipped.view(np.float32).reshape(w.shape))})["['w']"])
  swapped = w.copy().reshape(-1)
  swapped[[3, 9]] = swapped[[9, 3]]
  seen.add(fingerprint.of({"w": jnp.asarray(swapped.reshape(w.shape))})["['w']"])
  as_int = fingerprint.of({"w": jnp.asarray(w.view(np.int32))})["['w']"]  # the same bits: the same words
  assert len(seen) == 6 and as_int == base


def test_first_difference_names_the_changed_array_and_skips_the_unshared():
  a = {"['x']": "1", "['y']": "2"}
  assert fingerprint.first_difference(a, dict(a)) is None
  assert fingerprint.first_difference(a, {"['x']": "1", "['y']": "3", "['z']": "9"}) == "['y']"
  assert fingerprint.first_difference(a, {"['x']": "1"}) is None
