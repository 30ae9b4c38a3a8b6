"""Better 4-bit weights for the NPU graphs, computed once from the float model before export:
the data-aware rounding (`--rounding`, quant/weight_rounding.py) from the input moments of every
linear on the calibration text (one decoder layer at a time: llm/layerwise_rounding.py), and the quality recipe (`--max-ppl-ratio`, quant/precision_recipe.py)
that raises the fewest modules to 8-bit weights until the weight-quantized model's perplexity on
held-out text is within the budget.

The rounded weights are what the graphs get (saved beside the QDQ graphs and written into their
DequantizeLinear by the quantization workers), and the perplexities here are computed with those
very weights substituted into the float model: the weights' share of the fake-quant loss, measured
on text the calibration did not see.
"""
from __future__ import annotations

import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.errors import CalibrationError
from ..quant.input_moments import record_input_moments
from ..quant.precision_recipe import choose_overrides
from ..quant.weight_rounding import MIN_ROUNDING_TOKENS, ROUNDING_TOKENS, get_rounding, output_error
from .layerwise_rounding import layerwise_applies, round_layer_by_layer
from .run.text import text_windows

HELD_OUT_TOKENS = 1024        # the recipe's held-out span, after the rounding's span of the calibration text


@dataclass
class WeightPlan:
    """What the compile needs from this step: the rounded 4-bit weights file, extra overrides, and
    the manifest's record."""
    rounded_path: Path | None = None
    extra_overrides: list[str] = field(default_factory=list)
    rounding: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] | None = None


def four_bit_linears(model, base_bits: int, overrides) -> list[str]:
    """HF names of the nn.Linear modules the graphs quantize to 4 bits (overrides: first match wins)."""
    import torch
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            bits = next((o.precision.weight_bits for o in overrides if o.matches(name)), base_bits)
            if bits == 4:
                out.append(name)
    return out


def windows(ids: list[int], window: int, lead: tuple[int, ...] = ()):
    """`ids` as [1, T] tensors of `window` tokens, each begun with `lead` (run/text.dialog_start)."""
    import torch
    return [torch.tensor([w]) for w in text_windows(ids, window, list(lead))]


def perplexity(model, ids: list[int], window: int, weights: dict[str, np.ndarray] | None = None,
               lead: tuple[int, ...] = ()) -> float:
    """Perplexity of the HF model on `ids` in windows begun with `lead`, with the nn.Linear weights
    named in `weights` ({name: float [K, N] ONNX layout}) substituted for the call (as new
    parameters: a weight tied to the embedding stays the embedding's)."""
    import torch
    mods = dict(model.named_modules())
    saved = {}
    try:
        for name, w in (weights or {}).items():
            mod = mods[name]
            saved[name] = mod.weight
            mod.weight = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(w.T)).to(saved[name].dtype),
                                            requires_grad=False)
        nll, n = 0.0, 0
        with torch.inference_mode():
            for x in windows(ids, window, lead):
                logits = model(input_ids=x).logits[0, :-1].float()
                nll += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
                n += x.shape[1] - 1
        return float(np.exp(nll / max(n, 1)))
    finally:
        for name, p in saved.items():
            mods[name].weight = p


