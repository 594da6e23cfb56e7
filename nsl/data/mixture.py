"""Weighted mixtures of prepared data dirs: `config.data.mixture = "DIR=WEIGHT,DIR=WEIGHT,..."`.

Training rows come from the sources in proportion to their weights (normalised), each source's
windows in its own shuffled, repeated order (Grain's index shuffle, seed `seed + SEED_STRIDE x i`
for source i), merged by Grain's `MapDataset.mix`, which picks the source of global row r from r
alone with exact running proportions. So the stream is deterministic, the iterator state is
Grain's `{"next_index": r}` (checkpointed and restored exactly), and processes split each global
batch as `pipeline.make_train_iterator` does. Each source's share of the rows consumed since the
last log line is logged as `data_share/NAME`; validation runs on every source's `val` split
(`eval_val_nll/NAME`), and `eval_val_nll` is their weight-averaged mean (the NLL of the training
distribution). A source of weight 0 is evaluated but not trained on. NAME is the dir's basename.
result.json gives each source's bits per byte (`eval_bits_per_byte["val/NAME"]`, from its own
bytes per token) and the mixture's (`["val"]`): its weighted NLL over its weighted bytes per token,
the bits of text drawn in the training proportions over its bytes (`TrainerData.record_fields`).

A source may be a data dir in a bucket (`gs://...`): it is read from its local copy, as
`config.data.path` is (`datadir.fetch`). All sources must share one tokenizer (`datadir.tokenizer_fingerprint`): ids that mean different
things cannot be mixed. Task dirs with labels are not mixable (docs/guide/data.md#mixtures).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

import numpy as np

from nsl.data import bytes_per_token, datadir, pipeline
from nsl.errors import ConfigError, DataError

SEED_STRIDE = 7919  # source i shuffles with seed + SEED_STRIDE * i: distinct orders per source


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  path: str
  weight: float


def parse(spec: str) -> list[Source]:
  """`"DIR=W,DIR=W"` -> sources; ConfigError (one line) on any malformed entry or bad weight."""
  where = f"config.data.mixture={spec!r}"
  out: list[Source] = []
  for entry in (e.strip() for e in str(spec).split(",")):
    if "=" not in entry:
      raise ConfigError(f"{where}: entry {entry!r} is not DIR=WEIGHT; write e.g. data/a=0.7,data/b=0.3")
    path, raw = (x.strip() for x in entry.rsplit("=", 1))
    try:
      weight = float(raw)
    except ValueError:
      raise ConfigError(f"{where}: weight {raw!r} of {path!r} is not a number") from None
    if not path or not math.isfinite(weight) or weight < 0:
      raise ConfigError(f"{where}: weight {raw} of {path!r} must be a finite number >= 0")
    name = os.path.basename(os.path.normpath(path))
    if any(s.name == name for s in out):
      raise ConfigError(f"{where}: two sources are named {name!r} (the dir's basename); rename one dir")
    out.append(Source(name, path, weight))
  if sum(s.weight for s in out) <= 0:
    raise ConfigError(f"{where}: the weights sum to 0; give at least one source a positive weight")
  return out


def load_manifests(spec: str, vocab_size: int) -> dict:
  """Checks every source dir (prepared, one tokenizer, unlabelled, ids < vocab_size); returns the
  first source's manifest (the run's tokenizer and EOS)."""
  sources = parse(spec)
  first, fingerprint = None, None
  for s in sources:
    try:
      local = datadir.fetch(s.path)  # a gs:// source: its copy in $NSL_CACHE_DIR/data/
      manifest = datadir.load_manifest(local)
    except DataError as e:
      raise DataError(f"config.data.mixture source {s.name}: {e}") from None
    if any("label_shards" in split or "extra_shards" in split for split in manifest["splits"].values()):
      raise ConfigError(f"config.data.mixture source {s.path} is a labelled task dir; mix text corpora only")
    if manifest["vocab_size"] > vocab_size:
      raise ConfigError(f"config.model.vocab_size={vocab_size} is smaller than the {manifest['vocab_size']} "
                        f"ids of mixture source {s.path}; raise config.model.vocab_size")
    fp = datadir.tokenizer_fingerprint(local, manifest)
    if first is None:
      first, fingerprint = manifest, fp
    elif fp != fingerprint:
      raise ConfigError(f"config.data.mixture: {s.path} has another tokenizer than {sources[0].path}; "
                        "prepare every source with --tokenizer_from of one dir")
  return first


def _tag(i: int, window):
  return i, window


class _ReadMixRows:
  """Global batch of (source, window) -> this process's rows, and every source's row count."""

  def __init__(self, tokens: list, window: int, eos_id: int, rows: slice, num_sources: int):
    self.tokens, self.window, self.eos_id, self.rows, self.k = tokens, window, eos_id, rows, num_sources

  def __call__(self, batch) -> dict[str, np.ndarray]:
    src, win = (np.asarray(x) for x in batch)
    toks = np.stack([self.tokens[int(s)].read(int(w) * self.window, self.window)
                     for s, w in zip(src[self.rows], win[self.rows])])
    return {"tokens": toks, "segment": pipeline.segment_ids(toks, self.eos_id),
            "source_counts": np.bincount(src, minlength=self.k)}


class MixtureIterator:
  """The mixed train batches ({'tokens', 'segment'}, as `pipeline.make_train_iterator`'s), with
  `take_shares()`; checkpointed through Grain's handler like a DatasetIterator."""

  def __init__(self, inner, names: list[str]):
    self._inner, self.names = inner, names
    self._counts = np.zeros(len(names), np.int64)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = dict(next(self._inner))
    self._counts += batch.pop("source_counts")
    return batch

  def take_shares(self) -> dict[str, float]:
    """{"data_share/NAME": fraction of the global rows since the last call} (empty before any)."""
    total = int(self._counts.sum())
    if total == 0:
      return {}
    out = {f"data_share/{n}": float(c) / total for n, c in zip(self.names, self._counts)}
    self._counts[:] = 0
    return out

  def get_state(self):
    return self._inner.get_state()

  def set_state(self, state) -> None:
    # Grain's checkpoint handler passes bytes to an iterator that is not its own DatasetIterator.
    self._inner.set_state(json.loads(state) if isinstance(state, (bytes, str)) else state)

  def start_prefetch(self) -> None:
    getattr(self._inner, "start_prefetch", lambda: None)()


def make_train_iterator(spec: str, seq_len: int, global_batch_size: int, seed: int, process_index: int = 0,
                        process_count: int = 1, verify: str = "size", read_threads: int = pipeline.READ_THREADS,
                        prefetch: int = pipeline.PREFETCH) -> MixtureIterator:
  """The mixture's infinite train iterator (module docstring); rows as in `pipeline`."""
  import grain

  sources = parse(spec)
  rows = pipeline._local_rows(global_batch_size, process_index, process_count, "global_batch_size")  # pylint: disable=protected-access
  if not 0 <= seed + SEED_STRIDE * len(sources) < 2**32:
    raise ConfigError(f"data seed={seed} must be in [0, 2**32 - {SEED_STRIDE * len(sources)})")
  readers, parts, weights, eos_id = [], [], [], None
  for i, s in enumerate(sources):
    manifest, tokens, n = pipeline._open_split(datadir.fetch(s.path), "train", seq_len, verify)  # pylint: disable=protected-access
    eos_id = manifest["eos_id"] if eos_id is None else eos_id
    readers.append(tokens)
    if s.weight == 0:
      continue
    if n == 0:
      raise DataError(f"mixture source {s.path} has {tokens.num_tokens} train tokens, less than one "
                      f"window of seq_len+1={seq_len + 1}; drop it or give it weight 0")
    parts.append(grain.MapDataset.range(n).shuffle(seed=seed + SEED_STRIDE * i).repeat()
                 .map(functools.partial(_tag, i)))
    weights.append(s.weight)
  ds = (grain.MapDataset.mix(parts, weights).batch(global_batch_size, drop_remainder=True)
        .map(_ReadMixRows(readers, seq_len + 1, eos_id, rows, len(sources))))
  inner = iter(ds.to_iter_dataset(pipeline.read_options(read_threads, prefetch)))
  return MixtureIterator(inner, [s.name for s in sources])


def make_eval_batches(spec: str, seq_len: int, batch_size: int, max_batches: int | None = None,
                      process_index: int = 0, process_count: int = 1) -> dict[str, tuple[float, object]]:
  """{name: (weight, `pipeline.make_eval_batches` over the source's val split)}."""
  return {s.name: (s.weight, pipeline.make_eval_batches(datadir.fetch(s.path), "val", seq_len, batch_size, max_batches,
                                                        process_index, process_count))
          for s in parse(spec)}


def mean_nll(per_source: dict[str, float], weights: dict[str, float]) -> float:
  """The weight-averaged NLL over the sources of positive weight."""
  total = sum(w for w in weights.values() if w > 0)
  return sum(per_source[n] * w for n, w in weights.items() if w > 0) / total


class TrainerData:
  """What the trainer reads from a mixture: its train iterator and per-source validation."""

  def __init__(self, config, process_index: int, process_count: int):
    d, t = config.data, config.train
    self.sources = parse(d.mixture)
    self.train_iter = make_train_iterator(d.mixture, d.seq_len, t.batch_size, config.seed, process_index,
                                          process_count, d.verify)
    self.evals = make_eval_batches(d.mixture, d.seq_len, t.batch_size // t.grad_accum, t.eval_batches,
                                   process_index, process_count)

  def evaluate(self, summed_nll, suffix: str = "") -> dict[str, float]:
    """{"eval_val_nll/NAME": NLL of each source's val split, "eval_val_nll": their weighted mean};
    `summed_nll(batches) -> (summed NLL, tokens)` is the trainer's evaluation loop."""
    per = {}
    for name, (_, batches) in self.evals.items():
      total, count = summed_nll(batches)
      per[name] = total / max(count, 1.0)
    out = {"eval_val_nll" + suffix: mean_nll(per, {n: w for n, (w, _) in self.evals.items()})}
    out.update({f"eval_val_nll{suffix}/{n}": v for n, v in per.items()})
    return out

  def record_fields(self, evals: dict[str, float]) -> dict:
    """result.json's bytes and bits per byte (as `bytes_per_token.record_fields` for one dir): the
    mixture's `val_bytes_per_token` (the sources' weighted mean over positive weights),
    `val_byte_counts` (the measured text's bytes, targets and tokens summed, and each source's
    under `sources`) and `eval_bits_per_byte` of every key of `evals` ("val", "val/NAME", with the
    trainer's suffix). {} when a source has no bytes (a task dir) or cannot be read."""
    counts = {}
    for s in self.sources:
      try:
        counts[s.name] = bytes_per_token.measure(datadir.fetch(s.path), "val")
      except (DataError, OSError, ValueError, KeyError):
        return {}
      if not counts[s.name] or not counts[s.name].get("bytes_per_token"):
        return {}
    weights = {s.name: s.weight for s in self.sources}
    bpt = mean_nll({n: c["bytes_per_token"] for n, c in counts.items()}, weights)  # the same weighting
    keys = ("bytes", "targets", "tokens_read")
    bits = {}
    for key, nats in evals.items():
      name = key.partition("/")[2]
      if isinstance(nats, (int, float)) and math.isfinite(nats) and (not name or name in counts):
        bits[key] = bytes_per_token.bits_per_byte(nats, counts[name]["bytes_per_token"] if name else bpt)
    sources = {n: {**{k: c[k] for k in keys}, "bytes_per_token": c["bytes_per_token"], "weight": weights[n]}
               for n, c in counts.items()}
    return {"val_bytes_per_token": bpt,
            "val_byte_counts": {**{k: sum(c[k] for c in counts.values()) for k in keys}, "sources": sources},
            "eval_bits_per_byte": bits}


def for_trainer(config, process_index: int = 0, process_count: int = 1) -> TrainerData | None:
  """The mixture of `config.data.mixture`, or None when it is empty (data.path alone)."""
  return TrainerData(config, process_index, process_count) if config.data.mixture else None
