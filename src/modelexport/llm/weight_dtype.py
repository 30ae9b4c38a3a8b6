"""The float model held in bf16 while it is only a weight source, float32 where it computes.

The frontends load a float32 HF model: 4 bytes a parameter, 4.3 GB for a 1B model, 12 GB for a 3B
one, held for the whole export. When the source stores bf16 (most HF checkpoints), its parameters go
back to bf16 right after loading (lossless: every value came from bf16) and each part is lifted to
float32 only while it is exported or run (calibration, the hidden states entering the next part):
the host holds the model at 2 bytes a parameter plus one part in float32. Buffers stay float32 (the
RoPE `inv_freq` must not be rounded).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

_STORED = torch.bfloat16


def store_bf16(model: nn.Module, source_dtype: str) -> bool:
    """Parameters to bf16 when the source stored them so; True when it did."""
    if source_dtype not in ("bfloat16", "torch.bfloat16"):
        return False
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == torch.float32:
                p.data = p.data.to(_STORED)
    return True


def _params(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


# outside inference mode: a parameter's data made inside it (calibration runs there) could not be
# traced by the ONNX export later
def _lift(params: list[nn.Parameter]) -> list[nn.Parameter]:
    lifted = [p for p in params if p.dtype == _STORED]
    with torch.inference_mode(False), torch.no_grad():
        for p in lifted:
            p.data = p.data.float()
    return lifted


def _lower(params: list[nn.Parameter]) -> None:
    with torch.inference_mode(False), torch.no_grad():
        for p in params:
            p.data = p.data.to(_STORED)


@contextmanager
def in_float32(modules: Iterable[nn.Module], skip: frozenset[int] = frozenset()) -> Iterator[None]:
    """These modules' bf16 parameters in float32 for the block (export, a forward of one part);
    `skip`: ids of parameters left as they are (the export gives Linear weights their own copy)."""
    lifted = _lift([p for p in _params(modules) if id(p) not in skip])
    try:
        yield
    finally:
        _lower(lifted)


def part_modules(decoder, part) -> list[nn.Module]:
    """The modules one part of a static decoder runs (onnx_export.DecoderPart)."""
    mods: list[nn.Module] = [decoder.model.layers[i] for i in part.layers()]
    if part.is_first:
        mods.append(decoder.model.embed_tokens)
    if part.is_last:
        mods += [decoder.model.norm, decoder.lm_head]
    return mods


@contextmanager
def float32_per_module(decoder) -> Iterator[None]:
    """While the block runs the whole decoder (calibration), each module is lifted to float32 just
    for its own forward: one layer in float32 at a time."""
    mods = [decoder.model.embed_tokens, *decoder.model.layers, decoder.model.norm, decoder.lm_head]
    if not any(p.dtype == _STORED for p in decoder.parameters()):
        yield
        return
    lifted: dict[int, list[nn.Parameter]] = {}

    def before(m, args):
        lifted[id(m)] = _lift(_params([m]))
        return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def after(m, args, out):
        _lower(lifted.pop(id(m), []))

    handles = [h for m in mods for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for ps in lifted.values():
            _lower(ps)
