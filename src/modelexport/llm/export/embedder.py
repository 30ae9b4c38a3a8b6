"""The embedder part of an embeddings-in LLM bundle (`compile LLM --inputs embeddings`): token ids →
the embeddings entering layer 0, one graph per variant's N, all in one weight-shared context binary
(the table stored once), beside the decoder's.

Its precision is a row of EMBEDDER_PRECISIONS. Measured on SmolLM2-135M's table over 4,096 tokens of
lee_background.cor (docs/llm_export.md, "Decoder inputs"): float16 73.7 dB from float32, an 8-bit
table with one scale (the lookup the token path's decoder does: ONNX Runtime's QDQ Gather takes one
scale per table) 28.4 dB; one scale per row would give 39.5 dB but is not what the quantizer writes
for a Gather. fp16 is the default: the decoder takes float embeddings (its residual stream is fp16 on
the HTP), so an 8-bit table would be the chain's largest loss; it costs twice the bytes (56.6 MB
instead of 28.3 MB for SmolLM2, next to a ~135 MB decoder).

Genie does not run the embedder part: its dialog looks tokens up in a table file of its own (the
config's `embedding` block, type "lut"), so the bundle also carries `genie_lut.bin`, the embedder's
own outputs for every id as float32 rows (the decoder's `inputs_embeds` is a float input, and
Genie's tables have no float16). It is what the embedder part computes, row for row: the fp16
table's values, or the 8-bit graph's outputs; Genie and our loop feed the decoder the same numbers.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.errors import InputError
from ...quant.calibration import CalibrationSet
from ...quant.llm_graphs import DEFAULT_OVERRIDES, parse_overrides, quantize_decoder


@dataclass(frozen=True)
class EmbedderPrecision:
    name: str
    quantized: bool     # an 8-bit QDQ graph (ONNX Runtime's quantizer); else the float graph, fp16 on the HTP
    what: str


EMBEDDER_PRECISIONS = {p.name: p for p in (
    EmbedderPrecision("fp16", False, "the table in float16 (the float graph; the HTP runs it in fp16)"),
    EmbedderPrecision("8bit", True, "an 8-bit lookup table (uint8, one scale per table) with 16-bit outputs: "
                                    "the token path's own lookup"),
)}
DEFAULT_EMBEDDER_PRECISION = "fp16"
EMBEDDER_VERSION = 2        # in the QDQ stage's cache key: 2 = the stage also writes Genie's table
CALIBRATION_WINDOWS = 8     # token windows of N the 8-bit table's output range is taken from


def get_embedder_precision(name: str | None) -> EmbedderPrecision:
    p = EMBEDDER_PRECISIONS.get((name or DEFAULT_EMBEDDER_PRECISION).strip().lower())
    if p is None:
        raise InputError(f"--embedder-precision {name!r} is not offered",
                         f"choose one of: {', '.join(EMBEDDER_PRECISIONS)} (default {DEFAULT_EMBEDDER_PRECISION})")
    return p


def build_embedders(model, variants: list[int], max_seq_len: int, token_ids: list[int], precision: str,
                    dest: Path, work: Path, text_source: str) -> dict:
    """Export (and for 8 bits quantize) one embedder graph per N into `dest`; → the stage record
    {"precision", "what", "graphs": [{"name", "n_tokens", "graph"}], "check_ids"}."""
    import torch

    from ..model.static_decoder import ONNX_RMS_NORM, build_static_decoder, decoder_config   # torch
    from .onnx_export import export_embedder                                           # torch

    prec = get_embedder_precision(precision)
    dest.mkdir(parents=True, exist_ok=True)
    graphs = []
    for n in variants:
        name = f"embed_ar{n}_cl{max_seq_len}"
        dec = build_static_decoder(model, decoder_config(n, max_seq_len), rms_norm=ONNX_RMS_NORM)
        fpath = export_embedder(dec, work / f"{name}.onnx")
        if prec.quantized:
            samples = [{"input_ids": np.array([w], np.int32)} for w in _windows(token_ids, n, CALIBRATION_WINDOWS)]
            quantize_decoder(fpath, dest / f"{name}.onnx", "16a8w", parse_overrides(list(DEFAULT_OVERRIDES), "16a8w"),
                             CalibrationSet(samples, "text", text_source))
        else:
            for f in work.glob(f"{name}.onnx*"):
                shutil.move(str(f), dest / f.name)
        graphs.append({"name": name, "n_tokens": n, "graph": f"embedder/{name}.onnx"})
    # real tokens and their float embeddings, for the compiled twin's check (embedder_check)
    n_check = max(variants)
    ids = np.array([(_windows(token_ids, n_check, 1) or [token_ids[:n_check]])[0]], np.int32)
    with torch.inference_mode():
        ref = dec.lookup(torch.from_numpy(ids)).float().numpy()
    np.savez(dest / "check.npz", ids=ids, ref=ref)
    widest = max(graphs, key=lambda g: g["n_tokens"])
    rows = write_genie_lut(dec, prec, dest / f"{widest['name']}.onnx", widest["n_tokens"], dest / GENIE_LUT_FILE)
    return {"precision": prec.name, "what": prec.what, "graphs": graphs, "check": "embedder/check.npz",
            "genie_lut": f"embedder/{GENIE_LUT_FILE}", "genie_lut_rows": rows}


GENIE_LUT_FILE = "genie_lut.bin"
LUT_CHUNK_ROWS = 4096    # ids looked up per call when the table is written


def write_genie_lut(dec, prec: EmbedderPrecision, graph: Path, n: int, out: Path) -> int:
    """Genie's token → embedding table: float32 rows, one per id of the table, as the embedder part
    computes them (the fp16 table's values; for 8 bits, the QDQ graph `graph` of N = `n` run on the
    CPU). → the number of rows."""
    import torch
    weight = dec.model.embed_tokens.weight
    rows = int(weight.shape[0])
    session = None
    if prec.quantized:
        import onnxruntime
        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    with open(out, "wb") as f, torch.inference_mode():
        for start in range(0, rows, LUT_CHUNK_ROWS):
            ids = torch.arange(start, min(start + LUT_CHUNK_ROWS, rows))
            if session is None:   # the float graph runs in fp16 on the HTP: the table's fp16 values
                block = dec.lookup(ids[None])[0].to(torch.float16).float().numpy()
            else:                 # windows of N ids through the 8-bit graph, the last one padded
                pad = (-len(ids)) % n
                padded = np.concatenate([ids.numpy(), np.zeros(pad, np.int64)]).astype(np.int32).reshape(-1, 1, n)
                block = np.concatenate([session.run(None, {"input_ids": w})[0][0] for w in padded])[:len(ids)]
            np.ascontiguousarray(block, np.float32).tofile(f)
    return rows


def _windows(ids: list[int], n: int, k: int) -> list[list[int]]:
    return [ids[i:i + n] for i in range(0, len(ids) - n + 1, n)][:k]
