"""Second moments of every linear layer's input (X^T X, the Hessian of ||W x - W' x||^2), recorded
with forward hooks while real text runs through the float model.

Linears that read the very same tensor (q/k/v, gate/up) share one accumulator: the moment is the
same, and one copy of a 1536x1536 matrix per layer is what keeps SmolLM2's ~400 MB from tripling.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable


@dataclass
class InputMoments:
    """{module name: X^T X (float32 torch [K, K])} over `tokens` input rows."""
    hessians: dict = field(default_factory=dict)
    tokens: int = 0

    def get(self, name: str):
        return self.hessians.get(name)


def record_input_moments(model, batches: Iterable, run: Callable, wanted: Callable[[str], bool],
                         count: Callable = lambda batch: int(batch.numel())) -> InputMoments:
    """Run `run(model, batch)` for each batch with hooks on the nn.Linear modules whose name
    `wanted` accepts; returns their input moments (every row of every batch counted; `count`:
    a batch's tokens, token ids by default)."""
    import torch

    out = InputMoments()
    # (data_ptr, shape) seen in this call → (the module that owns it, the tensor: held so that its
    # memory is not reused by a later layer's input of the same shape within the call)
    shared: dict[tuple, tuple] = {}
    handles = []

    def hook_for(name):
        def hook(_mod, args):
            x = args[0].detach()
            x2 = x.reshape(-1, x.shape[-1]).float()
            key = (x.data_ptr(), tuple(x.shape))
            if key in shared:           # same tensor as an earlier linear in this call: alias
                out.hessians[name] = out.hessians[shared[key][0]]
                return
            shared[key] = (name, x)
            h = out.hessians.get(name)
            if h is None:
                out.hessians[name] = x2.T @ x2
            else:
                h.addmm_(x2.T, x2)
        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and wanted(name):
            handles.append(mod.register_forward_pre_hook(hook_for(name)))
    try:
        with torch.inference_mode():
            for batch in batches:
                shared.clear()
                run(model, batch)
                out.tokens += count(batch)
    finally:
        for h in handles:
            h.remove()
    return out
