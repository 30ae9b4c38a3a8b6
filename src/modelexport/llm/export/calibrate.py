"""Calibration for LLM decoder graphs from real text, and the calibrate stage of
the context-binary recipe (`calibrate`: an `LlmCalibration`, text and image rows).

The text is tokenized and run through the *float* static decoder (eager PyTorch) chunk by chunk,
so every sample carries the KV cache the model itself produced for the text before it: the arN
graph is calibrated on (N real tokens, their positions and mask, the real caches), and the ar1
graph on the single real token that follows each arN chunk. Random caches give ranges that make
the quantized logits useless (measured: max error 21 on logits up to 23), real ones do not.

`kv_ranges` ties each layer's cache encodings: Genie copies a graph's new key/value bytes into the
next step's cache input as they are, in every variant, so `past_key_i_in` and `_out` of every arN
graph must carry one scale and offset (Genie's model validation refuses the bundle otherwise:
"Non-identical quantization parameters found for the same tensor").
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...core.cache import Cache
from ...core.errors import CalibrationError
from ..model.input_modes import POSITION_COS, POSITION_SIN, get_input_mode, text_inputs
from ..model.mrope import ROPE_POSITION_IDS, RopePositions, rope_index
from ..model.residual_scale import residual_scale_for, watching_peak
from ..model.static_decoder import (ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder, make_attention_mask,
                              make_position_ids, new_key, new_value, past_key, past_value)
from ..run.static_runner import StaticRunner
from ..run.text import TextTokens, text_windows
from ..model.lora import set_lora
from .lora_source import LoraPlan, adapter_arrays, zero_arrays
from .weight_dtype import float32_per_module
from .plan import LlmPlan


@dataclass(frozen=True)
class WalkExtras:
    """What a calibration walk also does: record the residual stream's peak, feed LoRA adapters, begin
    each window with `lead` (run/text.dialog_start: BOS for a model that wants it first)."""
    stream_peak: dict | None = None
    lora: "LoraCalibration | None" = None
    lead: tuple[int, ...] = ()


@dataclass(frozen=True)
class LoraCalibration:
    """`--lora`: the branches on the model's linears (llm/model/lora.py) and the feeds: the base alone,
    then each adapter at full strength. The float decoder takes them in turn, call by call (the caches
    hold their effect), and every sample is then quantized with each of them. The LoRA ops stay float;
    the feeds put the adapters' effect into the ranges of what follows them."""
    plan: LoraPlan
    branches: dict
    feeds: tuple[dict, ...]

    @classmethod
    def of(cls, plan: LoraPlan | None, branches: dict) -> "LoraCalibration | None":
        if plan is None:
            return None
        return cls(plan, branches, (zero_arrays(plan.slots), *[adapter_arrays(a, plan.slots) for a in plan.adapters]))

    def feed(self, call: int) -> dict:
        return self.feeds[call % len(self.feeds)]

    def every_feed(self, samples: list[dict]) -> list[dict]:
        """Each sample once with every feed: a range set on a few tokens with the adapter missed what
        the adapter does on others (the tiny test model's q at 14 dB on a new prompt)."""
        return [{**s, **f} for s in samples for f in self.feeds]



