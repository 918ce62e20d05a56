"""What a store writer remembers per key for the position guard, in a few bytes per key.

:class:`PositionIndex` holds, per key of one collection, the key's position, its entry's applied
count, whether it holds an entry or a tombstone, and where its latest record is (partition and
offset, for a materializer's reads): numpy columns indexed by a *slot* per key, the keys
themselves in Arrow arrays, and a sorted array of 64-bit key hashes with the slot of each, so a
batch's keys are found with one ``searchsorted`` and checked against the stored keys (a hash
collision costs a short scan, never a wrong answer). About 50 bytes plus the key's length per
key; no Python object per key.
"""

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

GONE, ENTRY, TOMB = 0, 1, 2
"""A slot's state: no entry and no position (as if never written), an entry, a tombstone."""

NONE = np.iinfo(np.int64).min

_MULT = 0x100000001B3  # the FNV prime: odd, so invertible modulo 2**64
_INVERSE = pow(_MULT, -1, 1 << 64)
_CHUNK_BYTES = 1 << 18  # key bytes hashed per pass (bounds the temporaries)
_MAX_CHUNKS = 32  # key chunks kept apart before they are combined


def _powers(base: int, count: int) -> np.ndarray:
    """``base ** i`` modulo 2**64 for i < count."""
    out = np.empty(count, dtype=np.uint64)
    out[0] = 1
    step, filled = np.uint64(base), 1
    with np.errstate(over="ignore"):
        while filled < count:  # doubling: out[f:2f] = out[0:f] * base**f
            take = min(filled, count - filled)
            out[filled : filled + take] = out[:take] * step
            filled += take
            step = step * step
    return out


class _Powers:
    """Powers of the hash's multiplier and of its inverse, grown on demand."""

    def __init__(self) -> None:
        self.up = _powers(_MULT, _CHUNK_BYTES + 1)
        self.down = _powers(_INVERSE, _CHUNK_BYTES + 1)

    def ensure(self, count: int) -> None:
        if count > len(self.up):
            self.up = _powers(_MULT, count)
            self.down = _powers(_INVERSE, count)


_POWERS = _Powers()


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit reaches every output bit."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(30))
        h = h * np.uint64(0xBF58476D1CE4E5B9)
        h = h ^ (h >> np.uint64(27))
        h = h * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = h ^ (h >> np.uint64(31))
        return out


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each key's UTF-8 bytes, computed over the Arrow buffers in bulk.

    The polynomial ``sum((b_j + 1) * M**j)`` modulo 2**64 of each key: every byte is weighted
    by the power of its place in the buffer, the sums are taken per key and brought back to the
    key's own start by the inverse power (M is odd, so it has one), then mixed with the length.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    keys = keys.cast(pa.large_binary())
    n = len(keys)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + n + 1]
    data = np.frombuffer(keys.buffers()[2] or b"\0", dtype=np.uint8)
    first = 0
    while first < n:
        last = int(np.searchsorted(offsets, offsets[first] + _CHUNK_BYTES, side="right")) - 1
        last = min(max(last, first + 1), n)
        start = int(offsets[first])
        size = int(offsets[last]) - start
        _POWERS.ensure(size + 1)
        relative = offsets[first : last + 1] - start
        lengths = np.diff(relative)
        sums = np.zeros(last - first, dtype=np.uint64)
        filled = lengths > 0
        with np.errstate(over="ignore"):
            if size:
                weighted = data[start : start + size].astype(np.uint64) + np.uint64(1)
                weighted *= _POWERS.up[:size]
                sums[filled] = np.add.reduceat(weighted, relative[:-1][filled])
            sums *= _POWERS.down[relative[:-1]]
        out[first:last] = _mix(sums ^ lengths.astype(np.uint64))
        first = last
    return out


_MASK = (1 << 64) - 1


def key_hash(key: str) -> int:
    """:func:`key_hashes` of one key, in plain Python (cheaper for one key than Arrow calls)."""
    data = key.encode()
    h, power = 0, 1
    for byte in data:
        h = (h + (byte + 1) * power) & _MASK
        power = (power * _MULT) & _MASK
    h ^= len(data)
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


