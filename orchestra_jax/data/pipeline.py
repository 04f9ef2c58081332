"""The grain input pipeline over training JSONL files.

The files are small (thousands of records), so they are read into memory and served by a
`grain.MapDataset` over a Python list: no ArrayRecord, no worker processes. Records stay Python objects
(`Sample`, or their JSON dicts with `as_dict=True`); tokenisation happens later, in the rollout.

`make_dataset` chains: source -> shuffle (seeded; a different order every epoch) -> repeat (`num_epochs`,
None = forever) -> shard (`shard_index::shard_count`, e.g. one shard per host) -> batch (a list of records;
`batch_size=None` yields single records). Batches may span an epoch boundary unless `num_epochs=1`.

`make_iterator(ds)` gives a `grain.DatasetIterator` whose `get_state()` is a small JSON-able dict and whose
`set_state(state)` resumes exactly where the state was taken (the dataset must be rebuilt with the same
arguments). `save_iterator_state` / `load_iterator_state` store that state as a JSON file next to a checkpoint.
Everything is deterministic given the seed: no threads or processes read ahead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grain

from orchestra_jax.data.format import DataFormatError, Sample, read_samples

__all__ = ["load_records", "make_dataset", "make_iterator", "save_iterator_state", "load_iterator_state"]


def load_records(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Sample]:
  """Every record of one or more JSONL files (validated; ids unique across files)."""
  return read_samples(paths)


def make_dataset(data: str | os.PathLike | Iterable[str | os.PathLike] | Sequence[Sample], *, seed: int = 0,
                 shuffle: bool = True, num_epochs: int | None = 1, batch_size: int | None = None,
                 drop_remainder: bool = False, shard_index: int = 0, shard_count: int = 1,
                 as_dict: bool = False) -> grain.MapDataset:
  """A `grain.MapDataset` of records (or of lists of `batch_size` records) from JSONL path(s) or samples.

  Records are shared between epochs: treat them as read-only (use `as_dict=True` for fresh dicts)."""
  if isinstance(data, (str, os.PathLike)):
    samples = load_records(data)
  else:
    data = list(data)
    if data and all(isinstance(s, Sample) for s in data):
      samples = data
    elif all(isinstance(p, (str, os.PathLike)) for p in data):
      samples = load_records(data)
    else:
      raise TypeError("make_dataset takes JSONL path(s) or a sequence of Sample")
  if not samples:
    raise DataFormatError("make_dataset: no records")
  if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
    raise ValueError(f"num_epochs must be a positive integer or None (forever), got {num_epochs!r}")
  if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
    raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
  if not (isinstance(shard_count, int) and shard_count >= 1 and 0 <= shard_index < shard_count):
    raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index} of {shard_count}")
  ds = grain.MapDataset.source(samples)
  if shuffle:
    ds = ds.shuffle(seed=int(seed))
  if num_epochs != 1:
    ds = ds.repeat(num_epochs)  # reseeds the shuffle every epoch
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  if as_dict:
    ds = ds.map(Sample.to_json)
  if batch_size is not None:
    ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
  return ds


def make_iterator(ds: grain.MapDataset | grain.IterDataset) -> grain.DatasetIterator:
  """A checkpointable iterator (`get_state` / `set_state`), read on the calling thread (no read-ahead)."""
  if isinstance(ds, grain.MapDataset):
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  return iter(ds)


def save_iterator_state(iterator: grain.DatasetIterator, path: str | os.PathLike) -> Path:
  """Write `iterator.get_state()` as JSON (atomically)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(iterator.get_state(), sort_keys=True) + "\n", encoding="utf-8")
  os.replace(tmp, path)
  return path


def load_iterator_state(iterator: grain.DatasetIterator, path: str | os.PathLike) -> dict[str, Any]:
  """Restore an iterator from a state file written by `save_iterator_state`; returns the state."""
  path = Path(path)
  try:
    state = json.loads(path.read_text(encoding="utf-8"))
  except FileNotFoundError:
    raise DataFormatError(f"iterator state file not found: {path}") from None
  except json.JSONDecodeError as e:
    raise DataFormatError(f"{path}: iterator state is not valid JSON ({e.msg})") from None
  iterator.set_state(state)
  return state
