"""Layer ranges of a decoder split into parts, and their sizes (no torch: the plan is made before any
weight is loaded; backends/llm_qnn/memory.py chooses the parts)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartRange:
    index: int          # 1-based
    count: int
    first_layer: int
    end_layer: int      # exclusive

    @property
    def is_first(self) -> bool:
        return self.index == 1

    @property
    def is_last(self) -> bool:
        return self.index == self.count

    def layers(self) -> range:
        return range(self.first_layer, self.end_layer)


def split_layers(n_layers: int, n_parts: int) -> list[PartRange]:
    n_parts = max(1, min(n_parts, n_layers))
    base, extra = divmod(n_layers, n_parts)
    out, start = [], 0
    for i in range(n_parts):
        size = base + (1 if i < extra else 0)
        out.append(PartRange(i + 1, n_parts, start, start + size))
        start += size
    return out


def decoder_shape(cfg) -> tuple[int, int, int, int, int, int]:
    h = cfg.hidden_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    return h, heads, kv, hd, cfg.intermediate_size, cfg.vocab_size


def layer_params(cfg) -> int:
    h, heads, kv, hd, inter, _ = decoder_shape(cfg)
    return h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter


def host_part_bytes(cfg, part, with_ends: bool = True) -> int:
    """float32 bytes of one part's weights: its layers, + the embedding if first and lm_head if last
    (`with_ends`; the split leaves them out: they cannot be cut, whatever the number of parts)."""
    h, *_, vocab = decoder_shape(cfg)
    ends = (int(part.is_first) + int(part.is_last)) if with_ends else 0
    return 4 * (layer_params(cfg) * len(part.layers()) + vocab * h * ends)


@dataclass(frozen=True)
class Chunk:
    """Consecutive layers of one part, exported and quantized on their own (the host's unit of
    work); the part's graph joins its chunks (quant/chunk_join.py). Reads like a PartRange to the
    exporter and the calibration: is_first / is_last say whether it holds the embedding / lm_head."""
    part: PartRange
    index: int          # 1-based, within the part
    count: int
    first_layer: int
    end_layer: int

    @property
    def is_first(self) -> bool:
        return self.part.is_first and self.index == 1

    @property
    def is_last(self) -> bool:
        return self.part.is_last and self.index == self.count

    def layers(self) -> range:
        return range(self.first_layer, self.end_layer)

    def name(self, graph: str) -> str:
        """The chunk's graph name: the part's own when the part is one chunk."""
        return graph if self.count == 1 else f"{graph}_chunk{self.index}of{self.count}"


def host_chunks(cfg, part: PartRange, chunk_bytes: float) -> list[Chunk]:
    """The fewest equal runs of the part's layers whose float32 weights each fit `chunk_bytes`
    (a single layer always does: it cannot be cut)."""
    n = len(part.layers())
    per_layer = 4 * layer_params(cfg)
    count = min(n, max(1, -(-int(per_layer * n) // max(1, int(chunk_bytes)))))
    return [Chunk(part, r.index, r.count, part.first_layer + r.first_layer, part.first_layer + r.end_layer)
            for r in split_layers(n, count)]
