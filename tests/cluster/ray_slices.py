"""A real Ray cluster on this host standing for TPU slices, for the tests (issue #53: "a local Ray
cluster whose nodes carry custom resources standing for two slices of two hosts").

`start({"slice-a": 2, "slice-b": 2})` starts one raylet per host with `ray.cluster_utils.Cluster`,
each carrying what Ray puts on a Cloud TPU VM (docs/guide/pods.md#ray): host 0 of every slice
`TPU-<type>-head: 1`, every host the slice's own name as a resource (`slice-a: 1`). The nodes have
no CPUs to schedule (the grid's actors ask for none) and start no idle workers. Their environment
is this process's at start, so the trainers the actors start inherit it: one CPU device per
process (`SUBPROCESS_XLA_FLAGS`), the suite's compilation cache.

`ray start --address` cannot stand in here: a second node on one host collides with the first on
the dashboard agent's fixed port. Four raylets start in about 11 s on 2 cores (20-26 s while the
cores are shared with other jobs).
The fixture is `ray_slices` (module scope, import it into a test module): two "cpu2" slices of two
hosts, "slice-a" and "slice-b"; `ray_slices.address` is the cluster's address, `ray_slices.hosts`
each slice's nodes (host 0 first), for `remove_node` / `add_node`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from tests.helpers import SUBPROCESS_XLA_FLAGS

SLICE_TYPE = "cpu2"


def own_disk(i: int) -> dict:
  """Node i's own directory for runtime environments (the shipped code): the nodes share this
  host's session directory, and two nodes' agents unpacking and collecting one package in one
  place pull the code from under each other's workers (a real node has a disk of its own). The
  head keeps Ray's default: a driver stages the code it uploads there."""
  return {"runtime_env_dir_name": f"runtime_resources_node{i}"} if i else {}


def start(slices: dict[str, int], slice_type: str = SLICE_TYPE):
  """A cluster whose nodes are the hosts of `slices` (name -> hosts), all of type `slice_type`."""
  from ray.cluster_utils import Cluster

  temp = tempfile.mkdtemp(prefix="nslray", dir="/tmp")  # short: Ray's socket paths live under it
  os.makedirs(os.path.join(temp, "ray"))
  nodes = [{**({f"TPU-{slice_type}-head": 1} if i == 0 else {}), name: 1}
           for name, hosts in slices.items() for i in range(hosts)]
  t0 = time.time()
  with pytest.MonkeyPatch.context() as mp:  # Cluster writes its address to $RAY_TMPDIR/ray, where a bare
    mp.setenv("RAY_TMPDIR", temp)           # ray.init() of any process would find it: keep it to ourselves
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, temp_dir=temp,
                                                                resources=nodes[0], **own_disk(0)))
  cluster.temp, cluster.hosts = temp, {name: [] for name in slices}  # slice -> its nodes, host 0 first
  slice_of = lambda resources: next(k for k in resources if k in slices)
  cluster.hosts[slice_of(nodes[0])].append(cluster.head_node)
  try:
    for i, resources in enumerate(nodes[1:], 1):
      cluster.hosts[slice_of(resources)].append(cluster.add_node(num_cpus=0, resources=resources, **own_disk(i)))
    cluster.wait_for_nodes()
  except BaseException:
    stop(cluster)
    raise
  cluster.start_seconds = time.time() - t0
  return cluster


def stop(cluster) -> None:
  """Stops the cluster's processes and removes its scratch directory."""
  cluster.shutdown()
  shutil.rmtree(getattr(cluster, "temp", ""), ignore_errors=True)


@pytest.fixture(scope="module")
def ray_slices():
  pytest.importorskip("ray")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("XLA_FLAGS", SUBPROCESS_XLA_FLAGS)  # the raylets' environment is the trainers'
    mp.setenv("JAX_PLATFORMS", "cpu")
    cluster = start({"slice-a": 2, "slice-b": 2})
  print(f"\nray: {len(cluster.list_all_nodes())} nodes started in {cluster.start_seconds:.1f}s")
  try:
    yield cluster
  finally:
    stop(cluster)
