"""The variants a benchmark compares (torch-free: the CLI's options are built from them)."""

from ..format import PRECISIONS

#: ``bench --precision``: the whole model's graph at each precision, side by side.
PRECISION_VARIANTS = tuple(f"precision_{name}" for name in PRECISIONS)
VARIANTS = ("eager", "predictor", "predictor_padded", "bare_graph", "qkan_compile_inference",
            "torch_compile", *PRECISION_VARIANTS)
LABELS = {
    "eager": "eager",
    "predictor": "predictor",
    "predictor_padded": "predictor, padded call",
    "bare_graph": "bare replay",
    "qkan_compile_inference": "qkan.compile_inference",
    "torch_compile": "torch.compile r-o",
    **{f"precision_{name}": f"{name} graph" for name in PRECISIONS},
}
SKIPPABLE = VARIANTS[2:]
#: What ``qkan-pack bench --cold`` can time in fresh processes.
COLD_VARIANTS = ("predictor", "compiled", "torch_compile")
