"""`Batch`: the unit of data that moves between the controller and the workers.

A Batch is a table of ``len(batch)`` rows:

- **tensor columns** live in one ``tensordict.TensorDict`` whose leading (batch) dimension is the row
  dimension, e.g. ``input_ids [batch, seq_len]`` or ``scores [batch]``;
- **non-tensor columns** (prompt strings, uids, ground truths, data sources) are numpy object arrays of
  length ``len(batch)``, so they follow their rows through every reordering;
- ``meta`` is a free dict for everything that is not per row (temperatures, step numbers, metrics).

Every operation returns a new Batch; none changes its input. Tensors are shared, not copied, wherever
the operation allows it (select, union, slicing with a step).

Moving a Batch through Ray: ``__reduce__`` hands tensors over as numpy arrays, which Ray's serialiser
ships out-of-band (zero-copy from the object store). The receiving side wraps them back with
``torch.from_numpy`` without a copy. ``docs/benchmarks.md`` reports the cost against raw ``ray.put``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["Batch", "BatchConflictError"]

# dtypes numpy cannot hold are shipped as same-width integer views and viewed back on arrival.
_NUMPY_UNSUPPORTED_VIEWS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


class BatchConflictError(ValueError):
    """Raised when a union would overwrite columns that differ between the two batches."""


def _as_object_array(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def _values_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a is b:
        return True
    if len(a) != len(b):
        return False
    return all(_object_equal(x, y) for x, y in zip(a, b, strict=True))


def _object_equal(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return bool(np.array_equal(x, y))
    return bool(x == y)


def _tensor_to_wire(tensor: torch.Tensor) -> tuple[np.ndarray, torch.dtype, tuple[int, ...]]:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    view_dtype = _NUMPY_UNSUPPORTED_VIEWS.get(tensor.dtype)
    shipped = tensor.view(view_dtype) if view_dtype is not None else tensor
    return shipped.numpy(), tensor.dtype, tuple(tensor.shape)


def _tensor_from_wire(array: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not array.flags.writeable:
        # Ray hands out read-only views of its object store. Tensors built on them would warn on
        # every in-place op and silently corrupt shared memory if written, so take ownership here.
        array = array.copy()
    tensor = torch.from_numpy(array)
    if tensor.dtype != dtype:
        tensor = tensor.view(dtype)
    return tensor.reshape(shape)


def _rebuild_batch(
    wire_tensors: dict[str, tuple[np.ndarray, torch.dtype, tuple[int, ...]]],
    non_tensors: dict[str, np.ndarray],
    meta: dict[str, Any],
    num_rows: int,
) -> Batch:
    tensors = {key: _tensor_from_wire(*value) for key, value in wire_tensors.items()}
    return Batch(TensorDict(tensors, batch_size=[num_rows]), non_tensors, meta)


class Batch:
    """A table of rows with tensor columns, non-tensor columns and free-form ``meta``.

    Args:
        tensors: a ``TensorDict`` with ``batch_size=[num_rows]`` (or a dict of tensors that share
            their first dimension).
        non_tensors: columns of per-row Python objects; each of length ``num_rows``.
        meta: values that are not per row.
    """

    def __init__(
        self,
        tensors: TensorDict | Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        non_tensors = {key: _as_object_array(value) for key, value in (non_tensors or {}).items()}
        if tensors is None or (not isinstance(tensors, TensorDict) and len(tensors) == 0):
            num_rows = len(next(iter(non_tensors.values()))) if non_tensors else 0
            tensors = TensorDict({}, batch_size=[num_rows])
        elif not isinstance(tensors, TensorDict):
            sizes = {key: value.shape[0] if value.dim() > 0 else None for key, value in tensors.items()}
            first = next(iter(sizes.values()))
            bad = {key: size for key, size in sizes.items() if size != first}
            if bad or first is None:
                raise ValueError(f"tensor columns must share their first dimension; got sizes {sizes}")
            tensors = TensorDict(dict(tensors), batch_size=[first])
        if len(tensors.batch_size) != 1:
            raise ValueError(f"tensors must have a 1-d batch size, got {tuple(tensors.batch_size)}")
        num_rows = tensors.batch_size[0]
        for key, values in non_tensors.items():
            if len(values) != num_rows:
                raise ValueError(
                    f"non-tensor column {key!r} has {len(values)} rows, the tensor columns have {num_rows}"
                )
            if key in tensors.keys():
                raise ValueError(f"column {key!r} is both a tensor and a non-tensor column")
        self.tensors: TensorDict = tensors
        self.non_tensors: dict[str, np.ndarray] = non_tensors
        self.meta: dict[str, Any] = dict(meta or {})

    # ------------------------------------------------------------------ inspection

    def __len__(self) -> int:
        return int(self.tensors.batch_size[0])

    def keys(self) -> list[str]:
        """All column names: tensor columns first, then non-tensor columns."""
        return [*self.tensors.keys(), *self.non_tensors.keys()]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors.keys() or key in self.non_tensors

    def __getitem__(self, item: str | int | slice | Sequence[int] | torch.Tensor) -> Any:
        """``batch["col"]`` returns a column; an int, slice or index sequence returns a Batch of rows."""
        if isinstance(item, str):
            if item in self.non_tensors:
                return self.non_tensors[item]
            if item in self.tensors.keys():
                return self.tensors[item]
            raise KeyError(f"no column {item!r}; columns are {self.keys()}")
        if isinstance(item, int):
            item = slice(item, item + 1) if item != -1 else slice(item, None)
        if isinstance(item, slice):
            return Batch(
                self.tensors[item], {k: v[item] for k, v in self.non_tensors.items()}, self.meta
            )
        return self.reorder(item)

    def __repr__(self) -> str:
        tensor_cols = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.tensors.items())
        other_cols = ", ".join(self.non_tensors)
        return f"Batch(rows={len(self)}, tensors=[{tensor_cols}], non_tensors=[{other_cols}], meta={list(self.meta)})"

    def equals(self, other: Batch) -> bool:
        """True when both batches hold the same columns with equal values, and equal meta."""
        if set(self.tensors.keys()) != set(other.tensors.keys()) or set(self.non_tensors) != set(
            other.non_tensors
        ):
            return False
        if len(self) != len(other):
            return False
        for key, value in self.tensors.items():
            if value.dtype != other.tensors[key].dtype or not torch.equal(value, other.tensors[key]):
                return False
        if not all(_values_equal(v, other.non_tensors[k]) for k, v in self.non_tensors.items()):
            return False
        return self.meta.keys() == other.meta.keys() and all(
            _object_equal(v, other.meta[k]) for k, v in self.meta.items()
        )

    # ------------------------------------------------------------------ columns

    def select(self, *keys: str, meta: bool = True) -> Batch:
        """A Batch with only the named columns (sharing their storage)."""
        missing = [key for key in keys if key not in self]
        if missing:
            raise KeyError(f"cannot select missing columns {missing}; columns are {self.keys()}")
        tensor_keys = [key for key in keys if key in self.tensors.keys()]
        return Batch(
            self.tensors.select(*tensor_keys),
            {key: self.non_tensors[key] for key in keys if key in self.non_tensors},
            self.meta if meta else None,
        )

    def pop(self, *keys: str) -> Batch:
        """Remove the named columns from this Batch and return them as a new Batch."""
        taken = self.select(*keys, meta=False)
        for key in keys:
            if key in self.non_tensors:
                del self.non_tensors[key]
            else:
                del self.tensors[key]
        return taken

    def __or__(self, other: Batch) -> Batch:
        """Union of columns. A column or meta key present in both must hold equal values."""
        if not isinstance(other, Batch):
            return NotImplemented
        if len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        conflicts = []
        for key in set(self.tensors.keys()) & set(other.tensors.keys()):
            mine, theirs = self.tensors[key], other.tensors[key]
            if mine is not theirs and (
                mine.shape != theirs.shape or mine.dtype != theirs.dtype or not torch.equal(mine, theirs)
            ):
                conflicts.append(key)
        for key in set(self.non_tensors) & set(other.non_tensors):
            if not _values_equal(self.non_tensors[key], other.non_tensors[key]):
                conflicts.append(key)
        for key in set(self.tensors.keys()) & set(other.non_tensors):
            conflicts.append(key)
        for key in set(self.non_tensors) & set(other.tensors.keys()):
            conflicts.append(key)
        for key in set(self.meta) & set(other.meta):
            if not _object_equal(self.meta[key], other.meta[key]):
                conflicts.append(f"meta.{key}")
        if conflicts:
            raise BatchConflictError(
                f"union would overwrite differing columns {sorted(conflicts)}; pop or rename them first"
            )
        tensors = self.tensors.clone(recurse=False)
        tensors.update(other.tensors)
        return Batch(tensors, {**self.non_tensors, **other.non_tensors}, {**self.meta, **other.meta})

    # ------------------------------------------------------------------ rows

    def reorder(self, index: Sequence[int] | torch.Tensor | np.ndarray) -> Batch:
        """Rows in the order given by ``index`` (a permutation, a subset, or with repeats)."""
        index_t = torch.as_tensor(np.asarray(index), dtype=torch.long)
        if index_t.dim() != 1:
            raise ValueError(f"index must be 1-d, got shape {tuple(index_t.shape)}")
        if len(index_t) and (index_t.min() < -len(self) or index_t.max() >= len(self)):
            raise IndexError(f"row index out of range for a batch of {len(self)} rows")
        index_np = index_t.numpy()
        return Batch(
            self.tensors[index_t], {k: v[index_np] for k, v in self.non_tensors.items()}, self.meta
        )

    def repeat(self, n: int) -> Batch:
        """Each row repeated ``n`` times in place (interleaved): rows a, b -> a, a, b, b for n=2.

        This is the layout of n samples per prompt: the samples of prompt i sit at rows
        ``i*n .. i*n+n-1``.
        """
        if n < 1:
            raise ValueError(f"repeat count must be >= 1, got {n}")
        return self.reorder(torch.arange(len(self)).repeat_interleave(n))

    def pad_to_multiple(self, multiple: int) -> tuple[Batch, int]:
        """Append copies of the first rows until the length divides by ``multiple``.

        Returns the padded batch and the number of rows added; ``unpad`` with that number undoes it.
        """
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        if len(self) == 0:
            raise ValueError("cannot pad an empty batch")
        pad = (-len(self)) % multiple
        if pad == 0:
            return self, 0
        index = torch.cat([torch.arange(len(self)), torch.arange(pad) % len(self)])
        return self.reorder(index), pad

    def unpad(self, pad: int) -> Batch:
        """Drop the last ``pad`` rows (the inverse of ``pad_to_multiple``)."""
        return self if pad == 0 else self[: len(self) - pad]

    def split(self, chunks: int) -> list[Batch]:
        """Split into ``chunks`` pieces of equal size; the length must divide (pad first)."""
        if chunks < 1 or len(self) % chunks != 0:
            raise ValueError(
                f"cannot split {len(self)} rows into {chunks} equal chunks; use pad_to_multiple({chunks}) first"
            )
        size = len(self) // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    def chunk(self, size: int) -> list[Batch]:
        """Consecutive pieces of at most ``size`` rows (the last may be shorter)."""
        if size < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        return [self[start : start + size] for start in range(0, len(self), size)]

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all batches, in order. Columns must match; meta is taken from the first batch."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        first = batches[0]
        for i, batch in enumerate(batches[1:], start=1):
            if set(batch.keys()) != set(first.keys()):
                raise ValueError(
                    f"batch {i} has columns {sorted(batch.keys())}, batch 0 has {sorted(first.keys())}"
                )
        tensors = torch.cat([batch.tensors for batch in batches], dim=0)
        non_tensors = {
            key: np.concatenate([batch.non_tensors[key] for batch in batches]) for key in first.non_tensors
        }
        return Batch(tensors, non_tensors, first.meta)

    def iter_minibatches(
        self, size: int, shuffle: bool = False, generator: torch.Generator | None = None, drop_last: bool = False
    ) -> Iterator[Batch]:
        """Yield mini-batches of ``size`` rows, optionally in a random order from ``generator``."""
        if size < 1:
            raise ValueError(f"mini-batch size must be >= 1, got {size}")
        order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
        stop = len(self) - len(self) % size if drop_last else len(self)
        for start in range(0, stop, size):
            yield self.reorder(order[start : start + size])

    def num_chunks(self, size: int) -> int:
        """How many mini-batches of ``size`` rows ``iter_minibatches`` yields (without drop_last)."""
        return math.ceil(len(self) / size)

    # ------------------------------------------------------------------ movement

    def to(self, device: torch.device | str) -> Batch:
        """The same Batch with tensor columns on ``device``."""
        return Batch(self.tensors.to(device), self.non_tensors, self.meta)

    def nbytes(self) -> int:
        """Bytes held by the tensor columns."""
        return sum(value.numel() * value.element_size() for value in self.tensors.values())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        wire = {key: _tensor_to_wire(value) for key, value in self.tensors.items()}
        return _rebuild_batch, (wire, self.non_tensors, self.meta, len(self))
