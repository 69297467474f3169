"""``PackedDataset``: variable-length token samples packed into rows of exactly ``max_tokens``
tokens for varlen (flash) attention, with the fields transformers' ``DataCollatorWithFlattening``
gives a flattened batch, plus padding to a fixed shape.

Packing is first-fit decreasing (FFD) over a buffer of samples: a map-style dataset is planned
once, over all its samples by default; an iterable one over a shuffle buffer of ``buffer_size``
samples, where the samples of bins left under 98% full go back to the buffer (at most half of
it) to be packed with the next samples, so padding stays low without holding the whole stream.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

#: Label of a token that is not predicted: each sample's first token and the padding.
IGNORE_INDEX = -100

#: A bin filled below this fraction of max_tokens is repacked with the next buffer's samples.
_CARRY_BELOW = 0.98

_LONG_SAMPLES = ("error", "split")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of indices into ``lengths`` (each total <= ``capacity``): items by decreasing length
    (ties by index), each into the first bin with room. O(n log n) with a max-tree over the
    bins' free space. Every length must be in [1, capacity]."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    size = 1
    while size < max(len(lengths), 1):
        size *= 2
    free = [capacity] * (2 * size)  # free[size + b]: room left in bin b; inner nodes: max
    bins: list[list[int]] = []
    for i in order:
        need = lengths[i]
        node = 1
        while node < size:
            node = 2 * node if free[2 * node] >= need else 2 * node + 1
        b = node - size
        if b == len(bins):
            bins.append([])
        bins[b].append(i)
        free[node] -= need
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return bins


def plan_bins(
    pieces: Iterable[tuple[int, object]], capacity: int, buffer_size: int, rng: random.Random
) -> Iterator[list[object]]:
    """Bins (lists of payloads) from ``(length, payload)`` pieces: FFD over each buffer of
    ``buffer_size`` pieces (shuffled with ``rng`` first), the pieces of under-filled bins carried
    into the next buffer (at most half of it), the bins of a buffer yielded in ``rng`` order."""
    buffer: list[tuple[int, object]] = []

    def flush(final: bool) -> list[list[object]]:
        rng.shuffle(buffer)
        bins = first_fit_decreasing([length for length, _ in buffer], capacity)
        fills = [sum(buffer[i][0] for i in b) for b in bins]
        carried: set[int] = set()
        if not final:
            budget = buffer_size // 2
            for b in sorted(range(len(bins)), key=lambda b: fills[b]):
                if fills[b] >= _CARRY_BELOW * capacity or len(bins[b]) > budget:
                    break
                carried.add(b)
                budget -= len(bins[b])
        out = [[buffer[i][1] for i in bins[b]] for b in range(len(bins)) if b not in carried]
        rest = [buffer[i] for b in sorted(carried) for i in bins[b]]
        buffer[:] = rest
        rng.shuffle(out)
        return out

    for piece in pieces:
        buffer.append(piece)
        if len(buffer) >= buffer_size:
            yield from flush(final=False)
    if buffer:
        yield from flush(final=True)


class PackedDataset(Dataset):
    """Packs of exactly ``max_tokens`` tokens from samples ``{"input_ids": ..., "labels": ...}``.

    dataset: map-style (``__getitem__`` + ``__len__``) or iterable (an ``IterableDataset`` or any
    iterable) of mappings whose ``input_ids`` is a 1-D int sequence/tensor and optional ``labels``
    one of the same length. The result is map-style or iterable like ``dataset`` (so a
    ``DataLoader`` with several workers does not repeat samples: map-style through the sampler,
    iterable by sharding sample ``i`` to worker ``i % num_workers`` when ``shard=True``; set
    ``shard=False`` when ``dataset`` shards by worker itself).

    Each pack is a dict of
      ``input_ids``    int64 (max_tokens,): the samples one after the other, then ``pad_id``;
      ``position_ids`` int64 (max_tokens,): 0, 1, ... restarting at each sample (and the padding);
      ``labels``       int64 (max_tokens,): each sample's labels (its input_ids without labels)
                       with the first one -100, as ``DataCollatorWithFlattening`` does (the model
                       shifts labels, so no token predicts across a boundary); -100 on padding;
      ``cu_seq_lens``  int32 (n + 1,): sample boundaries 0, l1, l1 + l2, ..., ending at
                       max_tokens (the padding, if any, is the last segment);
      ``max_length``   int: the longest segment (flash attention's max_seqlen).
    ``collate_packs`` batches packs into one flattened row, or use ``batch_size=None``.

    Samples longer than ``max_tokens``: ``long_samples="error"`` (default) raises ValueError
    naming the sample; ``"split"`` cuts it into pieces of at most ``max_tokens`` tokens, each
    packed as its own sequence (the first label of each piece becomes -100). Empty samples are
    skipped, as ``DataCollatorWithFlattening`` does. Every other sample appears exactly once,
    intact and contiguous. The packing (which samples share a pack, pack order) is deterministic
    for a ``seed``. buffer_size: samples per FFD round (iterable; default 2048) or per planning
    chunk (map-style; default all samples). lengths: optional list of sample lengths of a
    map-style dataset (otherwise read once from every sample at construction).
    """

    def __new__(cls, dataset, *args, **kwargs):
        if cls is PackedDataset:
            cls = _IterablePackedDataset if _is_iterable(dataset) else _MapPackedDataset
        return super().__new__(cls)

    def __init__(
        self,
        dataset,
        max_tokens: int,
        pad_id: int = 0,
        *,
        long_samples: str = "error",
        buffer_size: int | None = None,
        seed: int = 0,
        shard: bool = True,
    ):
        self.dataset = dataset
        self.max_tokens = _check_int("max_tokens", max_tokens, 1)
        self.pad_id = _check_int("pad_id", pad_id, -(2**63))
        if long_samples not in _LONG_SAMPLES:
            raise ValueError(f"long_samples must be one of {_LONG_SAMPLES}, got {long_samples!r}")
        self.long_samples = long_samples
        if buffer_size is not None:
            _check_int("buffer_size", buffer_size, 1)
        self.buffer_size = buffer_size
        self.seed = _check_int("seed", seed, -(2**63))
        self.shard = bool(shard)

    # ------------------------------------------------------------ pieces
    def _spans(self, index: int, length: int) -> list[tuple[int, int]]:
        """(start, stop) token ranges sample ``index`` is packed as."""
        if length <= self.max_tokens:
            return [(0, length)] if length else []
        if self.long_samples == "error":
            raise ValueError(
                f"sample {index} has {length} tokens, more than max_tokens={self.max_tokens} "
                "(pass long_samples='split' to cut it into pieces)"
            )
        return [(s, min(s + self.max_tokens, length)) for s in range(0, length, self.max_tokens)]

    def _pack(self, segments: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """One pack from (input_ids, labels) segments, labels already -100 at each start."""
        pad = self.max_tokens - sum(len(ids) for ids, _ in segments)
        lengths = [len(ids) for ids, _ in segments] + ([pad] if pad else [])
        input_ids = torch.full((self.max_tokens,), self.pad_id, dtype=torch.int64)
        labels = torch.full((self.max_tokens,), IGNORE_INDEX, dtype=torch.int64)
        position_ids = torch.empty(self.max_tokens, dtype=torch.int64)
        start = 0
        for (ids, lab), length in zip(segments, lengths):
            input_ids[start : start + length] = ids
            labels[start : start + length] = lab
            start += length
        start = 0
        for length in lengths:
            position_ids[start : start + length] = torch.arange(length)
            start += length
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
        return {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "labels": labels,
            "cu_seq_lens": cu,
            "max_length": max(lengths),
        }


def _is_iterable(dataset) -> bool:
    if isinstance(dataset, IterableDataset):
        return True
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return False
    if hasattr(dataset, "__iter__"):
        return True
    raise TypeError(
        f"dataset must be map-style (__getitem__ and __len__) or iterable, "
        f"got {type(dataset).__name__}"
    )


def _tokens(index: int, sample) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) of a sample as 1-D int64 tensors (labels default to input_ids)."""
    try:
        ids = sample["input_ids"]
    except (KeyError, TypeError, IndexError) as error:
        raise ValueError(f"sample {index} has no 'input_ids'") from error
    ids = torch.as_tensor(ids, dtype=torch.int64)
    labels = sample.get("labels") if hasattr(sample, "get") else None
    labels = ids if labels is None else torch.as_tensor(labels, dtype=torch.int64)
    if ids.dim() != 1 or labels.shape != ids.shape:
        raise ValueError(
            f"sample {index}: input_ids must be 1-D and labels the same shape, got "
            f"{tuple(ids.shape)} and {tuple(labels.shape)}"
        )
    return ids, labels


def _segment(ids: torch.Tensor, labels: torch.Tensor, start: int, stop: int):
    """Tokens [start, stop) of a sample, the first label set to -100."""
    lab = labels[start:stop].clone()
    lab[0] = IGNORE_INDEX
    return ids[start:stop], lab


class _MapPackedDataset(PackedDataset):
    """Map-style packs: the plan (which sample spans go in pack k) is made at construction."""

    def __init__(self, dataset, max_tokens: int, pad_id: int = 0, *, lengths=None, **kwargs):
        super().__init__(dataset, max_tokens, pad_id, **kwargs)
        if lengths is None:
            lengths = [len(_tokens(i, dataset[i])[0]) for i in range(len(dataset))]
        elif len(lengths) != len(dataset):
            raise ValueError(f"lengths has {len(lengths)} entries for {len(dataset)} samples")
        rng = random.Random(f"fusedops-pack-{self.seed}")
        order = list(range(len(dataset)))
        rng.shuffle(order)
        pieces = [
            (stop - start, (i, start, stop))
            for i in order
            for start, stop in self._spans(i, lengths[i])
        ]
        size = self.buffer_size or max(len(pieces), 1)
        self._bins = list(plan_bins(pieces, self.max_tokens, size, rng))

    def __len__(self) -> int:
        return len(self._bins)

    def __getitem__(self, k: int) -> dict:
        if not -len(self._bins) <= k < len(self._bins):
            raise IndexError(f"pack {k} out of range ({len(self._bins)} packs)")
        segments = []
        for i, start, stop in self._bins[k]:
            ids, labels = _tokens(i, self.dataset[i])
            if stop > len(ids):
                raise ValueError(f"sample {i} is shorter than its planned length {stop}")
            segments.append(_segment(ids, labels, start, stop))
        return self._pack(segments)


class _IterablePackedDataset(PackedDataset, IterableDataset):
    """Iterable packs: FFD over a shuffle buffer, this worker's shard of the samples."""

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info() if self.shard else None
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rng = random.Random(f"fusedops-pack-{self.seed}-{worker}")

        def pieces():
            for i, sample in enumerate(self.dataset):
                if i % workers != worker:
                    continue
                ids, labels = _tokens(i, sample)
                for start, stop in self._spans(i, len(ids)):
                    yield stop - start, _segment(ids, labels, start, stop)

        for segments in plan_bins(pieces(), self.max_tokens, self.buffer_size or 2048, rng):
            yield self._pack(segments)


def collate_packs(packs: list[dict]) -> dict:
    """A batch of packs as one flattened row, the layout of ``DataCollatorWithFlattening``:
    ``input_ids``/``position_ids``/``labels`` int64 (1, B * max_tokens), ``cu_seq_lens`` int32
    (the packs' boundaries offset and joined), ``max_length`` int."""
    if not packs:
        raise ValueError("packs must not be empty")
    out = {
        key: torch.cat([p[key] for p in packs])[None]
        for key in ("input_ids", "position_ids", "labels")
    }
    offsets, cus = 0, [torch.zeros(1, dtype=torch.int32)]
    for p in packs:
        cus.append(p["cu_seq_lens"][1:] + offsets)
        offsets += len(p["input_ids"])
    out["cu_seq_lens"] = torch.cat(cus)
    out["max_length"] = max(int(p["max_length"]) for p in packs)
    return out
