"""The checksum file Hadoop's local file system writes beside each file Spark writes
(``.NAME.crc``), for tests that tear a checkpoint's files (the format read is checked
against a file Spark wrote in ``tests/runtime/test_engine_lifecycle.py``)."""

from __future__ import annotations

import binascii
import struct
from pathlib import Path


def checksummed(path: Path, per: int = 4) -> None:
    """Write ``path``'s checksum file: ``crc\\0``, the bytes a checksum covers (``per``;
    Hadoop's 512, fewer here to make several runs of a small file) and a big-endian CRC-32
    of each run of them."""
    data = path.read_bytes()
    sums = b"".join(
        struct.pack(">I", binascii.crc32(data[at : at + per])) for at in range(0, len(data), per)
    )
    path.with_name(f".{path.name}.crc").write_bytes(b"crc\0" + struct.pack(">i", per) + sums)
