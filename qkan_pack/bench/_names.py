"""The variants a benchmark compares (torch-free: the CLI's options are built from them)."""

VARIANTS = ("eager", "predictor", "predictor_padded", "bare_graph", "qkan_compile_inference",
            "torch_compile")
LABELS = {
    "eager": "eager",
    "predictor": "predictor",
    "predictor_padded": "predictor, padded call",
    "bare_graph": "bare replay",
    "qkan_compile_inference": "qkan.compile_inference",
    "torch_compile": "torch.compile r-o",
}
SKIPPABLE = VARIANTS[2:]
#: What ``qkan-pack bench --cold`` can time in fresh processes.
COLD_VARIANTS = ("predictor", "compiled", "torch_compile")
