"""HTP memory of one decoder graph, estimated before compiling, and the split into parts.

estimate = weights at their quantized widths (what `const`/shared-weights sizes come to)
         + graph IO (KV caches in and out, logits, at the activation width)
         + the largest activation working set (N tokens × the MLP width, × a few live tensors).
The QNN HTP backend refuses a graph above the per-context allocation limit ("graph requires
estimated allocation of 2347229 KB, limit is 2097152 KB" in ExecuTorch's issues): 2 GiB.
A decoder above it is split by layers into `_i_of_n` parts, the fewest that each fit.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CONTEXT_LIMIT_MB = 2048.0


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
    h = cfg.hidden_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    inter = cfg.intermediate_size
    vocab = cfg.vocab_size
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter
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
    """(parts, {variant: [GraphMemory per part]}): the fewest parts whose every graph fits `limit_mb`."""
    from .onnx_export import split_layers
    n_layers = cfg.num_hidden_layers
    limit = limit_mb * 2**20
    for n_parts in range(1, n_layers + 1):
        parts = split_layers(n_layers, n_parts)
        mem = {n: [estimate(cfg, p, n, max_seq_len, weight_bits, act_bits, embed_bits, head_bits) for p in parts]
               for n in variants}
        if all(m.total <= limit for ms in mem.values() for m in ms):
            return parts, mem
    return parts, mem  # one layer per part still above the limit: the compiler will say so
