"""Calibration for LLM decoder graphs from real text.

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


import numpy as np

from ...core.errors import CalibrationError
from ...llm.mrope import ROPE_POSITION_IDS
from ...llm.static_decoder import new_key, new_value, past_key, past_value



class ImageRows:
    """A VLM's vision rows for the decoder's calibration (`compile VLM_FOLDER`): windows 1, 3, 5, ... of
    the text get one image's rows at image tokens after their first token, as the runtime places them
    (window 0 stays text: a walk that stops in its first window calibrates as text alone did)
    (llm/vision_inputs.image_prompt_ids), so the image positions' activations and the caches they
    leave are in the ranges. `rows` [n_images, tokens_per_image, hidden]: the float vision part's
    output on the calibration photos."""

    def __init__(self, image_token_id: int, rows: np.ndarray):
        self.token = int(image_token_id)
        self.rows = np.asarray(rows, np.float32)
        self.window, self.k = -1, 0

    def stream(self, token_ids: list[int], max_seq_len: int) -> list[int]:
        """The calibration ids with an image block in windows 1, 3, 5, ... (each window still max_seq_len long)."""
        t = self.rows.shape[1]
        out, i, w = [], 0, 0
        while i < len(token_ids):
            if w % 2 == 1:
                chunk = token_ids[i:i + max_seq_len - t]
                out += chunk[:1] + [self.token] * t + chunk[1:]
                i += max_seq_len - t
            else:
                out += token_ids[i:i + max_seq_len]
                i += max_seq_len
            w += 1
        return out

    def place(self, ids, position_ids, embeds):
        """`embeds` [1, N, hidden] of one call's `ids` with the image tokens' rows put in, in order;
        a call at position 0 starts a new window."""
        import torch
        if int(position_ids.min()) == 0:
            self.window, self.k = self.window + 1, 0
        hits = (ids[0] == self.token).nonzero().flatten().tolist()
        if not hits:
            return embeds
        rows = self.rows[(self.window // 2) % len(self.rows)]   # windows 1, 3, 5 → images 0, 1, 2
        out = embeds.clone()
        for j in hits:
            out[0, j] = torch.from_numpy(rows[self.k]).to(out.dtype)
            self.k += 1
        return out


def calibration_samples(hf_model, token_ids: list[int], variants: list[int], max_seq_len: int,
                        samples_per_variant: int, kv_ranges: dict[str, list[float]] | None = None,
                        images: ImageRows | None = None) -> dict[int, list[dict[str, np.ndarray]]]:
    """{N: [flat input dict of the full decoder]} recorded from the float decoder on real text.

    The text is walked in windows of `max_seq_len`; in each window chunks of the largest N are
    fed, and after each one a single token through every smaller N, all with the real cache.
    `kv_ranges`, when given, is filled with one [min, max] per layer's keys and per layer's values,
    over every cache the text produced (inputs and outputs of every variant), under both names.
    `images`: the text is first given image blocks (ImageRows.stream) and each sample records the
    `inputs_embeds` the decoder saw, image rows included (with_input_mode keeps them)."""
    import torch

    from ...llm.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder
    from ...llm.static_runner import StaticRunner
    from ...llm.weight_dtype import float32_per_module
    big = max(variants)
    dec = build_static_decoder(hf_model, StaticDecoderConfig(big, max_seq_len), rms_norm=ONNX_RMS_NORM)
    names = dec.input_names()
    out: dict[int, list[dict[str, np.ndarray]]] = {n: [] for n in variants}
    recording: dict[str, int] = {"n": 0}

    placed: dict[str, object] = {}
    hook = None
    if images is not None:
        token_ids = images.stream(token_ids, max_seq_len)
        # the embeddings entering layer 0 (the family's scale applied) with the image rows in; the
        # module is the HF model's own (shared): the hook is removed when the walk ends
        hook = dec.model.embed_tokens.register_forward_hook(lambda mod, args, y: placed.get("embeds", y))

    def graph(*inputs):
        n = recording["n"]
        slots = inputs[1]                     # the runner's (input_ids, position_ids, mask, *caches)
        inputs = dec.graph_inputs(inputs)   # M-RoPE decoders: text positions on every axis (llm/mrope.py)
        named = dict(zip(names, inputs))
        if images is not None:
            placed.pop("embeds", None)
            with torch.inference_mode():
                placed["embeds"] = images.place(named["input_ids"], slots, dec.lookup(named["input_ids"]))
        if len(out[n]) < samples_per_variant:
            out[n].append({k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in zip(names, inputs)})
            if images is not None:
                out[n][-1]["inputs_embeds"] = np.ascontiguousarray(placed["embeds"].float().cpu().numpy())
        with torch.inference_mode():
            outputs = dec(*inputs)
        if kv_ranges is not None:
            _widen(kv_ranges, outputs[1:], dec.spec.n_layers)
        return outputs

    try:
        with float32_per_module(dec):   # a bf16-held model runs one float32 layer at a time
            _walk(StaticRunner({n: graph for n in variants}, dec.spec, max_seq_len), token_ids, variants, max_seq_len,
                  samples_per_variant, out, recording)
    finally:
        if hook is not None:
            hook.remove()
    for n in variants:
        if not out[n]:
            raise CalibrationError(f"the calibration text gave no samples for ar{n}",
                                   f"give a longer text (at least {max_seq_len} tokens)")
    # the graphs' own inputs: each variant's cache length is max_seq_len - N
    for n in variants:
        c = max_seq_len - n
        for s in out[n]:
            for k in list(s):
                if k.startswith("past_key_"):
                    s[k] = np.ascontiguousarray(s[k][..., :c])
                elif k.startswith("past_value_"):
                    s[k] = np.ascontiguousarray(s[k][:, :, :c, :])
    return out


def _walk(runner, token_ids, variants, max_seq_len, samples_per_variant, out, recording) -> None:
    big, small = max(variants), sorted(v for v in variants if v != max(variants))
    pos = 0
    step = big + len(small)
    while any(len(out[n]) < samples_per_variant for n in variants):
        window = token_ids[pos:pos + max_seq_len]
        if len(window) < step:
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
        pos += max_seq_len


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


def full_context_samples(token_ids: list[int], max_seq_len: int, n_samples: int) -> list[dict[str, np.ndarray]]:
    """Samples of the full-context graph: whole windows of the text, positions 0 .. C-1, causal."""
    from ...llm.static_decoder import StaticDecoderConfig, make_attention_mask, make_position_ids
    cfg = StaticDecoderConfig.full_context(max_seq_len)
    windows = [token_ids[i:i + max_seq_len] for i in range(0, len(token_ids) - max_seq_len + 1, max_seq_len)][:n_samples]
    if not windows:
        raise CalibrationError(f"the calibration text gave no sample for the full-context graph ({max_seq_len} tokens)",
                               f"give a longer text (at least {max_seq_len} tokens)")
    return [{"input_ids": np.array([w], np.int32), "position_ids": make_position_ids(cfg, 0).numpy(),
             "attention_mask": make_attention_mask(cfg, 0).numpy()} for w in windows]


def with_input_mode(samples: list[dict[str, np.ndarray]], mode, lookup, hidden_size: int) -> list[dict[str, np.ndarray]]:
    """Token samples as the input mode's decoder takes them (llm/input_modes.text_inputs); `lookup`:
    ids → the float decoder's embeddings. A sample that recorded its `inputs_embeds` (image rows in
    them: ImageRows) keeps them."""
    if mode.decoder_inputs == ("input_ids",):
        return samples
    from ...llm.input_modes import text_inputs
    return [{**text_inputs(mode, s["input_ids"], lookup, hidden_size),
             **{k: v for k, v in s.items() if k != "input_ids"}} for s in samples]


def part_samples(samples: list[dict[str, np.ndarray]], part, hidden: list[np.ndarray] | None,
                 first_inputs: tuple[str, ...] = ("input_ids",)) -> list[dict[str, np.ndarray]]:
    """The inputs of one layer range: its own caches (none in a full-context sample), and the hidden
    states entering it (the input mode's `first_inputs` for the first part)."""
    out = []
    for j, s in enumerate(samples):
        d = {k: s[k] for k in ("position_ids", ROPE_POSITION_IDS, "attention_mask") if k in s}
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
        out.append(d)
    return out
