"""Compressed request bodies inflated within a bound: a small body may inflate without
limit (a "zip bomb"), so input goes in chunks and output stops one byte past what the
request may hold. Standard library only; ``_http.decompressed`` turns the outcome into a
reply.
"""

from __future__ import annotations

from ..errors import MalformedRequestError

#: ``Content-Encoding`` of a request body and the zlib window that reads it (tritonclient's
#: ``request_compression_algorithm``: gzip, or deflate as the zlib format).
COMPRESSIONS = {"gzip": 16 + 15, "deflate": 15}
#: Members a gzip body may hold (RFC 1952 allows several, concatenated; each costs a fresh
#: inflater, so their number is bounded as the inflated size is).
MAX_GZIP_MEMBERS = 1024
#: Compressed bytes handed to the inflater at a time: what a member's end copies of the
#: input that follows it (``unused_data``) stays this small.
_INFLATE_CHUNK = 16 * 1024


def inflate(body: bytes, window: int, limit: int) -> bytes | None:
    """``body`` inflated with zlib's ``window``, or None once it passes ``limit`` bytes. A
    gzip body is every member in turn, as ``gzip.decompress`` reads it (a member whose end
    is missing is refused, never cut short); a zlib body is one stream with nothing after
    it. Raises ``zlib.error`` or ``MalformedRequestError``."""
    import zlib

    view = memoryview(body)
    pieces: list[bytes] = []
    start = size = 0
    for member in range(MAX_GZIP_MEMBERS):
        try:
            inflated = _inflate_stream(view, start, window, limit - size)
        except zlib.error as exc:
            if member == 0:
                raise
            raise MalformedRequestError(f"the {len(view) - start} bytes after gzip member "
                                        f"{member} are not a gzip member ({exc})") from None
        if inflated is None:
            return None
        pieces += inflated[0]
        size += sum(map(len, inflated[0]))
        start = inflated[1]
        if start == len(view):
            return b"".join(pieces)
        if window != COMPRESSIONS["gzip"]:
            raise MalformedRequestError(f"{len(view) - start} bytes follow the end of the "
                                        "compressed stream")
    raise MalformedRequestError(f"it holds more than {MAX_GZIP_MEMBERS} gzip members; "
                                "compress the body as one (gzip.compress does)")


def _inflate_stream(view: memoryview, start: int, window: int, room: int
                    ) -> tuple[list[bytes], int] | None:
    """The one stream (a gzip member) that begins at ``view[start]``: (its inflated pieces,
    where it ends), or None once it passes ``room`` bytes. Input goes in chunks and output
    stops one byte past ``room``, so memory stays within the limit and the body."""
    import zlib

    inflater = zlib.decompressobj(window)
    pieces: list[bytes] = []
    position = start
    while not inflater.eof:
        if position >= len(view):
            raise MalformedRequestError("the compressed data ends before its stream does")
        chunk = view[position:position + _INFLATE_CHUNK]
        position += len(chunk)
        piece = inflater.decompress(chunk, room + 1)
        room -= len(piece)
        if room < 0:
            return None
        pieces.append(piece)
    return pieces, position - len(inflater.unused_data)
