"""``ModelInfer`` messages read and written at the protobuf wire level, for requests that
repeat: a client sends the same model, id, inputs' names, datatypes and shapes, and outputs
with every call, and only the raw tensors change. The message's fields other than its raw
tensors (its *head*) are then checked once and kept (``_oip.HeaderPlan``, as the HTTP route
keeps a binary request's JSON header), and a reply is its kept head followed by the raw
output tensors, without building and serialising a message per call (about 15 µs of a
replica's time per call in process, of some 85).

Protobuf serialisers write fields in field-number order, so a request's raw tensors
(``raw_input_contents``, field 7, the last) end its bytes, and a reply's (field 6) end
its own; a message written otherwise simply finds no kept head and is read field by field.

A request whose bytes are a kept head followed by raw tensors of the kept sizes
(``KeptLayout``) is then read without protobuf at all: those bytes parse to exactly that
head's fields and those tensors, so comparing them is parsing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: ``ModelInferResponse.raw_output_contents`` (field 6, length-delimited): its tag byte.
RAW_OUTPUT_TAG = b"\x32"
#: ``ModelInferRequest.raw_input_contents`` (field 7, length-delimited): its tag byte.
RAW_INPUT_TAG = b"\x3a"


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def framed_size(raws: Sequence[bytes]) -> int:
    """Bytes that ``raws`` take as a repeated bytes field: a tag byte, the length's varint
    and the bytes, each."""
    size = 0
    for raw in raws:
        length = len(raw)
        size += 1 + ((length.bit_length() + 6) // 7 or 1) + length  # tag, varint, bytes
    return size


def request_head(payload: bytes, raws: Sequence[bytes]) -> bytes:
    """The bytes of a request before its raw tensors ``raws`` (as parsed from ``payload``)
    when they end it, which ``is_head_of`` confirms before a head is kept. A lookup
    that matches a kept head proves the layout on its own: that head holds no raw tensor,
    so all of ``raws`` lie in the rest, which is exactly as long as they take."""
    return payload[:len(payload) - framed_size(raws)]


def is_head_of(message: Any, head: bytes) -> bool:
    """``head`` is exactly ``message`` without its raw tensors, as written by protobuf."""
    bare = type(message)()
    bare.CopyFrom(message)
    del bare.raw_input_contents[:]
    return bare.SerializeToString() == head


def reply_bytes(head: bytes, raws: Sequence[bytes]) -> bytes:
    """A ``ModelInferResponse``: its head (every field but the raw outputs, serialised)
    and then ``raws`` as its ``raw_output_contents``."""
    parts = [head]
    for raw in raws:
        parts += (RAW_OUTPUT_TAG, varint(len(raw)), raw)
    return b"".join(parts)


@dataclass(frozen=True)
class KeptLayout:
    """The bytes of every request made of a kept head (proved by ``is_head_of``) and raw
    tensors of given sizes: the head, then each tensor's tag and length prefix and its
    bytes, ``length`` in all. A message of that length that starts with the head and has
    each prefix in its place is that head's request with those tensors: protobuf would read
    the same fields from it, so ``raws`` reads them by comparing bytes alone."""

    head: bytes
    prefixes: tuple[tuple[int, bytes, int], ...]  # (offset, tag and length, size) per tensor
    length: int

    @classmethod
    def of(cls, head: bytes, sizes: Sequence[int]) -> KeptLayout:
        prefixes, offset = [], len(head)
        for size in sizes:
            prefix = RAW_INPUT_TAG + varint(size)
            prefixes.append((offset, prefix, size))
            offset += len(prefix) + size
        return cls(head, tuple(prefixes), offset)

    def raws(self, payload: bytes) -> list[memoryview] | None:
        """The raw tensors of ``payload`` (views of it) when it has this layout, else None."""
        if len(payload) != self.length or not payload.startswith(self.head):
            return None
        view, raws = memoryview(payload), []
        for offset, prefix, size in self.prefixes:
            if not payload.startswith(prefix, offset):
                return None
            start = offset + len(prefix)
            raws.append(view[start:start + size])
        return raws
