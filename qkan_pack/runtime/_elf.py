"""The shared libraries an ELF shared library names as needed (its ``DT_NEEDED`` entries),
read from its bytes with the standard library alone.

Why here and not a library: the serving path checks an AOTInductor package's wrapper library
before torch's loader opens it (``_aoti``), on hosts that have torch and nothing else (no
``readelf``, no ELF package in the environment), and without loading the library: a
library that crashes the process must be refused before it is loaded. Only what that needs
is read: the section headers, the dynamic section and its string table, each bounds-checked;
anything else about the file is not looked at. A file that is not such a library (another
format, truncated, inconsistent offsets) raises ``ValueError``.
"""

from __future__ import annotations

import struct

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

_MAGIC = b"\x7fELF"
_SHT_DYNAMIC = 6
_DT_NULL, _DT_NEEDED = 0, 1
#: A dynamic section longer than this many entries is not a compiler's.
_MAX_ENTRIES = 1 << 16


def needed_libraries(data: bytes) -> tuple[str, ...]:
    """The sonames an ELF shared library (32- or 64-bit, either byte order) needs, in the
    order its dynamic section lists them. ``ValueError`` for anything that is not one."""
    if data[:4] != _MAGIC or len(data) < 64:
        raise ValueError("not an ELF file")
    wide = {1: False, 2: True}.get(data[4])
    order = {1: "<", 2: ">"}.get(data[5])
    if wide is None or order is None:
        raise ValueError(f"unknown ELF class {data[4]} or byte order {data[5]}")
    try:
        return _needed(data, wide, order)
    except struct.error as exc:  # an offset or size past the end of the file
        raise ValueError(f"truncated or inconsistent ELF file ({exc})") from None


def _needed(data: bytes, wide: bool, order: str) -> tuple[str, ...]:
    if wide:
        shoff, shentsize, shnum = struct.unpack_from(order + "Q10xHH", data, 0x28)
        section, entry = order + "IIQQQQIIQQ", order + "qQ"
    else:
        shoff, shentsize, shnum = struct.unpack_from(order + "I10xHH", data, 0x20)
        section, entry = order + "IIIIIIIIII", order + "iI"
    if shoff == 0 or shentsize < struct.calcsize(section):
        raise ValueError("no section headers")
    if shnum == 0:  # more sections than the header's field holds: the count is section 0's size
        shnum = struct.unpack_from(section, data, shoff)[5]
    headers = [
        struct.unpack_from(section, data, shoff + i * shentsize)
        for i in range(min(shnum, len(data) // shentsize))
    ]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    dynamic = [h for h in headers if h[1] == _SHT_DYNAMIC]
    if not dynamic:
        raise ValueError("no dynamic section: not a shared library")
    _, _, _, _, offset, size, link, _, _, _ = dynamic[0]
    if link >= len(headers):
        raise ValueError("the dynamic section names no string table")
    strings, strings_size = headers[link][4], headers[link][5]
    needed = []
    step = struct.calcsize(entry)
    for index in range(min(size // step, _MAX_ENTRIES)):
        tag, value = struct.unpack_from(entry, data, offset + index * step)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            if value >= strings_size:
                raise ValueError("a needed library's name lies outside the string table")
            start = strings + value
            end = data.find(b"\0", start, strings + strings_size)
            if end < 0:
                raise ValueError("a needed library's name is not terminated")
            needed.append(data[start:end].decode("utf-8", "replace"))
    return tuple(needed)