def _grow(array: np.ndarray, size: int) -> np.ndarray:
    if size <= len(array):
        return array
    grown = np.empty(max(size, len(array) * 3 // 2, 256), dtype=array.dtype)
    grown[: len(array)] = array
    return grown


class PositionIndex:
    """Per key of one collection: position, applied count, state (:data:`ENTRY`,
    :data:`TOMB`, :data:`GONE`), and the partition and offset of its latest record."""

    def __init__(self) -> None:
        self._keys: list[pa.Array] = []  # the keys in slot order, in chunks
        self._hashes = np.empty(0, dtype=np.uint64)  # sorted
        self._slots = np.empty(0, dtype=np.int64)  # the slot of each sorted hash
        self.size = 0  # slots in use
        self.position = np.empty(0, dtype=np.int64)
        self.applied = np.empty(0, dtype=np.int64)
        self.state = np.empty(0, dtype=np.int8)
        self.partition = np.empty(0, dtype=np.int32)
        self.offset = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        """Keys that hold an entry or a tombstone."""
        return int(np.count_nonzero(self.state[: self.size] != GONE))

    @property
    def nbytes(self) -> int:
        """Bytes the index holds (its arrays and keys)."""
        arrays = (self._hashes, self._slots, self.position, self.applied, self.state)
        keys = sum(int(chunk.nbytes) for chunk in self._keys)
        return sum(a.nbytes for a in arrays) + self.partition.nbytes + self.offset.nbytes + keys

    def keys(self) -> pa.Array:
        """The keys in slot order (combined into one array)."""
        if len(self._keys) != 1:
            combined = pa.chunked_array(self._keys, pa.large_string()).combine_chunks()
            self._keys = [combined]
        return self._keys[0]

    def key(self, slot: int) -> str:
        return str(self.keys()[slot].as_py())

    def find(self, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The slot of each key (-1: not in the index)."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        keys = keys.cast(pa.large_string())
        n = len(keys)
        out = np.full(n, -1, dtype=np.int64)
        if n == 0 or not len(self._hashes):
            return out
        hashes = key_hashes(keys)
        order = np.argsort(hashes)  # sorted needles: the searches walk memory in order
        at = np.empty(n, dtype=np.int64)
        at[order] = np.searchsorted(self._hashes, hashes[order])
        clipped = np.minimum(at, len(self._hashes) - 1)
        hit = np.flatnonzero(self._hashes[clipped] == hashes)
        if not len(hit):
            return out
        candidates = self._slots[clipped[hit]]
        stored = self.keys().take(pa.array(candidates, pa.int64()))
        same = np.asarray(
            pc.equal(stored, keys.take(pa.array(hit, pa.int64()))).to_numpy(zero_copy_only=False),
            dtype=bool,
        )
        out[hit[same]] = candidates[same]
        for row in hit[~same].tolist():  # a hash collision: look along the run of equal hashes
            wanted = keys[row].as_py()
            i = int(at[row])
            while i < len(self._hashes) and self._hashes[i] == hashes[row]:
                if self.key(int(self._slots[i])) == wanted:
                    out[row] = self._slots[i]
                    break
                i += 1
        return out

    def find_one(self, key: str) -> int:
        """The slot of one key (-1: not in the index)."""
        if not len(self._hashes):
            return -1
        h = np.uint64(key_hash(key))
        i = int(self._hashes.searchsorted(h))
        while i < len(self._hashes) and self._hashes[i] == h:
            slot = int(self._slots[i])
            if self.key(slot) == key:
                return slot
            i += 1
        return -1

    def set(
        self,
        keys: pa.Array | pa.ChunkedArray,
        slots: np.ndarray,
        position: np.ndarray,
        applied: np.ndarray,
        state: np.ndarray,
        partition: np.ndarray,
        offset: np.ndarray,
    ) -> np.ndarray:
        """Set the columns of ``keys`` (distinct; ``slots`` from :meth:`find`, -1 for a key
        not in the index yet, which gets a new slot); the slot of each key."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        slots = np.array(slots, dtype=np.int64)
        new = np.flatnonzero(slots < 0)
        if len(new):
            first = self.size
            slots[new] = np.arange(first, first + len(new))
            self.size += len(new)
            for name in ("position", "applied", "state", "partition", "offset"):
                setattr(self, name, _grow(getattr(self, name), self.size))
            added = keys.take(pa.array(new, pa.int64())).cast(pa.large_string())
            self._keys.append(added)
            if len(self._keys) > _MAX_CHUNKS:
                self.keys()
            hashes = key_hashes(added)
            order = np.argsort(hashes, kind="stable")
            hashes, fresh = hashes[order], slots[new][order]
            at = np.searchsorted(self._hashes, hashes)
            self._hashes = np.insert(self._hashes, at, hashes)
            self._slots = np.insert(self._slots, at, fresh)
        self.position[slots] = position
        self.applied[slots] = applied
        self.state[slots] = state
        self.partition[slots] = partition
        self.offset[slots] = offset
        return slots
