"""Genie's composable pipeline for a VLM bundle (`genie_pipeline.json`): an image-encoder node on the
vision part's binary, a text-encoder node (a lookup table: the embedder's rows as float32, the same
`embedder/genie_lut.bin` the dialog uses) and a text-generator node on the embeddings-in decoder.
Each encoder appends its rows to the generator's accumulator when it is given data
(`GenieNode_setData`), so the prompt's order is the order of the calls: the text before the image,
the image, the text after it; `GeniePipeline_execute` then runs the generator on the accumulated
rows (Genie's embedding query: its own prefill / decode, KV updates and sampler, each generated
token looked up in the generator's table).

What the wheel's libGenie does with our bundle (measured on the host twins, x86 simulator):
- the pipeline config, the text-generator node on our decoder, the text-encoder node, their
  connection: accepted; the build checks them (a bundle Genie refuses fails with Genie's words);
- the image-encoder node: refused, "stoi: out of range". Genie sizes a graph from its tensors
  (`attention_mask`, `past_*`) and, failing that, from its name: `cl<N>`, else the largest number
  in it (`std::stoi`). An encoder has neither tensor, and the QNN EP names every graph
  `QNNExecutionProvider_QNNExecutionProvider_<h>_1_0` with a 19-20 digit model hash `<h>`, beyond
  an int. The refusal is recorded in the manifest (`llm.genie[target].pipeline`), not a failed build.
  Past the name (measured with the digits overwritten, an experiment): an output named `image_features`
  makes it an image encoder, then Genie refuses `pixel_values` against `vision-param` for every layout tried
  (docs/llm_export.md, "What comes after the name").
- so `generate --image --backend genie` runs the vision part itself (its EPContext model on the
  simulator) and hands the rows to the generator's own embedding input
  (`GENIE_NODE_TEXT_GENERATOR_EMBEDDING_INPUT`) between the two text-encoder calls: every row the
  decoder sees is what our loop feeds it, and the first step's logits are the same, bit for bit
  (tests/test_vlm_genie.py, from Genie's own tensor dumps).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import InputError, VerificationError
from ...toolchain.genie import NODE_IO, genie_messages, run_pipeline
from .genie_dialog import bundle_config

PIPELINE_FILE = "genie_pipeline.json"
GENERATOR, TEXT_ENCODER, IMAGE_ENCODER = "textGenerator", "textEncoder", "imageEncoder"
# producer, its output, consumer, its input (the order the nodes are built: the generator first,
# it makes the accumulator the encoders write to; the image encoder last, Genie refuses it here)
CONNECTIONS = [(TEXT_ENCODER, "text_encoder.embedding_out", GENERATOR, "generator.embedding_in"),
               (IMAGE_ENCODER, "image_encoder.embedding_out", GENERATOR, "generator.embedding_in")]


def pipeline_config(dialog: dict[str, Any], vision_bins: list[str], hidden_size: int, image_size: int) -> dict[str, Any]:
    """The bundle's `genie_pipeline.json` from its Genie dialog config (paths relative to the bundle
    folder, as there): {"nodes": {name: node config}, "connections": [...]}."""
    body = json.loads(json.dumps(dialog["dialog"]))
    lut = body["embedding"]["lut-path"]
    return {
        "nodes": {
            GENERATOR: {"text-generator": body},
            TEXT_ENCODER: {"text-encoder": {"version": 1, "type": "lut",
                                            "lut": {"version": 1, "lut-path": lut, "size": int(hidden_size),
                                                    "datatype": "float32"},
                                            "tokenizer": dict(body["tokenizer"])}},
            IMAGE_ENCODER: {"image-encoder": {"version": 1, "engine": {
                "version": 1, "mode": "image",
                "backend": {"version": 1, "type": "QnnHtp",
                            "QnnHtp": {"version": 1, "spill-fill-bufsize": 0, "use-mmap": True, "allow-async-init": False,
                                       "pooled-output": False, "disable-kv-cache": True}},
                "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": list(vision_bins)},
                          "vision-param": {"height": int(image_size), "width": int(image_size)}}}}},
        },
        "connections": [{"producer": p, "output": po, "consumer": c, "input": ci} for p, po, c, ci in CONNECTIONS],
    }


def host_pipeline(bundle, target: str, rel: str, sampler: dict[str, Any] | None = None) -> dict[str, Any]:
    """The bundle's pipeline config `rel` with absolute paths and the generator on the host twins (its
    dialog body from `genie_dialog.bundle_config`, BOS cleared: the prompt's text carries its own)."""
    cfg = json.loads(bundle.file(rel).read_text())
    dialog = bundle_config(bundle, target, sampler)["dialog"]
    dialog["context"]["bos-token"] = -1
    nodes = cfg["nodes"]
    nodes[GENERATOR]["text-generator"] = dialog
    text = nodes[TEXT_ENCODER]["text-encoder"]
    text["lut"]["lut-path"] = dialog["embedding"]["lut-path"]
    text["tokenizer"]["path"] = dialog["tokenizer"]["path"]
    model = nodes[IMAGE_ENCODER]["image-encoder"]["engine"]["model"]
    model["binary"]["ctx-bins"] = [str(bundle.file(b)) for b in model["binary"]["ctx-bins"]]
    return cfg


