"""The data-aware 4-bit rounding of a decoder's linears, one decoder layer at a time.

GPTQ needs X^T X of every rounded linear's input. Recorded for the whole model at once, those are
0.4 GB for SmolLM2-135M and 4.8 GB for a Llama-3.2-1B (its down_proj inputs are 8192 wide). Here
the calibration text's hidden states are kept between layers instead (2048 tokens x 2048 x 4 B =
16 MB for the 1B) and each layer is run by itself on them: its linears' moments are recorded, the
linears rounded with the same functions, the moments dropped, and the layer's output is the next
layer's input. Layers are rounded together while their moments fit `WINDOW_BYTES`, so that GPTQ's
batching over matrices of one shape still pays on small models (SmolLM2: 2 windows of ~15 layers).

The layer inputs are the float model's (as the whole-model hooks see them), not those of the
layers already rounded: the result is the same rounding as the all-at-once path's. A bf16-held
model is lifted to float32 one layer at a time (llm/export/weight_dtype.py), and its hidden states are
float32 throughout.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

# the moments of the layers rounded together; a 1B layer's (319 MB) is rounded alone
WINDOW_BYTES = 256 * 2**20


def held_moments_bytes(shape: dict) -> int | None:
    """The most input-moment bytes the layer-by-layer rounding holds at once, from the config's
    shape: the layers of one window (a window closes at WINDOW_BYTES; a 1B layer is one alone)."""
    from ..quant.weight_rounding import layer_moments_bytes
    one = layer_moments_bytes(shape)
    try:
        layers = int(shape["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return None
    return None if one is None else min(layers, -(-WINDOW_BYTES // one)) * one


def rounding_bytes(shape: dict) -> int | None:
    """Host bytes the layer-by-layer GPTQ adds over the model (the up-front estimate's `round`
    phase): the moments held (and as much again: the layer's float32 lift, the hooks' inputs, the
    error statistics), GPTQ's batch of one shape (3 float32 copies), and the float32 work on the
    widest H (the reversed copy, its Cholesky factor, the flipped inverse: 3 copies at the most, a
    1B down_proj's 8192^2 0.8 GB; 1.6 GB in float64 before). Fit to bench/experiments/llm_rounding.py on
    SmolLM2 and the Llama-3.2-1B shape (docs/llm_export.md, "4-bit weights"); the float32 term is
    counted, not yet measured."""
    from ..quant.gptq import BATCH_ELEMENTS
    held = held_moments_bytes(shape)
    if held is None:
        return None
    widest = max(int(shape["hidden_size"]), int(shape["intermediate_size"]))
    return 2 * held + 3 * 4 * BATCH_ELEMENTS + 3 * 4 * widest * widest


@dataclass
class LayerInputs:
    """One calibration window entering a decoder layer: its hidden states [1, T, hidden] (float32)
    and, per layer, the keyword arguments the decoder gives that layer (mask, rotary tables, ...;
    shared objects, so holding them costs nothing per layer)."""
    hidden: object
    kwargs: list[dict]


class _Captured(Exception):
    pass


def decoder_layers(model) -> tuple[object, str] | None:
    """(the decoder's layer list, its module name) of an HF causal LM, or None."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(body, "layers", None)
    if layers is None:
        return None
    name = next((n for n, m in model.named_modules() if m is layers), None)
    return (layers, name) if name else None


def capture_layer_inputs(model, batches) -> list[LayerInputs]:
    """Run each batch of token ids into the decoder with its layers standing aside: the first
    layer's hidden states (the embedding's output, in float32) and every layer's own keyword
    arguments, without computing any layer (nor the vocabulary projection)."""
    import torch

    layers, _ = decoder_layers(model)
    body = model.get_decoder()
    out: list[LayerInputs] = []
    current: dict = {}

    def stand_in(i):
        def forward(hidden, *args, **kwargs):
            if args:
                raise ValueError(f"decoder layer {i} was given positional arguments beyond the hidden states")
            if i == 0:
                current["hidden"] = hidden.detach().float()
            current["kwargs"].append(kwargs)
            if i == len(layers) - 1:
                raise _Captured
            return hidden
        return forward

    # a bf16-held embedding gives bf16 rows; in float32 they are exactly the float32 model's, and
    # the rotary tables the decoder derives from them are computed in float32 as well
    to_float = body.embed_tokens.register_forward_hook(lambda _m, _a, o: o.float())
    for i, layer in enumerate(layers):
        layer.forward = stand_in(i)
    try:
        with torch.inference_mode():
            for x in batches:
                current.clear()
                current["kwargs"] = []
                try:
                    body(input_ids=x, use_cache=False)
                except _Captured:
                    pass
                out.append(LayerInputs(current["hidden"], current["kwargs"]))
    finally:
        to_float.remove()
        for layer in layers:
            del layer.forward
    return out


def _layer_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def round_layer_by_layer(model, batches, names: list[str], rounding, block: int, weight_of: Callable,
                         on_rounded: Callable, report: Callable[[str], None] = lambda m: None,
                         window_bytes: int = WINDOW_BYTES) -> dict:
    """Round the linears `names` (all inside the decoder's layers) with `rounding` (weight_rounding.
    Rounding), each window of layers once its moments are recorded; `weight_of(name)`: the float
    weight [K, N] as the graph's MatMul holds it; `on_rounded(name, float weight
    [K, N], BlockWeight, block, H)` is called for each before the window's moments are dropped.
    Returns {tokens: the moments' tokens, moments_s: the layers' passes, rounding_s}."""
    from ..quant.input_moments import record_input_moments
    from .export.weight_dtype import in_float32

    layers, prefix = decoder_layers(model)
    per_layer = [[n for n in names if n.startswith(f"{prefix}.{i}.")] for i in range(len(layers))]
    last = max(i for i, ns in enumerate(per_layer) if ns)
    inputs = capture_layer_inputs(model, batches)
    tokens = sum(int(b.hidden.shape[:-1].numel()) for b in inputs)
    window: list[tuple[str, object]] = []       # (name, H) recorded and not yet rounded
    held = 0
    secs = {"moments_s": 0.0, "rounding_s": 0.0}

    def flush():
        nonlocal held
        t = time.perf_counter()
        floats = [weight_of(n) for n, _ in window]
        blocks = [block if block and w.shape[0] % block == 0 else w.shape[0] for w in floats]
        hs = [h for _, h in window]
        for (n, h), w, bw, blk in zip(window, floats, rounding.round_all(floats, hs, blocks), blocks):
            on_rounded(n, w, bw, blk, h)
        window.clear()
        held = 0
        secs["rounding_s"] += time.perf_counter() - t

    for i in range(last + 1):
        layer, lp = layers[i], f"{prefix}.{i}."
        mine = set(per_layer[i])
        nxt = []
        t = time.perf_counter()
        with in_float32([layer]):
            def run(mod, b, i=i):
                nxt.append(_layer_output(mod(b.hidden, **b.kwargs[i])))
            moments = record_input_moments(layer, inputs, run, lambda n: lp + n in mine,
                                           count=lambda b: int(b.hidden.shape[:-1].numel()))
        for b, h in zip(inputs, nxt):
            b.hidden = h
        secs["moments_s"] += time.perf_counter() - t
        seen = set()
        for rel, h in moments.hessians.items():
            window.append((lp + rel, h))
            if id(h) not in seen:
                seen.add(id(h))
                held += h.numel() * h.element_size()
        del moments
        if window and (held >= window_bytes or i == last):
            report(f"rounding the 4-bit linears of layers up to {i + 1} of {last + 1}")
            flush()
    return {"tokens": tokens, **{k: round(v, 2) for k, v in secs.items()}}


def layerwise_applies(model, names: list[str]) -> bool:
    """True when every name is a linear inside the decoder's layers (the embedding and the
    vocabulary projection are 8-bit by default, and rounded by the whole-model path if asked 4-bit)."""
    found = decoder_layers(model)
    if found is None or not names:
        return False
    _, prefix = found
    return all(n.startswith(prefix + ".") for n in names)
