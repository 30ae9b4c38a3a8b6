"""A pure-torch CPU driver for static decoder graphs: prefill in chunks of N, decode with N=1.

This is the reference loop for compiled artifacts: a "graph" is any callable taking the flat
inputs of `static_decoder` (input_ids, position_ids, attention_mask, *past_keys, *past_values)
and returning (logits, *new_keys, *new_values). The eager `StaticDecoder` is one; a wrapper
around a compiled `.pte` method or an ONNX Runtime session is another (such a wrapper may need
to make the cache views contiguous: here they are slices of one buffer).

The KV cache is allocated once per layer at the longest length any graph needs
(max_seq_len - smallest N) and updated in place: after each call only the entries of the valid
tokens are copied into slots past_len .. past_len+n-1 (cache slot p = position p, ExecuTorch's
"smart mask" scheme), so nothing is ever shifted and the graph never outputs the whole cache.

Graphs built for several context lengths (`compile --context-lengths`) are keyed (N, C); a plain N
means C = max_seq_len. A graph of length C reads the first C - N cache slots, so a dialog runs on the
shortest length its position fits and moves to a longer one as it grows, with the same cache: no copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import torch

from ...core.errors import InputError
from ..model.static_decoder import (
    DEFAULT_MASK_VALUE, DecoderSpec, StaticDecoder, StaticDecoderConfig, make_attention_mask, make_position_ids)

Graph = Callable[..., Sequence[torch.Tensor]]
ChunkProgress = Callable[[int, int], None]   # (tokens done, tokens to feed): a long prefill's progress


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    new_ids: list[int]
    stopped_on: str  # "eos", "max_new_tokens" or "context_full"
    chunks: list[int] = field(default_factory=list)  # N of each graph call, in order


def graph_shape(key, max_seq_len: int) -> tuple[int, int]:
    """(N, C) of a graph's key: N alone means C = max_seq_len."""
    return (int(key[0]), int(key[1])) if isinstance(key, tuple) else (int(key), max_seq_len)