def _job(cfg: dict[str, Any], node_names: list[str]) -> dict[str, Any]:
    nodes = {n: cfg["nodes"][n] for n in node_names}
    return {"nodes": nodes, "connect": [[c["producer"], NODE_IO[c["output"]], c["consumer"], NODE_IO[c["input"]]]
                                        for c in cfg["connections"] if c["producer"] in nodes and c["consumer"] in nodes]}


def check_pipeline(bundle, target: str, rel: str) -> dict[str, Any]:
    """Build the bundle's pipeline with libGenie on the host twins: the text path (pipeline, generator
    node on the decoder, text-encoder node, connected) must be accepted, else a VerificationError with
    Genie's message; the image-encoder node's outcome is recorded (Genie refuses it with this EP's
    graph names, see the module's doc)."""
    cfg = host_pipeline(bundle, target, rel)
    status, stderr = run_pipeline(_job(cfg, [GENERATOR, TEXT_ENCODER]), timeout=600)
    failed = next((k for k, v in status.items() if v != 0), None)
    if failed or f"connect:{TEXT_ENCODER}" not in status:
        raise VerificationError(f"Genie refuses the bundle's pipeline ({failed or 'stopped'} status "
                                f"{status.get(failed) if failed else '-'}): {genie_messages(stderr)}",
                                "this is a bug in the generated pipeline config; report it with the bundle's manifest")
    status, stderr = run_pipeline(_job(cfg, [GENERATOR, TEXT_ENCODER, IMAGE_ENCODER]), timeout=600)
    created = status.get(f"node:{IMAGE_ENCODER}") == 0 and status.get(f"connect:{IMAGE_ENCODER}") == 0
    return {"text_path_created": True, "image_encoder_created": created,
            "image_encoder_note": None if created else
            f"GenieNode_create status {status.get(f'node:{IMAGE_ENCODER}')}: {genie_messages(stderr)}",
            "checked_on": "host twins (x86 HTP simulator)"}


def prompt_segments(ids: list[int], image_token_id: int) -> list[tuple[str, list[int]]]:
    """The prompt in the order the pipeline takes it: [("text", ids) | ("image", positions)], the
    image tokens' runs as one "image" segment each."""
    out: list[tuple[str, list[int]]] = []
    for i, t in enumerate(ids):
        kind = "image" if t == image_token_id else "text"
        if out and out[-1][0] == kind:
            out[-1][1].append(t if kind == "text" else i)
        else:
            out.append((kind, [t if kind == "text" else i]))
    return out


def genie_image_tokens(bundle, target: str, tokenizer, ids: list[int], rows: np.ndarray, max_new_tokens: int,
                       sampler: dict[str, Any], debug_dir: Path | None = None) -> tuple[list[int], str]:
    """Greedy tokens from Genie's pipeline: each text run of `ids` through the text-encoder node
    (as text: Genie tokenizes it), each image run's `rows` [n, hidden] through the generator's
    embedding input, in prompt order; then execute → (token ids, stop reason). `debug_dir`: Genie
    dumps the decoder's tensors there (its `debug` block)."""
    v = bundle.manifest.llm.vision
    entry = bundle.manifest.llm.genie.get(target)
    if entry is None or entry.pipeline is None:
        raise InputError(f"{bundle.path} has no Genie pipeline for {target}",
                         "compile the VLM folder again with this version, or use --backend htp-sim")
    cfg = host_pipeline(bundle, target, entry.pipeline.file, sampler)
    gen = cfg["nodes"][GENERATOR]["text-generator"]
    gen["max-num-tokens"] = int(max_new_tokens)
    gen["callback-type"] = "token"
    if debug_dir is not None:
        gen["debug"] = {"path": str(debug_dir), "dump-tensors": True}
    job = _job(cfg, [GENERATOR, TEXT_ENCODER])
    out: list[int] = []
    with tempfile.TemporaryDirectory(prefix="modelexport-genie-") as d:
        inputs, k = [], 0
        for kind, run in prompt_segments(ids, v.image_token_id):
            if kind == "text":
                inputs.append([TEXT_ENCODER, NODE_IO["text_encoder.text_in"], "text", tokenizer.decode(run)])
            else:
                path = Path(d) / f"image_rows_{k}.f32"
                np.ascontiguousarray(rows[k:k + len(run)], np.float32).tofile(path)
                inputs.append([GENERATOR, NODE_IO["generator.embedding_in"], "file", str(path)])
                k += len(run)
        job.update(inputs=inputs, token_output=[GENERATOR, NODE_IO["generator.token_out"]])
        status, stderr = run_pipeline(job, timeout=3600,
                                      on_event=lambda e: out.extend(e["ids"]) if e["event"] == "tokens" else None)
    if status.get("execute") != 0:
        failed = next((f"{k} status {s}" for k, s in status.items() if s != 0), "stopped")
        raise VerificationError(f"Genie's pipeline did not run the bundle ({failed}): {genie_messages(stderr)}",
                                "use --backend htp-sim (the same binaries, our loop); report it with the bundle's manifest")
    return out, "length" if len(out) >= max_new_tokens else "eos"
