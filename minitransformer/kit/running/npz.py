"""Checkpoints of earlier versions (``.npz``, format version 1), converted once to safetensors by
``minitransformer convert runs/toy`` (``convert_npz``), the command ``load_checkpoint`` names when it meets one. The
zip's sha256 trailer, entry count, sizes and every array header are checked before ``numpy.load(allow_pickle=False)``
reads an array; the new file is written with the writer's checks, which are the reader's."""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import zipfile

import numpy

from minitransformer.kit.running import checkpoint as ck
from minitransformer.kit.running import checkpoint_checks as checks
from minitransformer.kit.files import open_regular, parse_json
from minitransformer.kit.limits import MAX_ENTRIES, MAX_INFLATION, MAX_NDIM

_DIGEST = b"minitransformer-sha256:"
_TRAILER = 2 + len(_DIGEST) + 64          # the zip comment's length field, then the comment
_HEADER_READERS = {(1, 0): numpy.lib.format.read_array_header_1_0, (2, 0): numpy.lib.format.read_array_header_2_0}


class _Refused(ValueError):
    """What the checks below refuse (any other error while reading means a damaged file)."""


def read_npz(path) -> tuple:
    """(arrays, metadata) of an ``.npz`` checkpoint, or ValueError naming the file and what is wrong."""
    path = os.fspath(path)
    with open_regular(path, "checkpoint") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            body = f.read(size)
            tail = body[-_TRAILER:]
            if not body.startswith(b"PK\x03\x04") or size < _TRAILER + 22 or not tail[2:].startswith(_DIGEST):
                raise _Refused("not an .npz checkpoint of minitransformer (no checksum at its end)")
            if hashlib.sha256(body[:-_TRAILER] + b"\0\0").hexdigest().encode() != tail[2 + len(_DIGEST):]:
                raise _Refused("checksum mismatch, the file was altered or damaged after it was written")
            del body
            f.seek(0)
            archive = zipfile.ZipFile(f)
            infos = archive.infolist()
            if len(infos) > MAX_ENTRIES or sum(i.file_size for i in infos) > MAX_INFLATION * size + (1 << 20):
                raise _Refused(f"{len(infos):,} entries decompressing to {sum(i.file_size for i in infos):,} bytes")
            for info in infos:
                with archive.open(info) as fp:
                    shape, _, dtype = _HEADER_READERS[numpy.lib.format.read_magic(fp)](fp)
                    header = fp.tell()
                if not info.filename.endswith(".npy") or dtype.newbyteorder("=") not in ck.CODES or \
                        len(shape) > MAX_NDIM or header + math.prod(shape) * dtype.itemsize != info.file_size:
                    raise _Refused(f"entry {info.filename!r:.60} is no array a checkpoint holds")
            arrays = {i.filename[:-4]: numpy.lib.format.read_array(archive.open(i), allow_pickle=False) for i in infos}
        except _Refused as err:
            raise ValueError(f"checkpoint {path}: {err}") from None
        except Exception as err:  # noqa: BLE001 - zip, zlib, NumPy's header parser (tokenize): a damaged file
            raise ValueError(f"checkpoint {path}: damaged, cannot be read ({type(err).__name__})") from None
    meta = arrays.pop("meta", None)
    if meta is None or meta.dtype != numpy.uint8 or meta.ndim != 1:
        raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (no metadata)")
    return arrays, parse_json(bytes(meta), f"checkpoint {path}: metadata")


def convert_npz(old, new=None, run: str | None = None) -> list:
    """Write the checkpoint ``old`` (.npz) as ``new`` (default: beside it, named .safetensors), or, for a folder,
    each of its checkpoint.npz and checkpoint-<step>.npz files (one run id for all). Old files are kept; an
    existing new file is refused, never replaced. -> the paths written."""
    old, run = os.fspath(old), run or secrets.token_hex(8)
    if os.path.isdir(old):
        if new is not None:
            raise ValueError(f"convert_npz: {old} is a folder: its files are converted beside themselves, "
                             f"so no new name can be given")
        names = sorted(n for n in os.listdir(old) if ck.OLD_NAME.match(n))
        if not names:
            raise FileNotFoundError(f"no checkpoint.npz or checkpoint-<step>.npz in {old}")
        return [convert_npz(os.path.join(old, name), run=run)[0] for name in names]
    new = os.fspath(new) if new is not None else re.sub(r"(\.npz)?$", ck.SUFFIX, old, count=1)
    if os.path.lexists(new):
        raise ValueError(f"convert_npz: {new} exists already: refusing to replace it")
    arrays, meta = read_npz(old)
    if isinstance(meta, dict) and meta.get("format_version") == 1:
        meta = {**meta, "format_version": checks.FORMAT_VERSION}
    arrays.pop("format_version", None)
    checks.check_meta(f"checkpoint {old}", meta, {n: (ck.CODES[a.dtype.newbyteorder("=")], list(a.shape))
                                                  for n, a in arrays.items()})
    return [ck.save_checkpoint(new, **ck.restore(meta, arrays), run=run)]
