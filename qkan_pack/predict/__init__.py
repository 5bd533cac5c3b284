"""``qkan-pack predict``: run a predictor on inputs read from files and write or summarise
its outputs. A tool above the runtime, like bench and serve; the serving path never
imports it."""

from ._files import (
    INPUT_SUFFIXES,
    OUTPUT_SUFFIXES,
    check_output,
    named_outputs,
    read_inputs,
    summarize,
    write_outputs,
)

__all__ = [
    "INPUT_SUFFIXES",
    "OUTPUT_SUFFIXES",
    "check_output",
    "named_outputs",
    "read_inputs",
    "summarize",
    "write_outputs",
]