def _forward_reaching(model, names: set[str]) -> Callable:
    """The cheapest forward that runs every module in `names`: the decoder body alone when they are
    all inside it (the vocabulary projection is a fifth of SmolLM2's work per token), else the model."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else None
    prefix = next((n for n, m in model.named_modules() if m is body and n), None)
    if prefix is not None and all(n.startswith(prefix + ".") for n in names):
        return lambda m, x: body(input_ids=x)
    return lambda m, x: m(input_ids=x)


def onnx_weight(model, name: str) -> np.ndarray:
    """The nn.Linear weight as the exported MatMul holds it: [in, out]."""
    return dict(model.named_modules())[name].weight.detach().float().numpy().T


def plan_weights(model, ids: list[int], window: int, names: list[str], rounding: str, block: int,
                 out_dir: Path, max_ppl_ratio: float | None, report: Callable[[str], None],
                 override_precision: str = "16a8w", lead: tuple[int, ...] = ()) -> WeightPlan:
    """Round the 4-bit linears `names` with `rounding` (blocks of `block`, or per channel when 0),
    and with `max_ppl_ratio` choose the modules raised to `override_precision`. `ids`: the
    calibration text's tokens; every window of them begins with `lead` (run/text.dialog_start)."""

    r = get_rounding(rounding)
    plan = WeightPlan()
    n_held = HELD_OUT_TOKENS if max_ppl_ratio else 0
    data_aware = r.needs_activations or bool(max_ppl_ratio)      # the recipe ranks modules by output error
    need_min = (MIN_ROUNDING_TOKENS if data_aware else 0) + n_held // 2
    if len(ids) < need_min:
        need = (ROUNDING_TOKENS if data_aware else 0) + n_held
        what = " and ".join(x for x, on in ((f"--rounding {r.name}", r.needs_activations),
                                            ("--max-ppl-ratio (held-out text)", bool(max_ppl_ratio))) if on)
        raise CalibrationError(f"the calibration text is {len(ids)} tokens: {what} need at least {need_min} "
                               f"({need} recommended, about {int(need * 0.75)} words)",
                               "give a longer text with --calibration, or use --rounding nearest"
                               + (" without --max-ppl-ratio" if max_ppl_ratio else ""))
    # the moments' span first, the held-out span after it: never the same tokens
    span = max(min(ROUNDING_TOKENS, len(ids) - n_held), MIN_ROUNDING_TOKENS) if data_aware else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    plan.rounded_path = out_dir / "rounded_weights.npz"
    errors: dict[str, float] = {}
    deq: dict[str, np.ndarray] = {}        # the recipe's candidates: as rounded, and at 8 bits
    eight: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}

    with RoundedWeightsWriter(plan.rounded_path) as npz:
        def keep(name, w, bw, blk, h):
            npz.add(name, bw)
            sizes[name] = w.size
            if h is not None:
                errors[name] = output_error(w, bw, h, blk)
            if max_ppl_ratio:
                deq[name], eight[name] = bw.dequantized(blk), _int8_channel(w)

        layerwise = data_aware and layerwise_applies(model, names)
        if layerwise:
            report(f"rounding {len(names)} 4-bit linears ({r.name}) layer by layer on {span} tokens")
            timing = round_layer_by_layer(model, windows(ids[:span], window, lead), names, r, block,
                                          lambda n: onnx_weight(model, n), keep, report)
        else:
            timing = _round_all_at_once(model, ids[:span] if data_aware else [], window, names, r, block, keep, report,
                                        lead)
    plan.rounding = {"method": r.name, "what": r.what, "modules": len(names), "tokens": span if r.needs_activations else 0,
                     "moments_s": timing["moments_s"], "rounding_s": timing["rounding_s"],
                     "layer_by_layer": layerwise,
                     "mean_output_error_db": (round(float(10 * np.log10(np.mean(list(errors.values())))), 2)
                                              if errors else None)}
    if max_ppl_ratio:
        held = ids[span:span + HELD_OUT_TOKENS]
        report(f"choosing the modules to raise for --max-ppl-ratio {max_ppl_ratio:g} on {len(held)} held-out tokens")
        recipe = choose_overrides(
            names, errors, sizes, max_ppl_ratio,
            float_ppl=perplexity(model, held, window, lead=lead),
            quantized_ppl=lambda raised: perplexity(model, held, window, {n: (eight[n] if n in raised else deq[n])
                                                                          for n in names}, lead),
            override_precision=override_precision, n_params=sum(p.numel() for p in model.parameters()))
        recipe["held_out"] = {"tokens": len(held), "from_token": span, "text": "the calibration text after the rounding's span"}
        plan.recipe = recipe
        plan.extra_overrides = recipe["overrides"]
    return plan


def _round_all_at_once(model, ids: list[int], window: int, names: list[str], r, block: int,
                       on_rounded: Callable, report: Callable[[str], None], lead: tuple[int, ...] = ()) -> dict:
    """The rounding with every linear's input moments recorded in one pass of the whole model (when
    a 4-bit linear is outside the decoder's layers, or none needs activations: `ids` empty)."""
    t0 = time.perf_counter()
    moments = None
    if ids:
        report(f"recording the inputs of {len(names)} linears on {len(ids)} tokens")
        wanted = set(names)
        moments = record_input_moments(model, windows(ids, window, lead), _forward_reaching(model, wanted),
                                       lambda n: n in wanted)
    moments_s = time.perf_counter() - t0
    report(f"rounding {len(names)} 4-bit weights ({r.name})")
    t1 = time.perf_counter()
    floats = [onnx_weight(model, name) for name in names]
    blocks = [block if block and w.shape[0] % block == 0 else w.shape[0] for w in floats]
    hs = [moments.get(name) if moments is not None else None for name in names]
    for name, w, bw, blk, h in zip(names, floats, r.round_all(floats, hs, blocks), blocks, hs):
        on_rounded(name, w, bw, blk, h)
    return {"moments_s": round(moments_s, 2), "rounding_s": round(time.perf_counter() - t1, 2)}


class RoundedWeightsWriter:
    """The rounded weights' .npz (as np.savez writes it: `<name>|q`, `|block_scales`,
    `|channel_scale`), written one weight at a time so that none is held after its rounding."""
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.zip = zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED, allowZip64=True)
        return self

    def add(self, name: str, bw) -> None:
        for part, arr in (("q", bw.q), ("block_scales", bw.block_scales), ("channel_scale", bw.channel_scale)):
            with self.zip.open(f"{name}|{part}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)

    def __exit__(self, *exc):
        self.zip.close()


def _int8_channel(w: np.ndarray) -> np.ndarray:
    """What a 16a8w override makes of a weight: symmetric int8 per output channel, dequantized."""
    scale = np.maximum(np.abs(w).max(0) / 127.0, np.finfo(np.float32).tiny)
    return (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)
