"""PyTorch nn.Module -> ExecuTorch .pte (QNN delegate) for SM8650 at 8a8w -> run it on the HTP simulator.

    python examples/pytorch_pte.py [OUT]          # the Python API (default OUT: pytorch-pte-out)

The same model from the CLI, through `build` below (a function returning (module, example_inputs)):

    modelexport compile examples/pytorch_pte.py:build -t SM8650 --precision 8a8w --calibration random -o OUT
    modelexport run OUT --random
"""
from __future__ import annotations

import sys

import torch
from torch import nn


class SmallNet(nn.Module):
    """A small conv net: 3x32x32 image in, 10 class scores out."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def build():
    torch.manual_seed(0)
    return SmallNet().eval(), (torch.randn(1, 3, 32, 32),)


def build_mlp():
    """A second model for examples/sweep.yaml: an MLP on 64 features."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    return mlp, (torch.randn(1, 64),)


def main(out: str) -> int:
    import modelexport

    module, example_inputs = build()
    # calibration: any iterable of samples in the order forward takes them (here 8 random images;
    # use real data from your own DataLoader for a real model)
    calibration = [(torch.randn(1, 3, 32, 32),) for _ in range(8)]
    bundle = modelexport.compile(module, example_inputs, output=out, target="SM8650", precision="8a8w",
                                 calibration=calibration, force=True)
    print(f"bundle: {bundle.path}")

    # the check: run the .pte on the HTP simulator and compare with eager PyTorch
    result = modelexport.run(out, inputs={"x": example_inputs[0].numpy()})   # input names: forward's arguments
    compiled = next(iter(result.outputs.values()))
    expected = module(*example_inputs).detach().numpy()
    print(f"compiled output {compiled.shape}: {compiled.ravel()[:4]} ...")
    print(f"eager output    {expected.shape}: {expected.ravel()[:4]} ...")
    print(f"same top class: {int(compiled.argmax()) == int(expected.argmax())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "pytorch-pte-out"))
