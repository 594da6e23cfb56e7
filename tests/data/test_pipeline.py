"""pipeline: packed windows, segment ids, shuffling, resume, process slices, eval batches."""

import os
import shutil

import numpy as np
import pytest

from nsl.data import pipeline
from nsl.data import prepare as prepare_lib
from nsl.errors import ConfigError, DataError

EOS = 256
SEQ = 31  # windows of 32 tokens


def train_tokens(data_dir):
  m = prepare_lib.load_manifest(data_dir)
  return np.concatenate([np.fromfile(os.path.join(data_dir, s["file"]), "<u2")
                         for s in m["splits"]["train"]["shards"]]).astype(np.int32)


def take(it, n):
  return [next(it) for _ in range(n)]


def test_segment_ids_rule():
  toks = np.array([[5, EOS, 7, 8, EOS, EOS, 9], [EOS, 1, 2, 3, 4, 5, EOS]])
  want = np.array([[1 + int((row[:i] == EOS).sum()) for i in range(row.size)] for row in toks])
  np.testing.assert_array_equal(pipeline.segment_ids(toks, EOS), want)
  assert want[0].tolist() == [1, 1, 2, 2, 2, 3, 4]  # an EOS belongs to the document it ends


def test_windows_are_packed_shuffled_epochs(byte_dir):
  flat = train_tokens(byte_dir)
  n = flat.size // (SEQ + 1)
  windows = flat[: n * (SEQ + 1)].reshape(n, SEQ + 1)
  it = pipeline.make_train_iterator(byte_dir, SEQ, global_batch_size=4, seed=0)
  epochs = take(it, 2 * (n // 4) + 2)  # past two epochs: the iterator repeats forever
  rows = np.concatenate([b["tokens"] for b in epochs])
  assert rows.shape[1] == SEQ + 1 and rows.dtype == np.int32
  # Every row is one window; each epoch visits every window once, in a new order.
  index = {w.tobytes(): i for i, w in enumerate(windows)}
  order = [index[r.tobytes()] for r in rows]
  assert sorted(order[:n]) == list(range(n)) and sorted(order[n:2 * n]) == list(range(n))
  assert order[:n] != list(range(n)) and order[:n] != order[n:2 * n]
  for b in epochs:
    np.testing.assert_array_equal(b["segment"], pipeline.segment_ids(b["tokens"], EOS))
    assert b["segment"].dtype == np.int32 and (b["segment"][:, 0] == 1).all()
  # Deterministic given the seed, different for another seed.
  again = pipeline.make_train_iterator(byte_dir, SEQ, global_batch_size=4, seed=0)
  np.testing.assert_array_equal(next(again)["tokens"], epochs[0]["tokens"])
  other = pipeline.make_train_iterator(byte_dir, SEQ, global_batch_size=4, seed=1)
  assert not np.array_equal(next(other)["tokens"], epochs[0]["tokens"])


def test_resume_from_state_matches_uninterrupted(byte_dir):
  n = pipeline.num_windows(byte_dir, "train", SEQ)
  steps = n // 4 + 3  # the restore point lies past an epoch boundary
  ref = take(pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=7), steps + 5)
  it = pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=7)
  take(it, steps)
  state = it.get_state()
  resumed = pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=7)
  resumed.set_state(state)
  for want, got in zip(ref[steps:], take(resumed, 5)):
    np.testing.assert_array_equal(want["tokens"], got["tokens"])
    np.testing.assert_array_equal(want["segment"], got["segment"])


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_slices_union_is_the_global_batch(byte_dir, process_count):
  ref = take(pipeline.make_train_iterator(byte_dir, SEQ, 8, seed=3), 6)
  parts = [take(pipeline.make_train_iterator(byte_dir, SEQ, 8, seed=3, process_index=p,
                                             process_count=process_count), 6)
           for p in range(process_count)]
  for step, want in enumerate(ref):
    got = np.concatenate([parts[p][step]["tokens"] for p in range(process_count)])
    assert parts[0][step]["tokens"].shape == (8 // process_count, SEQ + 1)
    np.testing.assert_array_equal(got, want["tokens"])


def test_train_iterator_errors(byte_dir):
  n = pipeline.num_windows(byte_dir, "train", SEQ)
  with pytest.raises(DataError, match=f"has {n} windows .*fewer than one global batch of {n + 1}"):
    pipeline.make_train_iterator(byte_dir, SEQ, n + 1, seed=0)
  with pytest.raises(ConfigError, match="multiple of the process count 3"):
    pipeline.make_train_iterator(byte_dir, SEQ, 8, seed=0, process_count=3)
  with pytest.raises(ConfigError, match="seed"):
    pipeline.make_train_iterator(byte_dir, SEQ, 8, seed=-1)
  with pytest.raises(ConfigError, match="verify"):
    pipeline.make_train_iterator(byte_dir, SEQ, 8, seed=0, verify="md5")
  with pytest.raises(DataError, match="run `python -m nsl.data.prepare"):
    pipeline.make_train_iterator(byte_dir + "-missing", SEQ, 8, seed=0)


def test_train_iterator_verifies_shards(byte_dir, tmp_path):
  d = str(tmp_path / "copy")
  shutil.copytree(byte_dir, d)
  with open(os.path.join(d, "train_00002.bin"), "r+b") as f:
    f.write(b"\xff")
  pipeline.make_train_iterator(d, SEQ, 4, seed=0)  # size check passes
  with pytest.raises(DataError, match="corrupt shard .*train_00002.bin"):
    pipeline.make_train_iterator(d, SEQ, 4, seed=0, verify="sha256")


def test_eval_batches_cover_split_in_order_with_padding(byte_dir):
  m = prepare_lib.load_manifest(byte_dir)
  flat = np.concatenate([np.fromfile(os.path.join(byte_dir, s["file"]), "<u2")
                         for s in m["splits"]["val"]["shards"]]).astype(np.int32)
  n = flat.size // (SEQ + 1)
  batch = next(b for b in range(3, 10) if n % b)  # make the last batch short
  batches = list(pipeline.make_eval_batches(byte_dir, "val", SEQ, batch))
  assert len(batches) == -(-n // batch)
  assert all(b["tokens"].shape == (batch, SEQ + 1) for b in batches)
  tokens = np.concatenate([b["tokens"] for b in batches])
  segment = np.concatenate([b["segment"] for b in batches])
  np.testing.assert_array_equal(tokens[:n].ravel(), flat[: n * (SEQ + 1)])
  np.testing.assert_array_equal(segment[:n], pipeline.segment_ids(tokens[:n], EOS))
  assert (tokens[n:] == EOS).all() and (segment[n:] == 0).all() and len(tokens) > n
  # Deterministic and re-iterable; max_batches truncates; processes split the rows.
  assert len(pipeline.make_eval_batches(byte_dir, "val", SEQ, batch, max_batches=1)) == 1
  halves = [list(pipeline.make_eval_batches(byte_dir, "val", SEQ, 2 * batch, process_index=p,
                                            process_count=2)) for p in range(2)]
  whole = list(pipeline.make_eval_batches(byte_dir, "val", SEQ, 2 * batch))
  for b, (h0, h1) in enumerate(zip(*halves)):
    np.testing.assert_array_equal(np.concatenate([h0["segment"], h1["segment"]]),
                                  whole[b]["segment"])
    np.testing.assert_array_equal(np.concatenate([h0["tokens"], h1["tokens"]]), whole[b]["tokens"])
  with pytest.raises(DataError, match="less than one window"):
    pipeline.make_eval_batches(byte_dir, "val", flat.size, 2)


def test_read_threads_change_nothing_but_speed(byte_dir):
  """Grain's worker threads hand batches out in index order: the same batches and states as inline
  reading, and a state saved with one thread count restores under another."""
  inline = pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=5, read_threads=0, prefetch=0)
  threaded = pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=5, read_threads=3, prefetch=5)
  for _ in range(9):
    a, b = next(inline), next(threaded)
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_array_equal(a["segment"], b["segment"])
  assert inline.get_state() == threaded.get_state()
  resumed = pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=5, read_threads=0, prefetch=0)
  resumed.set_state(threaded.get_state())
  np.testing.assert_array_equal(next(resumed)["tokens"], next(threaded)["tokens"])
  with pytest.raises(ConfigError, match="both 0 .* or both positive"):
    pipeline.make_train_iterator(byte_dir, SEQ, 4, seed=5, read_threads=2, prefetch=0)
