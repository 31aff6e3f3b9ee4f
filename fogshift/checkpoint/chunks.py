"""Content-defined chunks of checkpoint files, so that a pull ships what changed inside a
file, not the file.

RocksDB rewrites a state's files whole: a compaction merges every level-0 file with the
overlapping level-1 one, and for a small key space that is all of it. A partition with six
keys of 1 MiB wrote a new 6.3 MB SST every ~20 s holding the same values as the one before,
and each central pull shipped it whole over the node's link. Cut at content-defined
boundaries (FastCDC, the ``fastcdc`` package), the same bytes make the same chunks wherever
they sit in the file; the central store keeps each stored file's chunk list and fetches only
the chunks it holds nowhere (:meth:`fogshift.checkpoint.central.CentralStore.put`). The
moved keys' states, new files on their target, are found in their origin's files too.

Both sides cut with :func:`file_chunks`: the node agent lists a file's chunks, the store
cuts what it stored.
"""

from __future__ import annotations

import hashlib

from fastcdc import fastcdc

#: Files smaller than this are shipped whole: a listing and a second round trip would cost
#: more than they save.
CHUNKED_MIN_BYTES = 1024 * 1024
#: FastCDC's sizes: a 64 KiB average keeps a 6 MB file's listing at ~100 entries (~10 KB of
#: JSON), and a change costs a chunk or two around it.
MIN_CHUNK = 16 * 1024
AVG_CHUNK = 64 * 1024
MAX_CHUNK = 256 * 1024

#: One chunk: its offset in the file, its length, the sha256 of its bytes (hex).
Chunk = tuple[int, int, str]


def file_chunks(data: bytes) -> list[Chunk]:
    """The content-defined chunks of ``data``, in order, covering it exactly."""
    if not data:
        return []
    return [
        (c.offset, c.length, c.hash)
        for c in fastcdc(data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK, fat=False, hf=hashlib.sha256)
    ]
