"""One (variant, part) graph's QDQ stage as its own cache entry, so a killed compile resumes.

The parent exports the float part and hands it to a worker, which quantizes it straight into the
entry's temporary folder; the cache renames the folder into place only once the graph is whole
(core/cache.py), so a compile killed at any point (kill -9, Ctrl-C, out of memory) leaves either a
finished graph or nothing that counts, and the next identical command reuses every finished one.
The float ONNX is deleted once its graph is quantized: only the quantized parts stay on disk.
A part exported in several chunks (the host's unit of work) has one entry per chunk; the part's
graph is joined from them when every chunk is done.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...core.cache import Cache, cache_key
from ...quant.chunk_join import join_chunks, name_part_boundaries
from ...quant.llm_graphs import merge_quantization, quantize_job

PART_NAMESPACE = "llm-qdq-part"


def part_key(stage_key: str, graph: str) -> str:
    """The entry of one graph of the `llm-qdq` stage keyed `stage_key` (which holds every input)."""
    return cache_key(PART_NAMESPACE, stage_key, graph)


def quantize_part(job: dict) -> dict:
    """Worker: quantize one float part into its cache entry (or reuse one finished meanwhile)."""
    cache = Cache(Path(job["cache_root"]), job["cache_enabled"])
    name = job["name"]

    def build(tmp: Path) -> dict:
        return {"name": name, "residual_scale": job.get("residual_scale", 1.0),
                "quantization": quantize_job({**job["quantize"], "out_path": str(tmp / f"{name}.onnx")})}
    try:
        entry, hit = cache.get_or_create(PART_NAMESPACE, job["key"], build)
    finally:
        float_path = Path(job["quantize"]["float_path"])
        for f in float_path.parent.glob(float_path.name + "*"):
            f.unlink(missing_ok=True)
    return {"entry": str(entry), "hit": hit}


def join_into(entries: list[Path], names: list[str], chunks, graph: str, dest: Path, io: dict | None = None) -> dict:
    """The part's graph in `dest` from its chunks' entries (hard links when it is one chunk); returns
    its quantization record. `io`: part_input_names' keywords (onnx_export.decoder_io of its decoder)."""

    from .onnx_export import part_input_names, part_output_names   # torch: not in the quantizing workers
    part = chunks[0].part
    if len(entries) == 1:
        link_into(entries[0], graph, dest)
    else:
        join_chunks([(e / f"{n}.onnx", c.end_layer) for e, n, c in zip(entries, names, chunks)], dest / f"{graph}.onnx",
                    part_input_names(part, **(io or {})), part_output_names(part, (io or {}).get("caches", True)))
    name_part_boundaries(dest / f"{graph}.onnx", part.first_layer, part.end_layer, part.is_first, part.is_last)
    return merge_quantization([Cache.meta(e)["quantization"] for e in entries])


def link_into(entry: Path, name: str, dest: Path) -> None:
    """The graph's files from its part entry into `dest` (hard links: no second copy on disk)."""
    for f in entry.glob(name + ".onnx*"):
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)
