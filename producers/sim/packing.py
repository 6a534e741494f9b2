"""Columnar msgpack: encode many same-shaped messages at once with numpy.

A message is a fixed sequence of segments: constant bytes, per-row static bytes (a host
name, a communicator id), and dynamic float64 / unsigned-int columns. ``RowPacker`` lays them
out in a byte matrix (one row per message, one slot per segment), fills the dynamic slots
for a whole tick in a few numpy operations, and squeezes out the padding of variable-length
slots with one boolean mask. The bytes equal ``msgpack.packb`` of the same wire dict
(floats as float64, ints in their shortest form) — tests check that against schemas.codec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

_INT_LEN = np.array([1, 2, 3, 5, 9], dtype=np.int64)
_INT_MARK = np.array([0, 0xCC, 0xCD, 0xCE, 0xCF], dtype=np.uint8)
# Left shift that brings an int's payload bytes (0, 1, 2, 4 or 8 of them) to the top of a
# big-endian uint64, so they land right after the marker byte.
_INT_SHIFT = np.array([56, 56, 48, 32, 0], dtype=np.uint64)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def map_header(n: int) -> bytes:
    return bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")


def array_header(n: int) -> bytes:
    return bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")


@dataclass(frozen=True, slots=True)
class Seg:
    """One segment: ``const`` bytes, ``row`` (per-row bytes), ``float`` or ``int`` column."""

    kind: str
    const: bytes = b""
    rows: tuple[bytes, ...] = ()


def const(b: bytes) -> Seg:
    return Seg("const", const=b)


def rows(values: Sequence[bytes]) -> Seg:
    return Seg("row", rows=tuple(values))


FLOAT = Seg("float")
INT = Seg("int")


def encode_floats(values: np.ndarray) -> np.ndarray:
    """(n, F) float64 → (n, F, 9) msgpack float64 bytes."""
    n, f = values.shape
    out = np.empty((n, f, 9), dtype=np.uint8)
    out[..., 0] = 0xCB
    out[..., 1:] = np.ascontiguousarray(values, dtype=">f8").view(np.uint8).reshape(n, f, 8)
    return out


_INT_BOUNDS = np.array([127, 255, 65535, (1 << 32) - 1], dtype=np.int64)


def int_classes(values: np.ndarray) -> np.ndarray:
    """msgpack length class of each non-negative int: fixint, uint8, uint16, uint32, uint64."""
    return np.searchsorted(_INT_BOUNDS, values, side="left").astype(np.int8)


def encode_uints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, I) non-negative ints → ((n, I, 9) bytes, (n, I) class), msgpack's shortest form.

    The encoding of an int in class c is the first ``_INT_LEN[c]`` bytes of its 9-byte slot.
    """
    v = np.asarray(values, dtype=np.int64)
    if v.size and int(v.min()) < 0:
        raise ValueError("encode_uints: negative value")
    n, k = v.shape
    cls = int_classes(v)
    out = np.empty((n, k, 9), dtype=np.uint8)
    marker = _INT_MARK[cls]
    out[..., 0] = np.where(cls == 0, v.astype(np.uint8), marker)
    shifted = v.astype(np.uint64) << _INT_SHIFT[cls]
    out[..., 1:] = shifted.astype(">u8").view(np.uint8).reshape(n, k, 8)
    return out, cls