class StaticRunner:
    """Runs static decoder graphs over one sequence, keeping cache, positions and mask right."""

    def __init__(self, graphs: Mapping, spec: DecoderSpec, max_seq_len: int, *,
                 mask_value: float = DEFAULT_MASK_VALUE, pad_id: int = 0):
        if not graphs:
            raise InputError("a static runner needs at least one graph")
        self.by_shape = {graph_shape(k, max_seq_len): g for k, g in graphs.items()}   # {(N, C): graph}
        self.n_tokens = sorted({n for n, _ in self.by_shape})   # the N on offer
        self.spec = spec
        self.max_seq_len = max_seq_len
        self.cfgs = {k: StaticDecoderConfig(k[0], k[1], mask_value) for k in self.by_shape}
        self.pad_id = pad_id
        store_len = max_seq_len - self.n_tokens[0]
        self.k_store = [torch.zeros(spec.k_cache_shape(store_len)) for _ in range(spec.n_layers)]
        self.v_store = [torch.zeros(spec.v_cache_shape(store_len)) for _ in range(spec.n_layers)]
        self.past_len = 0
        self.chunks: list[int] = []
        self.lengths: list[int] = []    # C of each call, in order

    @classmethod
    def from_decoder(cls, decoder: StaticDecoder, n_tokens: Iterable[int] = (1,), **kw) -> "StaticRunner":
        """The eager decoder serves every N (its computation does not depend on N)."""
        def graph(*inputs):
            with torch.inference_mode():
                return decoder(*decoder.graph_inputs(inputs))   # M-RoPE's positions put in (llm/model/mrope.py)
        n_set = sorted(set(n_tokens) | {decoder.cfg.n_tokens})
        return cls({n: graph for n in n_set}, decoder.spec, decoder.cfg.max_seq_len,
                   mask_value=decoder.cfg.mask_value, **kw)

    def reset(self) -> None:
        for t in (*self.k_store, *self.v_store):
            t.zero_()
        self.past_len = 0
        self.chunks = []
        self.lengths = []

    # -----------------------------------------------------------------------------------------
    def fits(self, n: int) -> int | None:
        """The shortest context length whose N graph takes a chunk at the current position (None: none)."""
        return min((c for m, c in self.by_shape if m == n and self.past_len <= c - n), default=None)

    def _pick_n(self, remaining: int) -> int:
        """The graph that needs the fewest calls for what is left (ties: the smaller N, fewer pads),
        among those whose chunk still fits after the current cache contents."""
        fits = [n for n in self.n_tokens if self.fits(n) is not None]
        if not fits:
            raise InputError(f"the context is full ({self.past_len} of {self.max_seq_len} positions)",
                             "use a shorter prompt or a larger max_seq_len")
        return min(fits, key=lambda n: (-(-remaining // n), n))

    def run_chunk(self, token_ids: Sequence[int], n_tokens: int) -> torch.Tensor:
        """One graph call on up to N tokens at the current position, on the shortest context length
        that holds it; returns their logits [n, vocab]."""
        n = len(token_ids)
        if not 1 <= n <= n_tokens:
            raise InputError(f"a chunk for the AR-{n_tokens} graph takes 1..{n_tokens} tokens, got {n}")
        length = self.fits(n_tokens)
        if length is None:
            raise InputError(f"the context is full for the AR-{n_tokens} graph ({self.past_len} cached)")
        shape = (n_tokens, length)
        cfg = self.cfgs[shape]
        ids = torch.full((1, n_tokens), self.pad_id, dtype=torch.int32)
        ids[0, :n] = torch.as_tensor(list(token_ids), dtype=torch.int32)
        c = cfg.cache_len
        ks = [k[..., :c] for k in self.k_store]
        vs = [v[:, :, :c, :] for v in self.v_store]
        out = self.by_shape[shape](ids, make_position_ids(cfg, self.past_len),
                                    make_attention_mask(cfg, self.past_len), *ks, *vs)
        L = self.spec.n_layers
        logits, new_k, new_v = out[0], out[1:1 + L], out[1 + L:1 + 2 * L]
        p = self.past_len
        if p + n <= self.k_store[0].shape[-1]:
            room = n
        else:  # the very last position of the context: nothing after it will read the cache
            room = self.k_store[0].shape[-1] - p
        for i in range(L):
            self.k_store[i][..., p:p + room] = new_k[i][..., :room]
            self.v_store[i][:, :, p:p + room, :] = new_v[i][:, :, :room, :]
        self.past_len += n
        self.chunks.append(n_tokens)
        self.lengths.append(shape[1])
        return logits[0, :n].detach().clone()

    def feed(self, token_ids: Sequence[int], on_chunk: ChunkProgress | None = None) -> torch.Tensor:
        """Feed tokens (prefill or more), in chunks of the largest graphs; logits of each [len, vocab].
        `on_chunk(done, total)`: before the first chunk (done = 0) and after each one."""
        token_ids = list(token_ids)
        if not token_ids:
            raise InputError("nothing to feed: the token list is empty")
        if self.past_len + len(token_ids) > self.max_seq_len:
            raise InputError(f"{len(token_ids)} tokens do not fit after {self.past_len} of {self.max_seq_len} positions "
                             f"(the bundle's context is {self.max_seq_len} tokens)",
                             "use a shorter prompt, or compile the bundle again with a larger --max-seq-len")
        out, i = [], 0
        if on_chunk is not None:
            on_chunk(0, len(token_ids))
        while i < len(token_ids):
            n_graph = self._pick_n(len(token_ids) - i)
            chunk = token_ids[i:i + n_graph]
            out.append(self.run_chunk(chunk, n_graph))
            i += len(chunk)
            if on_chunk is not None:
                on_chunk(i, len(token_ids))
        return torch.cat(out, dim=0)

    def prefill(self, token_ids: Sequence[int], on_chunk: ChunkProgress | None = None) -> torch.Tensor:
        """Start a new sequence; returns the logits of the last prompt token [vocab]."""
        self.reset()
        return self.feed(token_ids, on_chunk)[-1]

    def decode_step(self, token_id: int) -> torch.Tensor:
        """One token through the smallest graph; its logits [vocab]."""
        return self.run_chunk([token_id], self.n_tokens[0])[-1]

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 eos_token_ids: Iterable[int] = ()) -> GenerationResult:
        """Greedy decoding (argmax)."""
        eos = set(eos_token_ids)
        logits = self.prefill(prompt_ids)
        new: list[int] = []
        stopped = "max_new_tokens"
        while len(new) < max_new_tokens:
            tok = int(torch.argmax(logits))
            new.append(tok)
            if tok in eos:
                stopped = "eos"
                break
            if len(new) == max_new_tokens:
                break
            if self.past_len >= self.max_seq_len:
                stopped = "context_full"
                break
            logits = self.decode_step(tok)
        return GenerationResult(list(prompt_ids), new, stopped, list(self.chunks))
