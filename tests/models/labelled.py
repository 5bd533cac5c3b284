"""A classifier whose config names its classes (``config.id2label``, as transformers'
configs do), in ways a manifest reader refuses: what ``kind`` says. It has one output per
label unless ``outputs`` says otherwise."""

from types import SimpleNamespace

import torch

#: 100,000 labels (the most allowed), each one fine: of 60 characters they alone take over
#: 4 MiB; of 36 characters, 4.0 MB of JSON and a 4.4 MB manifest.
LABELS = {
    "good": ["cat", "dog", "bird"],
    "control": ["cat", "dog\x1b[2J", "bird"],
    "long": ["cat", "d" * 2000, "bird"],
    "many": [f"c{i}" for i in range(100_001)],
    "huge": [f"class {i:06d} " + "x" * 47 for i in range(100_000)],
    "large": [f"class {i:06d} " + "x" * 23 for i in range(100_000)],
    "surrogate": ["cat", "caf\udce9", "bird"],
    "thousand": [f"class {i}" for i in range(1000)],
}


def build_model(kind: str = "good", outputs: int = 0) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, outputs or len(LABELS[kind]))
    model.config = SimpleNamespace(id2label=dict(enumerate(LABELS[kind])))
    return model


def build_keyed(keys: str) -> torch.nn.Module:
    """Three classes whose ``id2label`` keys are not 0..2 (a hand-made config)."""
    model = build_model("good")
    model.config.id2label = ({"0": "cat", "x": "dog", 2: "bird"} if keys == "mixed"
                             else {-1: "cat", 1: "dog", 2: "bird"})
    return model
