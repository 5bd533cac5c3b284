"""The variants a benchmark compares (torch-free: the CLI's options are built from them)."""

from ..format import CHANNELS_LAST, CONTIGUOUS, PRECISIONS


def precision_variant(precision: str, layout: str = CONTIGUOUS) -> str:
    """The name of ``bench --precision``'s graph at ``precision`` in ``layout``."""
    return f"precision_{precision}" + (f"_{layout}" if layout != CONTIGUOUS else "")


#: ``bench --precision``: the whole model's graph at each precision, side by side; for a
#: model with a 2-D convolution, in both layouts.
PRECISION_VARIANTS = tuple(precision_variant(name) for name in PRECISIONS)
CHANNELS_LAST_VARIANTS = tuple(precision_variant(name, CHANNELS_LAST) for name in PRECISIONS)
VARIANTS = ("eager", "predictor", "predictor_padded", "bare_graph", "qkan_compile_inference",
            "torch_compile", *PRECISION_VARIANTS, *CHANNELS_LAST_VARIANTS)
LABELS = {
    "eager": "eager",
    "predictor": "predictor",
    "predictor_padded": "predictor, padded call",
    "bare_graph": "bare replay",
    "qkan_compile_inference": "qkan.compile_inference",
    "torch_compile": "torch.compile r-o",
    **{precision_variant(name): f"{name} graph" for name in PRECISIONS},
    **{precision_variant(name, CHANNELS_LAST): f"{name} channels-last graph"
       for name in PRECISIONS},
}
SKIPPABLE = VARIANTS[2:]
#: What ``qkan-pack bench --cold`` can time in fresh processes.
COLD_VARIANTS = ("predictor", "compiled", "torch_compile")
