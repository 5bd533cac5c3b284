"""The build side: turn a model file into an artifact, and ship compiled kernels into one.

Uses the runtime (source import, weights, output walker) and writes with the atomic
writer; nothing in the serving path imports this package.
"""

from ._build import BuildResult, build
from ._options import BuildOptions
from ._sign import SignResult, sign
from ._warm import WarmResult, check_warm_device, warm
from ._writer import write_artifact

__all__ = ["BuildOptions", "BuildResult", "SignResult", "WarmResult", "build", "check_warm_device",
           "sign", "warm", "write_artifact"]
