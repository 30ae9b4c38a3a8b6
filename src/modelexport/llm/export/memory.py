"""HTP memory of one decoder graph, estimated before compiling, and the split into parts.

estimate = weights at their quantized widths (what `const`/shared-weights sizes come to)
         + graph IO (KV caches in and out, logits, at the activation width)
         + the largest activation working set (N tokens × the MLP width, × a few live tensors).
The QNN HTP backend refuses a graph above the per-context allocation limit ("graph requires
estimated allocation of 2347229 KB, limit is 2097152 KB" in ExecuTorch's issues): 2 GiB.
A decoder above it is split by layers into `_i_of_n` parts, the fewest that each fit.

The host bounds the parts too: a part is compiled on its own, and what the compiling process holds
grows with the part's weights (`host_part_bytes`), not with the model; a part is exported and
quantized in chunks of a few layers (`host_chunk_mb`), so those steps hold less still. `host_part_mb` (1280 MB at the default limit, less below it) puts Llama-3.2-1B in 4 parts and -3B in 10, so no float part
comes near protobuf's 2 GiB and two workers side by side stay a few GB each.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.parts import decoder_shape, host_part_bytes, layer_params, split_layers

DEFAULT_CONTEXT_LIMIT_MB = 2048.0
DEFAULT_HOST_PART_MB = 1280.0     # float32 weights of one part's layers: what one QNN compile holds
# float32 weights of the layers exported and quantized at a time: a part goes through the host in
# chunks of this size (one layer of a 1B model is 226 MB), joined into one graph afterwards
DEFAULT_HOST_CHUNK_MB = 256.0


def host_part_mb(limit_mb: float) -> float:
    """The host budget follows `--context-limit-mb` down (1280 MB at the default 2048): a smaller
    limit is the one knob for smaller parts, on the device and on the host alike."""
    return min(DEFAULT_HOST_PART_MB, limit_mb * DEFAULT_HOST_PART_MB / DEFAULT_CONTEXT_LIMIT_MB)


def host_chunk_mb(limit_mb: float) -> float:
    """Chunks never exceed the part budget (a smaller `--context-limit-mb` lowers both)."""
    return min(DEFAULT_HOST_CHUNK_MB, host_part_mb(limit_mb))


@dataclass
class GraphMemory:
    weights: int
    io: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.io + self.activations

    def to_dict(self) -> dict:
        return {"weights_bytes": self.weights, "io_bytes": self.io, "activation_bytes": self.activations,
                "total_bytes": self.total, "total_mb": round(self.total / 2**20, 2)}


def estimate(cfg, part, n_tokens: int, max_seq_len: int, weight_bits: int, act_bits: int,
             embed_bits: int = 8, head_bits: int = 8) -> GraphMemory:
    h, heads, kv, hd, inter, vocab = decoder_shape(cfg)
    per_layer = layer_params(cfg)
    n_layers = len(part.layers())
    w = per_layer * n_layers * weight_bits / 8
    a = act_bits / 8
    io = n_layers * 2 * kv * hd * max_seq_len * a + n_tokens * h * a * 2
    if part.is_first:
        w += vocab * h * embed_bits / 8
    if part.is_last:
        w += vocab * h * head_bits / 8
        io += n_tokens * vocab * a
    act = n_tokens * (4 * inter + heads * max_seq_len * 2) * a
    return GraphMemory(int(w), int(io), int(act))


def plan_parts(cfg, variants: list[int], max_seq_len: int, weight_bits: int, act_bits: int, limit_mb: float,
               embed_bits: int = 8, head_bits: int = 8):
    """(parts, {variant: [GraphMemory per part]}): the fewest parts whose every graph fits `limit_mb`
    on the HTP and whose layers' float32 weights fit `host_part_mb` on the host (a single layer
    always does: it cannot be split further)."""
    n_layers = cfg.num_hidden_layers
    limit, host_limit = limit_mb * 2**20, host_part_mb(limit_mb) * 2**20
    for n_parts in range(1, n_layers + 1):
        parts = split_layers(n_layers, n_parts)
        mem = {n: [estimate(cfg, p, n, max_seq_len, weight_bits, act_bits, embed_bits, head_bits) for p in parts]
               for n in variants}
        host_ok = all(host_part_bytes(cfg, p, with_ends=False) <= host_limit or len(p.layers()) == 1 for p in parts)
        if host_ok and all(m.total <= limit for ms in mem.values() for m in ms):
            return parts, mem
    return parts, mem  # one layer per part still above the limit: the compiler will say so
