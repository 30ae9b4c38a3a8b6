"""MobileNetV2 (Sandler et al. 2018) with torchvision's state-dict keys, so its ImageNet
weights load as they are. torchvision itself is not used (it does not import beside this torch)."""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from .assets import asset_path

# (expansion t, channels c, repeats n, first stride s), as in the paper and torchvision
_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class ConvBNReLU(nn.Sequential):  # keys: N.0 conv, N.1 bn
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int):
        super().__init__()
        hidden = cin * t
        self.use_res = stride == 1 and cin == cout
        layers = [ConvBNReLU(cin, hidden, 1)] if t != 1 else []
        layers += [ConvBNReLU(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        cin, layers = 32, [ConvBNReLU(3, 32, stride=2)]
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(ConvBNReLU(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.features(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def mobilenet_v2(weights: str | Path | None = "imagenet") -> MobileNetV2:
    """The model in eval mode; `weights="imagenet"` loads the installed ImageNet weights."""
    model = MobileNetV2()
    if weights is not None:
        path = asset_path("mobilenet_v2_weights") if weights == "imagenet" else Path(weights)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


def export_onnx(out: str | Path, weights: str | Path | None = "imagenet", opset: int = 17) -> Path:
    """MobileNetV2 → ONNX (1x3x224x224 float32 input `image`, output `logits`).

    The TorchScript exporter is used: the dynamo exporter needs onnxscript, which is not installed.
    Node names keep the module paths (`/features/features.3/conv/...`), which audit shows."""
    out = Path(out)
    model = mobilenet_v2(weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, 3, 224, 224),), str(out), input_names=["image"],
                          output_names=["logits"], opset_version=opset, dynamo=False)
    return out


class MobileNetRows(nn.Module):
    """MobileNetV2's feature map [1, 1280, h, w] as h*w rows [1, h*w, hidden] through a linear projector: a
    real vision trunk in the shape `compile --vision-encoder` takes (the projector random, seeded, unless
    trained by the user: no trained one ships)."""

    def __init__(self, hidden: int, weights: str | Path | None = "imagenet", seed: int = 0):
        super().__init__()
        self.features = mobilenet_v2(weights).features
        torch.manual_seed(seed)
        self.proj = nn.Linear(1280, hidden)

    def forward(self, x):
        return self.proj(self.features(x).flatten(2).transpose(1, 2))
