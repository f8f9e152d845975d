"""TensorBoard scalars without TensorFlow: event files TensorBoard reads, written with the standard library.

keras.callbacks.TensorBoard writes through TensorFlow's summary writer, which the JAX engine does not import (a
TensorFlow TPU build in the same process could take the TPU that JAX holds). The format is small and documented:

  * an event file is a sequence of TFRecord records: the length (uint64, little-endian), its masked CRC32C (uint32),
    the bytes, their masked CRC32C; masked = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32
    (tensorflow.org/tutorials/load_data/tfrecord, "TFRecords format details");
  * each record is an Event protocol buffer (tensorflow/core/util/event.proto): wall_time = 1 (double),
    step = 2 (int64), file_version = 3 (string, the first record: "brain.Event:2"), summary = 5 (Summary);
  * a Summary (tensorflow/core/framework/summary.proto) holds repeated Value = 1, each tag = 1 (string) and
    simple_value = 2 (float);
  * TensorBoard reads files named events.out.tfevents.<seconds>.<host>.<pid>.<n> in each run directory.

The tags follow keras.callbacks.TensorBoard's: train/ and validation/ runs with epoch_loss, epoch_accuracy, ...,
at step = the 0-based epoch. tests/train/test_tbevents.py reads a file back with TensorBoard's own reader.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

_counter = itertools.count()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _masked_crc(data: bytes) -> bytes:
    import google_crc32c  # installed with google-cloud-storage (the runner's own dependency)

    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """One TFRecord: framed and checksummed."""
    length = struct.pack("<Q", len(data))
    return length + _masked_crc(length) + data + _masked_crc(data)


def event(
    wall_time: float, step: int = 0, *, file_version: str | None = None, scalars: Mapping[str, float] = {}
) -> bytes:
    """An Event message with the given scalars (or the file-version header)."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, values)
    return out


class EventFile:
    """One event file in `directory`, created at the first write; every write is flushed, so a killed process
    leaves whole records behind."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: BinaryIO | None = None

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            now = time.time()
            name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.{next(_counter)}.v2"
            self._file = (self.directory / name).open("ab")
            self._file.write(record(event(now, file_version="brain.Event:2")))
        self._file.write(record(event(time.time(), step, scalars=scalars)))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