class RowPacker:
    """Pack one message per row from a segment list; see the module docstring.

    Every segment has a slot in a padded byte matrix. Rows whose used lengths agree (same
    per-row static lengths, same int length classes this tick) form a group; a group is
    compacted by copying its runs of used bytes into a dense matrix, so no byte-level masking
    is needed. Layouts are cached by signature.
    """

    def __init__(self, segments: Sequence[Seg], n_rows: int) -> None:
        self.segs = _merge_consts(segments)
        self.n_rows = n_rows
        widths = [self._width(s, n_rows) for s in self.segs]
        self.starts = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)[:-1].tolist()
        self.widths = widths
        self.width = int(sum(widths))
        self.base = np.zeros((n_rows, self.width), dtype=np.uint8)
        row_lens: list[list[int]] = []
        # Runs of adjacent dynamic slots of one kind: (byte start, first index, count).
        self.float_runs: list[tuple[int, int, int]] = []
        self.int_runs: list[tuple[int, int, int]] = []
        counts = {"float": 0, "int": 0}
        prev_kind, prev_end = "", -1
        for s, a, w in zip(self.segs, self.starts, widths, strict=True):
            if s.kind == "const":
                self.base[:, a:a + w] = np.frombuffer(s.const, dtype=np.uint8)
            elif s.kind == "row":
                row_lens.append([len(b) for b in s.rows])
                for r, b in enumerate(s.rows):
                    self.base[r, a:a + len(b)] = np.frombuffer(b, dtype=np.uint8)
            else:
                if s.kind == "float":
                    self.base[:, a] = 0xCB  # the float64 marker never changes
                runs = self.float_runs if s.kind == "float" else self.int_runs
                if s.kind == prev_kind and prev_end == a:
                    b0, i0, c = runs[-1]
                    runs[-1] = (b0, i0, c + 1)
                else:
                    runs.append((a, counts[s.kind], 1))
                counts[s.kind] += 1
            prev_kind, prev_end = s.kind, a + w
        self.n_floats, self.n_ints = counts["float"], counts["int"]
        lens = np.array(row_lens, dtype=np.int64).T.reshape(n_rows, len(row_lens))
        self.sig_lens, sig = np.unique(lens, axis=0, return_inverse=True)
        sig = sig.reshape(-1).astype(np.int16)
        # Rows are kept sorted by static signature, so a group is usually a contiguous slice.
        self.perm = np.argsort(sig, kind="stable")
        self.inv = np.empty_like(self.perm)
        self.inv[self.perm] = np.arange(n_rows)
        self.base = self.base[self.perm]
        self.sig = sig[self.perm]
        self._layouts: dict[bytes, tuple[list[tuple[int, int, int]], int]] = {}

    @staticmethod
    def _width(s: Seg, n_rows: int) -> int:
        if s.kind == "const":
            return len(s.const)
        if s.kind == "row":
            if len(s.rows) != n_rows:
                raise ValueError(f"row segment has {len(s.rows)} values for {n_rows} rows")
            return max((len(b) for b in s.rows), default=0)
        return 9

    def _layout(self, key: np.ndarray) -> tuple[list[tuple[int, int, int]], int]:
        """Copy runs (src, dst, length) and dense width for one signature row [sig, cls...]."""
        kb = key.tobytes()
        hit = self._layouts.get(kb)
        if hit is not None:
            return hit
        sig_lens = self.sig_lens[int(key[0])]
        cls = key[1:]
        runs: list[tuple[int, int, int]] = []
        d = ri = ii = 0
        for s, a, w in zip(self.segs, self.starts, self.widths, strict=True):
            if s.kind == "row":
                used = int(sig_lens[ri])
                ri += 1
            elif s.kind == "int":
                used = int(_INT_LEN[cls[ii]])
                ii += 1
            else:
                used = w
            if used:
                if runs and runs[-1][0] + runs[-1][2] == a:
                    src, dst, ln = runs[-1]
                    runs[-1] = (src, dst, ln + used)
                else:
                    runs.append((a, d, used))
                d += used
        self._layouts[kb] = (runs, d)
        return runs, d

    def _group(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct signature rows and each row's group, via a 64-bit hash (checked)."""
        w = _hash_weights(keys.shape[1])
        h = keys.astype(np.uint64) @ w
        hu, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        uniq = keys[first]
        if not np.array_equal(uniq[inverse], keys):  # a hash collision: exact grouping
            uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        return uniq, inverse.reshape(-1)

    def pack(self, floats: np.ndarray, ints: np.ndarray | None = None,
             select: np.ndarray | None = None) -> list[bytes]:
        """Messages for the rows in ``select`` (all rows when None), in that order.

        ``floats`` is (rows, n_floats) and ``ints`` (rows, n_ints), one row per selected row.
        """
        if select is None:
            mat, sig, pos = self.base, self.sig, self.perm
            floats = floats[self.perm]
            ints = None if ints is None else ints[self.perm]
        else:
            internal = self.inv[select]
            pos = np.argsort(internal, kind="stable")
            rows_int = internal[pos]
            mat, sig = self.base[rows_int], self.sig[rows_int]
            floats = floats[pos]
            ints = None if ints is None else ints[pos]
        n = mat.shape[0]
        if floats.shape != (n, self.n_floats):
            raise ValueError(f"floats shape {floats.shape}, expected {(n, self.n_floats)}")
        if self.n_floats:
            f8 = floats.astype(">f8").view(np.uint8).reshape(n, self.n_floats, 8)
            for a, i, c in self.float_runs:
                mat[:, a:a + 9 * c].reshape(n, c, 9)[..., 1:] = f8[:, i:i + c]
        keys = np.empty((n, 1 + self.n_ints), dtype=np.int16)
        keys[:, 0] = sig
        if self.n_ints:
            if ints is None or ints.shape != (n, self.n_ints):
                raise ValueError(f"ints shape {None if ints is None else ints.shape}, "
                                 f"expected {(n, self.n_ints)}")
            data, cls = encode_uints(ints)
            i9 = data.reshape(n, -1)
            for a, i, c in self.int_runs:
                mat[:, a:a + 9 * c] = i9[:, 9 * i:9 * (i + c)]
            keys[:, 1:] = cls
        uniq, inverse = self._group(keys)
        out: list[bytes] = [b""] * n
        pos_l = pos.tolist()
        for g in range(len(uniq)):
            runs, w = self._layout(uniq[g])
            rows = np.flatnonzero(inverse == g)
            contiguous = rows[-1] - rows[0] + 1 == len(rows)
            src = mat[rows[0]:rows[-1] + 1] if contiguous else mat[rows]
            if len(runs) == 1 and runs[0][2] == self.width:
                dense = src
            else:
                dense = np.empty((src.shape[0], w), dtype=np.uint8)
                for a, d, ln in runs:
                    dense[:, d:d + ln] = src[:, a:a + ln]
            blob = dense.tobytes()
            for r, i in zip(rows.tolist(), range(0, len(blob), w), strict=True):
                out[pos_l[r]] = blob[i:i + w]
        return out


def _hash_weights(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(1, 1 << 62, size=n, dtype=np.int64).astype(np.uint64)


def _merge_consts(segments: Sequence[Seg]) -> list[Seg]:
    out: list[Seg] = []
    for s in segments:
        if s.kind == "const" and out and out[-1].kind == "const":
            out[-1] = const(out[-1].const + s.const)
        elif s.kind == "const" and not s.const:
            continue
        else:
            out.append(s)
    return out
