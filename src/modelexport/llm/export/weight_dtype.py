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


class _Scratch:
    """Float32 buffers reused from one module's lift to the next (the layers share shapes): a fresh
    allocation per layer and forward cost more than the conversion itself (a 1B calibration: 16
    forwards, each lifting 4.3 GB)."""
    def __init__(self):
        self.free: dict[tuple, list[torch.Tensor]] = {}

    def take(self, shape: torch.Size) -> torch.Tensor:
        pool = self.free.get(tuple(shape))
        return pool.pop() if pool else torch.empty(shape, dtype=torch.float32)

    def give(self, t: torch.Tensor) -> None:
        self.free.setdefault(tuple(t.shape), []).append(t)


# outside inference mode: a parameter's data made inside it (calibration runs there) could not be
# traced by the ONNX export later
def _lift(params: list[nn.Parameter], scratch: _Scratch | None = None) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """Each bf16 parameter's data in float32; returns (parameter, its bf16 data) to put back."""
    lifted = []
    with torch.inference_mode(False), torch.no_grad():
        for p in params:
            if p.dtype != _STORED:
                continue
            lifted.append((p, p.data))
            p.data = scratch.take(p.shape).copy_(p.data) if scratch else p.data.float()
    return lifted


def _restore(lifted: list[tuple[nn.Parameter, torch.Tensor]], scratch: _Scratch | None = None) -> None:
    """The bf16 data back as it was (no conversion: every float32 value came from it)."""
    with torch.inference_mode(False), torch.no_grad():
        for p, stored in lifted:
            if scratch:
                scratch.give(p.data)
            p.data = stored


@contextmanager
def in_float32(modules: Iterable[nn.Module], skip: frozenset[int] = frozenset()) -> Iterator[None]:
    """These modules' bf16 parameters in float32 for the block (export, a forward of one part);
    `skip`: ids of parameters left as they are (the export gives Linear weights their own copy)."""
    lifted = _lift([p for p in _params(modules) if id(p) not in skip])
    try:
        yield
    finally:
        _restore(lifted)


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
    lifted: dict[int, list[tuple[nn.Parameter, torch.Tensor]]] = {}
    scratch = _Scratch()

    def before(m, args):
        lifted[id(m)] = _lift(_params([m]), scratch)
        return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def after(m, args, out):
        _restore(lifted.pop(id(m), []), scratch)

    handles = [h for m in mods for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for ps in lifted.values():
            _restore(ps, scratch)
