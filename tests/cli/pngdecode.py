"""A tiny PNG decoder (zlib and the five row filters), enough to judge a browser screenshot
without Pillow: 8-bit greyscale, RGB, grey+alpha or RGBA, not interlaced."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    pixels: np.ndarray  # [height, width, channels] uint8


def _paeth_row(line: bytearray, prior: bytes | bytearray, bpp: int) -> None:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prior[i]
        c = prior[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
        line[i] = (line[i] + pred) & 0xFF


def _average_row(line: bytearray, prior: bytes | bytearray, bpp: int) -> None:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        line[i] = (line[i] + ((a + prior[i]) >> 1)) & 0xFF


def _unfilter(kind: int, line: bytearray, prior: bytearray, bpp: int) -> bytearray:
    if kind == 0:
        return line
    if kind == 1:  # Sub: a running sum per channel, modulo 256
        arr = np.frombuffer(bytes(line), np.uint8).reshape(-1, bpp).astype(np.uint64)
        return bytearray((np.cumsum(arr, axis=0) % 256).astype(np.uint8).tobytes())
    if kind == 2:  # Up
        up = np.frombuffer(bytes(line), np.uint8) + np.frombuffer(bytes(prior), np.uint8)
        return bytearray(up.astype(np.uint8).tobytes())
    if kind == 3:
        _average_row(line, prior, bpp)
        return line
    if kind == 4:
        _paeth_row(line, prior, bpp)
        return line
    raise ValueError(f"unknown PNG filter type {kind}")


def read_png(path: str | Path) -> Image:
    data = Path(path).read_bytes()
    if not data.startswith(_SIGNATURE):
        raise ValueError(f"{path} is not a PNG file")
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError(f"{path} has no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in _CHANNELS or interlace:
        raise ValueError(
            f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}"
        )
    bpp = _CHANNELS[colour]
    raw = zlib.decompress(bytes(idat))
    stride = width * bpp
    rows, prior = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), prior, bpp)
        rows.append(bytes(line))
        prior = line
    pixels = np.frombuffer(b"".join(rows), np.uint8).reshape(height, width, bpp)
    return Image(width, height, pixels)
