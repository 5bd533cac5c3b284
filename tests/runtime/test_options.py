"""Every ``Predictor.load`` option is checked before the artifact is touched (finding 5 of
the second audit: NaN, infinite or negative tolerances were accepted and only met after the
model's code had run)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from qkan_pack import LoadOptionError, LoadOptions, Predictor

NOWHERE = "/no/such/artifact"  # touching it would raise ArtifactError, not LoadOptionError



def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


BAD = {
    "NaN rtol": {"reference_tolerance": (math.nan, 1e-5)},
    "inf atol": {"reference_tolerance": (1e-4, math.inf)},
    "negative rtol": {"replay_tolerance": (-1e-5, 1e-6)},
    "int beyond float rtol": {"replay_tolerance": (10**400, 0)},  # audit: OverflowError
    "NaN replay": {"replay_tolerance": (1e-5, math.nan)},
    "one number": {"replay_tolerance": 1e-5},
    "three numbers": {"reference_tolerance": (1e-4, 1e-5, 0.0)},
    "text tolerance": {"reference_tolerance": ("1e-4", "1e-5")},
    "bool tolerance": {"reference_tolerance": (True, False)},
    "tolerance as text": {"replay_tolerance": "1e-5,1e-6"},
    "digest not hex": {"expected_digest": "sha256:xyz"},
    "digest too short": {"expected_digest": "sha256:abc123"},
    "digest not text": {"expected_digest": 1234},
    "pad_batch text": {"pad_batch": "yes"},
    "copy_outputs int": {"copy_outputs": 0},
    "progress text": {"progress": "auto"},
    "kernels unknown": {"kernels": "always"},
    "overrides not a mapping": {"config_overrides": [("solver", "flash")]},
    "override key not an identifier": {"config_overrides": {"not valid": 1}},
    "override value NaN": {"config_overrides": {"scale": math.nan}},
    "override value not JSON": {"config_overrides": {"fn": print}},
    "override nested too deep": {"config_overrides": {"deep": nested(80)}},
    "trusted_keys a single path": {"trusted_keys": "key.pub"},
    "trusted_keys missing file": {"trusted_keys": ["/no/such/key.pub"]},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_option_is_refused_before_the_artifact_is_touched(case: str) -> None:
    with pytest.raises(LoadOptionError) as info:
        Predictor.load(NOWHERE, **BAD[case])
    (option,) = BAD[case]
    assert info.value.option == option and option in str(info.value)
    with pytest.raises(LoadOptionError):
        LoadOptions(**BAD[case])


def test_recursive_override_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(LoadOptionError, match="config_overrides"):
        LoadOptions(config_overrides={"deep": nested(100_000)})


def test_good_options_are_normalised() -> None:
    options = LoadOptions(expected_digest="  SHA256:" + "AB" * 32 + "\n",
                          reference_tolerance=[1e-3, 0], replay_tolerance=(0, 1),
                          config_overrides={"solver": "flash", "width": (2, 3)})
    assert options.expected_digest == "sha256:" + "ab" * 32
    assert options.reference_tolerance == (1e-3, 0.0)
    assert options.replay_tolerance == (0.0, 1.0)
    assert options.config_overrides == {"solver": "flash", "width": [2, 3]}  # as JSON sees it
    assert LoadOptions(expected_digest="ab" * 32).expected_digest == "sha256:" + "ab" * 32


def test_zero_tolerance_and_real_artifact_still_load(mlp_artifact: Path) -> None:
    with Predictor.load(mlp_artifact, reference_tolerance=(1e-3, 1e-4),
                        replay_tolerance=(0.0, 0.0)) as predictor:
        assert predictor.options.replay_tolerance == (0.0, 0.0)
