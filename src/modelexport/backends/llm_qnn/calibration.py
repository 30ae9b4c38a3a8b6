"""Calibration for LLM decoder graphs from real text.

The text is tokenized and run through the *float* static decoder (eager PyTorch) chunk by chunk,
so every sample carries the KV cache the model itself produced for the text before it: the arN
graph is calibrated on (N real tokens, their positions and mask, the real caches), and the ar1
graph on the single real token that follows each arN chunk. Random caches give ranges that make
the quantized logits useless (measured: max error 21 on logits up to 23), real ones do not.
"""
from __future__ import annotations


import numpy as np

from ...core.errors import CalibrationError



def calibration_samples(hf_model, token_ids: list[int], variants: list[int], max_seq_len: int,
                        samples_per_variant: int) -> dict[int, list[dict[str, np.ndarray]]]:
    """{N: [flat input dict of the full decoder]} recorded from the float decoder on real text.

    The text is walked in windows of `max_seq_len`; in each window chunks of the largest N are
    fed, and after each one a single token through every smaller N, all with the real cache."""
    import torch

    from ...llm.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder
    from ...llm.static_runner import StaticRunner
    big, small = max(variants), sorted(v for v in variants if v != max(variants))
    dec = build_static_decoder(hf_model, StaticDecoderConfig(big, max_seq_len), rms_norm=ONNX_RMS_NORM)
    names = dec.input_names()
    out: dict[int, list[dict[str, np.ndarray]]] = {n: [] for n in variants}
    recording: dict[str, int] = {"n": 0}

    def graph(*inputs):
        n = recording["n"]
        if len(out[n]) < samples_per_variant:
            out[n].append({k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in zip(names, inputs)})
        with torch.inference_mode():
            return dec(*inputs)

    runner = StaticRunner({n: graph for n in variants}, dec.spec, max_seq_len)
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


def part_samples(samples: list[dict[str, np.ndarray]], part, hidden: list[np.ndarray] | None) -> list[dict[str, np.ndarray]]:
    """The inputs of one layer range: its own caches, and the hidden states entering it."""
    out = []
    for j, s in enumerate(samples):
        d = {"position_ids": s["position_ids"], "attention_mask": s["attention_mask"]}
        if part.is_first:
            d["input_ids"] = s["input_ids"]
        else:
            d["hidden_states"] = hidden[j]
        for i in part.layers():
            d[f"past_key_{i}"] = s[f"past_key_{i}"]
        for i in part.layers():
            d[f"past_value_{i}"] = s[f"past_value_{i}"]
        out.append(d)
    return out
