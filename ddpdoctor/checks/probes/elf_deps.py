"""The dynamic-linking facts of a shared library (DT_NEEDED, DT_RPATH, DT_RUNPATH), read from its ELF
headers without loading it.

torch's libtorch_cuda.so says which libnccl it needs and where the loader looks for it; reading that
here lets the doctor load the same libnccl torch would, without paying for `import torch`.
Only 64-bit little-endian ELF is handled (x86_64, aarch64); anything else returns None.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SHT_DYNAMIC = 6
_DT_NULL, _DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 0, 1, 15, 29


@dataclass(frozen=True)
class DynamicInfo:
    needed: tuple[str, ...]
    rpath: tuple[str, ...]  # DT_RPATH entries: searched BEFORE LD_LIBRARY_PATH
    runpath: tuple[str, ...]  # DT_RUNPATH entries: searched AFTER LD_LIBRARY_PATH


def read_dynamic_info(path: str) -> DynamicInfo | None:
    """The library's dynamic section, or None when it is not a 64-bit little-endian ELF file."""
    try:
        with open(path, "rb") as fh:
            return _parse(fh)
    except (OSError, struct.error, ValueError):
        return None


def _parse(fh) -> DynamicInfo | None:
    ident = fh.read(16)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:  # ELFCLASS64, little-endian
        return None
    header = fh.read(48)
    shoff = struct.unpack_from("<Q", header, 24)[0]
    shentsize, shnum = struct.unpack_from("<HH", header, 42)
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != _SHT_DYNAMIC:
            continue
        strtab = sections[link]
        fh.seek(strtab[4])
        strings = fh.read(strtab[5])
        fh.seek(offset)
        dynamic = fh.read(size)
        return _entries(dynamic, entsize or 16, strings)
    return DynamicInfo((), (), ())


def _entries(dynamic: bytes, entsize: int, strings: bytes) -> DynamicInfo:
    def string_at(offset: int) -> str:
        end = strings.index(b"\0", offset)
        return strings[offset:end].decode("utf-8", "replace")

    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    for pos in range(0, len(dynamic) - entsize + 1, entsize):
        tag, value = struct.unpack_from("<qQ", dynamic, pos)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed.append(string_at(value))
        elif tag == _DT_RPATH:
            rpath.extend(p for p in string_at(value).split(":") if p)
        elif tag == _DT_RUNPATH:
            runpath.extend(p for p in string_at(value).split(":") if p)
    return DynamicInfo(tuple(needed), tuple(rpath), tuple(runpath))
