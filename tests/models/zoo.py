"""Vision models as users bring them: torchvision and timm architectures, untouched,
randomly initialised (no downloads)."""

import torch


def build_model(family: str = "torchvision", name: str = "resnet18") -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "torchvision":
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    if family == "detection":
        import torchvision

        return getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None)
    if family == "timm":
        import timm

        return timm.create_model(name, pretrained=False)
    raise ValueError(f"unknown family {family!r}")
