"""The cache keys of the `llm-qdq` stage (graphs.py): every input of the quantized graphs, so an
identical compile reuses them and a changed one does not. Kept apart from graphs.py, which imports
torch: a cache hit needs neither torch nor the model."""
from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from ...core.cache import cache_key
from ...core.files import sha256_file
from .embedder import EMBEDDER_VERSION
from .memory import host_part_mb
from .plan import LlmPlan

QDQ_NAMESPACE = "llm-qdq"
EXPORT_VERSION = 10  # 4: RoPE table lookups float; 5: KV-cache encodings tied across graphs; 6: host-sized
#                      parts, weight rounding; 7: the static decoder built from the family table; 8: the residual
#                      stream carried at 1/s (llm/model/residual_scale.py), Gemma's sandwich norms float (bump on any
#                      change to the decoder or to what stays float); 9: attention's core float (fp16 on the HTP); 10: the scaled
#                      RMSNorm's eps / m² as (√eps / m)² (blocks.RMSNorm: m² underflowed fp16 on a row near zero)
JOIN_VERSION = 2      # 2: a part's boundary tensors named after the layer they follow (Genie hands them on by name)
# cache key: how calibrate.ImageRows places a VLM's images (windows 1, 3, 5, ...; 3: the runtime's blocks of ids
# (tiles' markers, wrap ids), rows of the views it shows the vision part, M-RoPE grid positions)
IMAGE_ROWS_VERSION = "image-rows-3"
REFERENCE_VERSION = "reference-2"   # the entry holds the float logits of compile's own check (reference.py)
LORA_VERSION = "lora-1"    # how the LoRA inputs enter the graphs (llm/model/lora.py)
TEXT_WINDOWS = "bos-first-1"   # every calibration / rounding window begins as a dialog does (run/text.dialog_start)


@dataclass(frozen=True)
class QdqKeys:
    chunks: str     # the quantized chunks' entries (part_stage.part_key): valid across join changes
    joined: str     # the stage's entry: the joined part graphs, the tokenizer, the record


def qdq_keys(plan: LlmPlan, image_calibration: str | None) -> QdqKeys:
    import onnxruntime   # its version is part of the key (a heavy import: only here)

    # the input mode joins the key only when it is not the default: a token bundle's entries stay valid
    mode_key = [] if plan.inputs == "tokens" else [plan.inputs, plan.embedder_precision]
    if image_calibration:   # a VLM's decoder calibrated on its vision rows too
        mode_key += [IMAGE_ROWS_VERSION, sha256_file(Path(image_calibration))]
    if plan.lora:           # LoRA inputs in the graphs, calibrated with these adapters
        mode_key += [LORA_VERSION, [a.sha256 for a in plan.lora.adapters], plan.lora.slots.to_dict()]
    if plan.positions != "ids":   # other graph inputs, other samples
        mode_key += ["positions", plan.positions]
    if plan.context_lengths:   # more graphs, and the caches' tied ranges widened over every length's walk
        mode_key += ["context-lengths", list(plan.context_lengths)]
    chunks = cache_key(QDQ_NAMESPACE, EXPORT_VERSION, plan.facts.sha256, plan.variants, plan.max_seq_len, plan.requested,
                       plan.block_size, [(o.pattern, o.precision.name) for o in plan.overrides], plan.text.sha256,
                       plan.n_samples, plan.limit_mb, host_part_mb(plan.limit_mb), plan.chunk_mb,
                       plan.quality.key() if plan.quality else None, onnxruntime.__version__, version("torch"),
                       TEXT_WINDOWS, *mode_key)
    # the joined part graphs changed apart from the quantized chunks (their entries stay valid)
    return QdqKeys(chunks, cache_key(QDQ_NAMESPACE, chunks, JOIN_VERSION, REFERENCE_VERSION,
                                     *([EMBEDDER_VERSION] if mode_key else [])))
