"""A small reader of GGUF files (the llama.cpp / ggml model format), written from the format description.

    f = GGUFFile("model.gguf")
    f.metadata["llama.block_count"]          # metadata values as Python values (numeric arrays: numpy arrays)
    f.tensors["blk.0.attn_q.weight"]         # TensorInfo(name, shape, ggml_type, offset, nbytes)
    w = f.tensor("blk.0.attn_q.weight")      # float32 numpy array in numpy (row-major) order

It needs only numpy, so fp4kit.quality runs where the ``gguf`` package is not installed. It reads what the
quality check needs and nothing more: GGUF versions 2 and 3, every metadata value type, the tensor table and
the alignment, and the dequantization of the tensor types of SmolLM2-135M-Instruct.Q4_1.gguf (F32, Q4_1 for
the block matrices, Q8_0 for the token embedding). Any other tensor type raises NotImplementedError naming it.

File layout (all integers little-endian):
    magic "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_kv_count      (version 1: uint32 counts,
                                                                                      not supported)
    metadata_kv_count x (string key, uint32 value_type, value)
    tensor_count x (string name, uint32 n_dims, uint64 dims[n_dims], uint32 ggml_type, uint64 offset)
    padding to ``general.alignment`` (default 32), then the tensor data; each tensor at data start + offset.
A string is a uint64 byte length and UTF-8 bytes; an array a uint32 element type, a uint64 count and the
elements. dims[0] is the fastest-varying dimension, so the numpy shape is the dims reversed.

Block formats (32 values per block along dims[0]; fp16 = IEEE half):
    Q4_1: fp16 d, fp16 m, 16 bytes of 4-bit codes q; value j = q_j * d + m, where byte i holds q_i in its low
          nibble and q_{i+16} in its high nibble.
    Q8_0: fp16 d, 32 int8 codes q; value j = q_j * d.
The products and sums are computed in float32 (d and m widened from fp16 first).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

import numpy as np

__all__ = ["GGUFFile", "TensorInfo", "GGML_TYPES", "read_gguf"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types.
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = \
    range(13)
_SCALAR = {_UINT8: "<u1", _INT8: "<i1", _UINT16: "<u2", _INT16: "<i2", _UINT32: "<u4", _INT32: "<i4",
           _FLOAT32: "<f4", _BOOL: "<u1", _UINT64: "<u8", _INT64: "<i8", _FLOAT64: "<f8"}

# ggml tensor types: id -> (name, values per block, bytes per block). Only the ones named in _DEQUANT can be read.
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    30: ("BF16", 1, 2),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: numpy-order shape (dims reversed), ggml type id and name, byte offset of its data
    from the file start, and its size in bytes."""
    name: str
    shape: Tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _deq_f32(raw: np.ndarray, n: int) -> np.ndarray:
    return raw.view("<f4").astype(np.float32)


def _deq_q4_1(raw: np.ndarray, n: int) -> np.ndarray:
    b = raw.reshape(n // 32, 20)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)          # [blocks, 1]
    m = b[:, 2:4].copy().view("<f2").astype(np.float32)
    qs = b[:, 4:20]
    q = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1).astype(np.float32)  # [blocks, 32]
    return (q * d + m).reshape(n)


def _deq_q8_0(raw: np.ndarray, n: int) -> np.ndarray:
    b = raw.reshape(n // 32, 34)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return (q * d).reshape(n)


_DEQUANT = {0: _deq_f32, 3: _deq_q4_1, 8: _deq_q8_0}


class _Cursor:
    """Sequential little-endian reads from a bytes-like buffer, with bounds checks."""

    def __init__(self, buf, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (needs {n} bytes at offset {self.pos}, "
                             f"the file has {len(self.buf)})")
        v = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return v

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return bytes(self.take(n)).decode("utf-8")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _SCALAR:
                dt = np.dtype(_SCALAR[etype])
                a = np.frombuffer(self.take(count * dt.itemsize), dtype=dt).copy()
                return a.astype(bool) if etype == _BOOL else a
            return [self.value(etype) for _ in range(count)]
        if vtype in _SCALAR:
            dt = np.dtype(_SCALAR[vtype])
            v = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0].item()
            return bool(v) if vtype == _BOOL else v
        raise ValueError(f"{self.path}: unknown GGUF metadata value type {vtype} at offset {self.pos - 4}")


class GGUFFile:
    """A GGUF file, memory-mapped read-only. ``metadata``: {key: value}; ``tensors``: {name: TensorInfo}
    (in file order); ``version``, ``alignment``, ``data_offset``."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = str(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        c = _Cursor(self._map, self.path)
        if bytes(c.take(4)) != MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (the first 4 bytes are not 'GGUF')")
        self.version = c.unpack("<I")
        if self.version not in (2, 3):
            raise NotImplementedError(f"{self.path}: GGUF version {self.version}; versions 2 and 3 are supported")
        n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
        self.metadata: Dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            self.metadata[key] = c.value(c.unpack("<I"))
        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise ValueError(f"{self.path}: general.alignment = {self.alignment} is not a power of two")
        infos: List[Tuple[str, Tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.unpack("<I")
            dims = tuple(c.unpack("<Q") for _ in range(n_dims))
            infos.append((name, tuple(reversed(dims)), c.unpack("<I"), c.unpack("<Q")))
        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        self.tensors: Dict[str, TensorInfo] = {}
        for name, shape, t, off in infos:
            if t not in GGML_TYPES:
                raise ValueError(f"{self.path}: tensor {name}: unknown ggml type {t}")
            tname, block, bsize = GGML_TYPES[t]
            n = 1
            for s in shape:
                n *= s
            if shape and shape[-1] % block:
                raise ValueError(f"{self.path}: tensor {name}: {tname} needs the innermost dimension to be a "
                                 f"multiple of {block} (shape {shape})")
            if off % self.alignment:
                raise ValueError(f"{self.path}: tensor {name}: offset {off} is not a multiple of the alignment "
                                 f"{self.alignment}")
            nbytes = n // block * bsize
            start = self.data_offset + off
            if start + nbytes > len(self._map):
                raise ValueError(f"{self.path}: tensor {name}: data [{start}, {start + nbytes}) lies past the end of "
                                 f"the file ({len(self._map)} bytes)")
            self.tensors[name] = TensorInfo(name, shape, t, tname, start, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the file."""
        t = self._info(name)
        return self._map[t.offset:t.offset + t.nbytes]

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, shape ``TensorInfo.shape`` (numpy order)."""
        t = self._info(name)
        if t.ggml_type not in _DEQUANT:
            have = ", ".join(GGML_TYPES[k][0] for k in _DEQUANT)
            raise NotImplementedError(f"{self.path}: tensor {name} is {t.type_name}; this reader dequantizes "
                                      f"{have} only")
        return _DEQUANT[t.ggml_type](np.asarray(self.raw(name)), t.n_elements).reshape(t.shape)

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value; `default` when the key is absent (ValueError when absent and no default)."""
        if key in self.metadata:
            return self.metadata[key]
        if default is None:
            raise ValueError(f"{self.path}: GGUF metadata key {key!r} is missing")
        return default


def read_gguf(path: Union[str, Path]) -> GGUFFile:
    return GGUFFile(path)
