"""LoRA branches on the decoder's linears, fed as graph inputs (llm/export/lora_source.py has the slots).

Each adapted linear gets a `lora` child: y + (x @ A) @ B, with A [in, R] and B [R, out] set for a call
(`set_lora`), the base output unchanged when none is set. A forward hook on the linear calls it, so the
same module adds the branch in eager PyTorch (calibration, the reference) and in the ONNX export (its
ops are named `/layers.3/self_attn/lora_1/MatMul`: quant/llm_graphs.FLOAT_NODES keeps them float, fp16 on
the HTP).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from ..export.lora_source import LoraSlots


class LoraBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a: torch.Tensor | None = None
        self.b: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.a is None:
            return y
        # A and B come in as float16 (the graph inputs' type: Genie fills LoRA inputs of float16, not
        # float32); the branch computes in the layer's type
        a, b = (t if t.dtype == x.dtype else t.to(x.dtype) for t in (self.a, self.b))
        d = torch.matmul(torch.matmul(x, a), b)
        return y + (d if d.dtype == y.dtype else d.to(y.dtype))


def _hook(linear: nn.Module, args, y):
    return linear.lora(args[0], y)


def install_lora(hf_model: nn.Module, slots: LoraSlots | None) -> dict[str, LoraBranch]:
    """A branch on each of `slots`' linears of `hf_model` (HF's module paths, kept until the model goes);
    {input name of A or B: its branch}. Nothing when `slots` is None."""
    if slots is None:
        return {}
    branches = {}
    for t in slots.targets:
        linear = _linear(hf_model, t)
        linear.lora = LoraBranch()
        linear._lora_hook = linear.register_forward_hook(_hook)
        branches[t.a_name] = branches[t.b_name] = linear.lora
    return branches


@contextmanager
def lora_branches(hf_model: nn.Module, slots: LoraSlots | None) -> Iterator[dict[str, LoraBranch]]:
    """`install_lora` while inside; the linears as they were after."""
    branches = install_lora(hf_model, slots)
    try:
        yield branches
    finally:
        for t in slots.targets if slots else ():
            linear = _linear(hf_model, t)
            linear._lora_hook.remove()
            del linear.lora, linear._lora_hook


def _linear(hf_model: nn.Module, t) -> nn.Module:
    inner = hf_model.model if hasattr(hf_model, "model") else hf_model
    return inner.layers[t.layer].get_submodule(t.module)


def set_lora(branches: dict[str, LoraBranch], slots: LoraSlots | None, values: dict | None) -> None:
    """Set the A and B of the branches `values` names ({input name: array or tensor}: a part's layers,
    or all); None clears every branch."""
    if slots is None:
        return
    for t in slots.targets:
        br = branches[t.a_name]
        if values is None:
            br.a = br.b = None
        elif t.a_name in values:
            br.a, br.b = _tensor(values[t.a_name]), _tensor(values[t.b_name])


def _tensor(v) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