class ImageRows:
    """A VLM's images for the decoder's calibration (`compile VLM_FOLDER`, backends/llm_qnn/vlm_calibration.py):
    windows 1, 3, 5, ... of the text get image (w // 2) mod n after their first token, as the runtime places
    an image (window 0 stays text: a walk that stops in its first window calibrates as text alone did): its
    `blocks[i]` of prompt ids (the tiles' markers and image tokens, or the family's wrap ids around them)
    with `rows[i]` [k, hidden] (the float vision part's rows of what the runtime shows the vision part) at
    its k image tokens, so the image positions' activations and the caches they leave are in the ranges.
    `grid`: (grid_thw, merge) of an M-RoPE family: an image window's positions are its M-RoPE grid
    positions (llm/model/mrope.rope_index), as at run time; text windows keep text positions."""

    def __init__(self, image_token_id: int, blocks: list[list[int]], rows: list[np.ndarray],
                 grid: tuple[tuple[int, int, int], int] | None = None):
        self.token = int(image_token_id)
        self.blocks = [list(map(int, b)) for b in blocks]
        self.rows = [np.asarray(r, np.float32) for r in rows]
        for b, r in zip(self.blocks, self.rows):
            if b.count(self.token) != len(r):
                raise CalibrationError(f"an image calibration block holds {b.count(self.token)} image tokens for "
                                       f"{len(r)} rows", "compile the VLM folder again")
        self.grid = grid
        self.windows: list[list[int]] = []
        self.window, self.k, self._rope = -1, 0, None

    @classmethod
    def load(cls, path) -> "ImageRows":
        """From vlm_calibration.write_image_rows's .npz."""
        z = np.load(path)
        n = int(z["images"])
        grid = (tuple(int(x) for x in z["grid_thw"]), int(z["spatial_merge_size"])) if "grid_thw" in z.files else None
        return cls(int(z["image_token_id"]), [z[f"ids_{i}"].tolist() for i in range(n)], [z[f"rows_{i}"] for i in range(n)], grid)

    def image_of(self, window: int) -> int | None:
        """The image in window `window` (None: a text window)."""
        return (window // 2) % len(self.blocks) if window % 2 == 1 else None

    def stream(self, token_ids: list[int], max_seq_len: int) -> list[int]:
        """The calibration ids with an image block in windows 1, 3, 5, ... (each window still max_seq_len long)."""
        self.windows = []
        i, w = 0, 0
        while i < len(token_ids):
            img = self.image_of(w)
            if img is not None:
                block = self.blocks[img]
                chunk = token_ids[i:i + max_seq_len - len(block)]
                self.windows.append(chunk[:1] + block + chunk[1:])
                i += max_seq_len - len(block)
            else:
                self.windows.append(token_ids[i:i + max_seq_len])
                i += max_seq_len
            w += 1
        return [t for window in self.windows for t in window]

    def start_call(self, position_ids) -> None:
        """A call at position 0 starts the next window."""
        if int(position_ids.min()) == 0:
            self.window, self.k, self._rope = self.window + 1, 0, None

    def rope_positions(self):
        """The current window's M-RoPE positions: its image's grid positions, text positions elsewhere."""
        if self._rope is None:
            image = self.grid is not None and self.image_of(self.window) is not None
            self._rope = rope_index(self.windows[self.window], self.token, *self.grid) if image else RopePositions.text()
        return self._rope

    def place(self, ids, embeds):
        """`embeds` [1, N, hidden] of one call's `ids` with the image tokens' rows put in, in order."""
        hits = (ids[0] == self.token).nonzero().flatten().tolist()
        img = self.image_of(self.window)
        if not hits or img is None:
            return embeds
        rows = self.rows[img]
        out = embeds.clone()
        for j in hits:
            out[0, j] = torch.from_numpy(rows[self.k]).to(out.dtype)
            self.k += 1
        return out


def calibration_samples(hf_model, token_ids: list[int], variants: list[int], max_seq_len: int,
                        samples_per_variant: int, kv_ranges: dict[str, list[float]] | None = None,
                        images: ImageRows | None = None, extras: WalkExtras | None = None) -> dict[int, list[dict[str, np.ndarray]]]:
    """{N: [flat input dict of the full decoder]} recorded from the float decoder on real text.

    The text is walked in windows of `max_seq_len`; in each window chunks of the largest N are
    fed, and after each one a single token through every smaller N, all with the real cache.
    `kv_ranges`, when given, is filled with one [min, max] per layer's keys and per layer's values,
    over every cache the text produced (inputs and outputs of every variant), under both names.
    `images`: the text is first given image blocks (ImageRows.stream) and each sample records the
    `inputs_embeds` the decoder saw, image rows included (with_input_mode keeps them). `extras`: its
    `stream_peak` gets the residual stream's largest |x| as "max" (llm/model/residual_scale.py); with its
    `lora`, each call runs with its turn's LoRA feed, and each sample is kept with every feed."""
    extras = extras or WalkExtras()
    stream_peak, lora = extras.stream_peak, extras.lora
    big = max(variants)
    dec = build_static_decoder(hf_model, StaticDecoderConfig(big, max_seq_len), rms_norm=ONNX_RMS_NORM)
    names = dec.input_names()
    out: dict[int, list[dict[str, np.ndarray]]] = {n: [] for n in variants}
    recording: dict[str, int] = {"n": 0, "calls": 0}

    placed: dict[str, object] = {}
    hook = None
    lead = extras.lead
    if images is not None:
        # the image blocks sit at fixed places in windows of max_seq_len text tokens (ImageRows.stream)
        token_ids, lead = images.stream(token_ids, max_seq_len), ()
        # the embeddings entering layer 0 (the family's scale applied) with the image rows in; the
        # module is the HF model's own (shared): the hook is removed when the walk ends
        hook = dec.model.embed_tokens.register_forward_hook(lambda mod, args, y: placed.get("embeds", y))

    def graph(*inputs):
        n = recording["n"]
        if images is not None:
            images.start_call(inputs[1])     # the runner's (input_ids, position_ids, mask, *caches)
            dec.rope_positions = images.rope_positions()
        inputs = dec.graph_inputs(inputs)   # M-RoPE decoders: the window's positions on three axes (llm/model/mrope.py)
        named = dict(zip(names, inputs))
        if images is not None:
            placed.pop("embeds", None)
            with torch.inference_mode():
                placed["embeds"] = images.place(named["input_ids"], dec.lookup(named["input_ids"]))
        feed = lora.feed(recording["calls"]) if lora is not None else None
        recording["calls"] += 1
        if len(out[n]) < samples_per_variant:
            out[n].append({k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in zip(names, inputs)})
            if images is not None:
                out[n][-1]["inputs_embeds"] = np.ascontiguousarray(placed["embeds"].float().cpu().numpy())
            out[n][-1].update(feed or {})
        if lora is not None:
            set_lora(lora.branches, lora.plan.slots, feed)
        with torch.inference_mode():
            outputs = dec(*inputs)
        if kv_ranges is not None:
            _widen(kv_ranges, outputs[1:], dec.spec.n_layers)
        return outputs

    try:
        with float32_per_module(dec), watching_peak(dec.model, stream_peak if stream_peak is not None else {}):
            # a bf16-held model runs one float32 layer at a time
            _walk(StaticRunner({n: graph for n in variants}, dec.spec, max_seq_len),
                  text_windows(token_ids, max_seq_len, list(lead)), variants, samples_per_variant, out, recording)
    finally:
        if hook is not None:
            hook.remove()
        if lora is not None:
            set_lora(lora.branches, lora.plan.slots, None)
    return {n: _graph_samples(out[n], n, max_seq_len, lora) for n in variants}


def _graph_samples(samples: list[dict], n: int, max_seq_len: int, lora: LoraCalibration | None) -> list[dict]:
    """One variant's recorded samples as its graphs' inputs: caches cut to max_seq_len - N entries,
    each sample once per LoRA feed."""
    if not samples:
        raise CalibrationError(f"the calibration text gave no samples for ar{n}",
                               f"give a longer text (at least {max_seq_len} tokens)")
    c = max_seq_len - n
    for s in samples:
        for k in list(s):
            if k.startswith("past_key_"):
                s[k] = np.ascontiguousarray(s[k][..., :c])
            elif k.startswith("past_value_"):
                s[k] = np.ascontiguousarray(s[k][:, :, :c, :])
    return lora.every_feed(samples) if lora is not None else samples


def _walk(runner, windows: list[list[int]], variants, samples_per_variant, out, recording) -> None:
    big, small = max(variants), sorted(v for v in variants if v != max(variants))
    max_seq_len = runner.max_seq_len
    step = big + len(small)
    for window in windows:
        if len(window) < step or not any(len(out[n]) < samples_per_variant for n in variants):
            break
        runner.reset()
        i = 0
        while (i + step <= len(window) and runner.past_len + big <= max_seq_len - max(1, len(small))
               and any(len(out[n]) < samples_per_variant for n in variants)):
            recording["n"] = big
            runner.run_chunk(window[i:i + big], big)
            i += big
            for n in small:
                if runner.past_len > max_seq_len - n:
                    break
                recording["n"] = n
                runner.run_chunk(window[i:i + n], n)
                i += n


def _widen(ranges: dict[str, list[float]], new_kv, n_layers: int) -> None:
    """Widen each layer's tied key and value range by this step's new keys and values (every cache
    entry was a new key once, so these cover the caches too)."""
    for i in range(n_layers):
        for (cache_in, cache_out), t in (((past_key(i), new_key(i)), new_kv[i]),
                                         ((past_value(i), new_value(i)), new_kv[n_layers + i])):
            lo, hi = float(t.min()), float(t.max())
            r = ranges.setdefault(cache_in, [0.0, 0.0])   # 0 inside: empty cache slots are zeros
            r[0], r[1] = min(r[0], lo), max(r[1], hi)
            ranges[cache_out] = r


def full_context_samples(token_ids: list[int], max_seq_len: int, n_samples: int,
                         lora: LoraCalibration | None = None, lead: tuple[int, ...] = ()) -> list[dict[str, np.ndarray]]:
    """Samples of the full-context graph: whole windows of the text begun with `lead`, positions 0 .. C-1,
    causal (with the LoRA feeds in turn)."""
    cfg = StaticDecoderConfig.full_context(max_seq_len)
    windows = [w for w in text_windows(token_ids, max_seq_len, list(lead)) if len(w) == max_seq_len][:n_samples]
    if not windows:
        raise CalibrationError(f"the calibration text gave no sample for the full-context graph ({max_seq_len} tokens)",
                               f"give a longer text (at least {max_seq_len} tokens)")
    return [{"input_ids": np.array([w], np.int32), "position_ids": make_position_ids(cfg, 0).numpy(),
             "attention_mask": make_attention_mask(cfg, 0).numpy(), **(lora.feed(i) if lora else {})}
            for i, w in enumerate(windows)]


def with_input_mode(samples: list[dict[str, np.ndarray]], mode, lookup, hidden_size: int) -> list[dict[str, np.ndarray]]:
    """Token samples as the input mode's decoder takes them (llm/model/input_modes.text_inputs); `lookup`:
    ids → the float decoder's embeddings. A sample that recorded its `inputs_embeds` (image rows in
    them: ImageRows) keeps them."""
    if mode.decoder_inputs == ("input_ids",):
        return samples
    return [{**text_inputs(mode, s["input_ids"], lookup, hidden_size),
             **{k: v for k, v in s.items() if k != "input_ids"}} for s in samples]


def with_positions(samples: list[dict[str, np.ndarray]], dec) -> list[dict[str, np.ndarray]]:
    """Samples as a `--positions cos-sin` decoder takes them: RoPE's cos and sin of each sample's
    position_ids (the rows its float graph would gather) in their place; others as they are."""
    if not dec.cos_sin:
        return samples
    out = []
    for s in samples:
        with torch.inference_mode():
            cos, sin = dec.cos_sin_of(torch.from_numpy(s["position_ids"]))
        out.append({**{k: v for k, v in s.items() if k != "position_ids"},
                    POSITION_COS: np.ascontiguousarray(cos.float().numpy()),
                    POSITION_SIN: np.ascontiguousarray(sin.float().numpy())})
    return out


def part_samples(samples: list[dict[str, np.ndarray]], part, hidden: list[np.ndarray] | None,
                 first_inputs: tuple[str, ...] = ("input_ids",), lora: tuple[str, ...] = ()) -> list[dict[str, np.ndarray]]:
    """The inputs of one layer range: its own caches (none in a full-context sample), the hidden
    states entering it (the input mode's `first_inputs` for the first part) and its LoRA inputs `lora`."""
    out = []
    for j, s in enumerate(samples):
        d = {k: s[k] for k in ("position_ids", ROPE_POSITION_IDS, POSITION_COS, POSITION_SIN, "attention_mask") if k in s}
        if part.is_first:
            d.update({k: s[k] for k in first_inputs})
        else:
            d["hidden_states"] = hidden[j]
        for i in part.layers():
            if past_key(i) in s:
                d[past_key(i)] = s[past_key(i)]
        for i in part.layers():
            if past_value(i) in s:
                d[past_value(i)] = s[past_value(i)]
        d.update({k: s[k] for k in lora})
        out.append(d)
    return out


@dataclass(frozen=True)
class LlmCalibration:
    """The calibrate stage's hand-off. `samples` ({(N, C): token inputs of the full decoder}) is handed
    over: the graphs stage takes each variant's out of it (with their caches they are the largest
    thing the parent holds). `kv_ranges`: one tied range per layer's cache (Genie); `residual_scale`:
    the residual stream's (llm/model/residual_scale.py); `counts`: samples per variant, for the manifest."""
    samples: dict[tuple[int, int], list[dict[str, np.ndarray]]]
    kv_ranges: dict[str, list[float]]
    residual_scale: float
    seconds: float
    counts: dict[str, int]


def calibrate(model, text: TextTokens, plan: LlmPlan, needed: bool, image_calibration: str | None,  # noqa: PLR0913
              done_entries: list, report: Callable[[str], None], lora_branches: dict | None = None) -> LlmCalibration:
    """Samples of every graph, {(N, C): ...}, from the text run through the float decoder (none when every
    graph was quantized before: `needed` False), the VLM's image rows placed in them for `--inputs
    embeddings`. Each context length C walks the text in windows of C tokens; the caches' tied ranges
    widen over all of them (one range per layer's cache serves every graph)."""
    t1 = time.perf_counter()
    ids, lead = text.ids, text.lead
    max_seq_len, kv_ranges, stream_peak = plan.max_seq_len, {}, {}
    samples: dict[tuple[int, int], list] = {k: [] for k in plan.shapes}
    if needed:
        report(f"calibrating on {plan.text.path.name} through the float decoder")
        images = _image_rows(image_calibration, plan.inputs, report)
        lora = LoraCalibration.of(plan.lora, lora_branches or {})
        for c in reversed(plan.lengths):
            cached = [n for n, cl in plan.shapes if cl == c and n != c]
            got = calibration_samples(model, ids, cached, c, plan.n_samples, kv_ranges, images,
                                      WalkExtras(stream_peak, lora, lead))
            samples.update({(n, c): got[n] for n in cached})
        if max_seq_len in plan.variants:      # the full-context graph: whole windows, no cache
            samples[(max_seq_len, max_seq_len)] = full_context_samples(ids, max_seq_len, plan.n_samples, lora, lead)
    seconds = round(time.perf_counter() - t1, 2)
    scale = residual_scale(stream_peak, done_entries, report)
    return LlmCalibration(samples, kv_ranges, scale, seconds,
                          {sample_key(n, c, max_seq_len): len(v) for (n, c), v in samples.items()})


def sample_key(n: int, c: int, max_seq_len: int) -> str:
    """The manifest's name of a graph's sample count: "N" at the context, "N_clC" at a shorter length."""
    return str(n) if c == max_seq_len else f"{n}_cl{c}"


def _image_rows(image_calibration: str | None, inputs: str, report) -> ImageRows | None:
    if not image_calibration or get_input_mode(inputs).name != "embeddings":   # `both` feeds rows beside ids
        return None
    images = ImageRows.load(image_calibration)
    report(f"calibrating with {len(images.rows)} images' vision rows at image tokens in every other window"
           + (" (at their M-RoPE grid positions)" if images.grid else ""))
    return images


def residual_scale(stream_peak: dict, done_entries: list, report) -> float:
    """The residual stream's scale (llm/model/residual_scale.py): from this calibration's peak, or, when every
    graph was quantized before (no calibration ran), the one those graphs were exported with."""
    if "max" not in stream_peak:
        return float(next((Cache.meta(e).get("residual_scale", 1.0) for e in done_entries if e), 1.0))
    scale = residual_scale_for(stream_peak["max"])
    if scale != 1.0:
        report(f"carrying the residual stream at 1/{scale:g} in the graphs: it peaks at {stream_peak['max']:,.0f} on "
               "the calibration text, beyond what fp16 on the HTP holds with room to spare")
    return scale
