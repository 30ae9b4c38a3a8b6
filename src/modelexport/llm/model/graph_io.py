"""The static decoder's graph interface: its shape (`StaticDecoderConfig`), the model's dimensions
(`DecoderSpec`), the input and output names (Genie's cache names), the additive mask, the positions and
example inputs (the layout is described in static_decoder.py's docstring)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import InputError
from .input_modes import DEFAULT_INPUT_MODE, INPUT_IDS, INPUT_MODES, INPUTS_EMBEDS, POSITION_COS, POSITION_SIN, InputMode
from .mrope import ROPE_POSITION_IDS, RopePositions

DEFAULT_MASK_VALUE = -255.0


@dataclass(frozen=True)
class StaticDecoderConfig:
    """The static shape of one decoder graph: N tokens per call, attention span `max_seq_len`."""

    n_tokens: int
    max_seq_len: int
    mask_value: float = DEFAULT_MASK_VALUE
    full: bool = False     # the full-context graph: N = C tokens, no KV-cache inputs or outputs

    def __post_init__(self):
        if self.n_tokens < 1:
            raise InputError(f"n_tokens must be at least 1, got {self.n_tokens}")
        if self.full and self.n_tokens != self.max_seq_len:
            raise InputError(f"a full-context graph reads all max_seq_len ({self.max_seq_len}) tokens, not {self.n_tokens}")
        if not self.full and self.max_seq_len <= self.n_tokens:
            raise InputError(f"max_seq_len ({self.max_seq_len}) must be larger than n_tokens ({self.n_tokens})",
                             "the KV cache holds max_seq_len - n_tokens entries; raise max_seq_len")

    @classmethod
    def full_context(cls, max_seq_len: int, mask_value: float = DEFAULT_MASK_VALUE) -> StaticDecoderConfig:
        """The "bert" graph: every position of the context in one call, causal, no cache."""
        return cls(max_seq_len, max_seq_len, mask_value, full=True)

    @property
    def cache_len(self) -> int:
        """Entries in each layer's KV cache input (C - N; 0 for the full-context graph, which has none)."""
        return self.max_seq_len - self.n_tokens


@dataclass(frozen=True)
class DecoderSpec:
    """What a caller needs to feed a static decoder: the model's dimensions."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_seq_len: int  # rows of the RoPE tables: positions 0 .. max_seq_len-1

    def k_cache_shape(self, cache_len: int) -> tuple[int, int, int, int]:
        return (1, self.n_kv_heads, self.head_dim, cache_len)

    def v_cache_shape(self, cache_len: int) -> tuple[int, int, int, int]:
        return (1, self.n_kv_heads, cache_len, self.head_dim)


# ---------------------------------------------------------------------------------------------
# masks, positions, example inputs

def make_attention_mask(cfg: StaticDecoderConfig, past_len: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive mask [1, 1, N, C] for a chunk whose first token sits at position `past_len`.

    Cache columns `0 .. past_len-1` are open, the other cache columns closed, and the last N
    columns are causal within the chunk (row i sees chunk columns 0..i). Rows of padding tokens
    at the end of a partly filled chunk need nothing special: real rows never see them.
    """
    if not 0 <= past_len <= cfg.cache_len:
        raise InputError(f"past_len {past_len} does not fit a cache of {cfg.cache_len} entries "
                         f"(max_seq_len {cfg.max_seq_len}, n_tokens {cfg.n_tokens})")
    n, c = cfg.n_tokens, cfg.max_seq_len
    mask = torch.full((n, c), cfg.mask_value, dtype=dtype)
    mask[:, :past_len] = 0
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    mask[:, c - n:] = torch.where(causal, torch.zeros((), dtype=dtype), torch.full((), cfg.mask_value, dtype=dtype))
    return mask[None, None]


def make_position_ids(cfg: StaticDecoderConfig, past_len: int) -> torch.Tensor:
    """int32 [1, N]: past_len, past_len+1, ...; padding rows are clamped to the table's last row."""
    pos = torch.arange(past_len, past_len + cfg.n_tokens, dtype=torch.int32)
    return pos.clamp(max=cfg.max_seq_len - 1)[None]


def past_key(i: int) -> str:
    return f"past_key_{i}_in"


def past_value(i: int) -> str:
    return f"past_value_{i}_in"


def new_key(i: int) -> str:
    return f"past_key_{i}_out"


def new_value(i: int) -> str:
    return f"past_value_{i}_out"


def position_input_names(mrope: bool = False, cos_sin: bool = False) -> tuple[str, ...]:
    """The positions inputs: position_ids int32 [1, N], M-RoPE's rope_position_ids int32 [3, 1, N]
    (llm/model/mrope.py), or RoPE's cos and sin (`cos_sin`). An M-RoPE or cos/sin graph reads no 1-axis
    position: the mask is an input and neither comes with window layers (llm_families.check_config,
    StaticDecoder), so the cache slot never enters the graph."""
    if cos_sin:
        return (POSITION_COS, POSITION_SIN)
    return (ROPE_POSITION_IDS,) if mrope else ("position_ids",)


def input_names(n_layers: int, mode: InputMode = INPUT_MODES[DEFAULT_INPUT_MODE], *, caches: bool = True,
                mrope: bool = False, cos_sin: bool = False) -> list[str]:
    kv = [past_key(i) for i in range(n_layers)] + [past_value(i) for i in range(n_layers)] if caches else []
    return [*mode.decoder_inputs, *position_input_names(mrope, cos_sin), "attention_mask", *kv]


def output_names(n_layers: int, *, caches: bool = True) -> list[str]:
    kv = [new_key(i) for i in range(n_layers)] + [new_value(i) for i in range(n_layers)] if caches else []
    return ["logits", *kv]


def first_inputs(mode: InputMode, n_tokens: int, hidden_size: int) -> tuple[torch.Tensor, ...]:
    """Zero example values of the mode's first inputs (ids int32 [1, N], embeddings float [1, N, hidden])."""
    shapes = {INPUT_IDS: lambda: torch.zeros((1, n_tokens), dtype=torch.int32),
              INPUTS_EMBEDS: lambda: torch.zeros((1, n_tokens, hidden_size))}
    return tuple(shapes[name]() for name in mode.decoder_inputs)


def example_inputs(cfg: StaticDecoderConfig, spec: DecoderSpec, *, past_len: int = 0,
                   mode: InputMode = INPUT_MODES[DEFAULT_INPUT_MODE], mrope: bool = False) -> tuple[torch.Tensor, ...]:
    """Inputs of the right shapes and dtypes (zero caches, a valid mask), in forward's order."""
    if cfg.max_seq_len > spec.max_seq_len:
        raise InputError(f"max_seq_len {cfg.max_seq_len} exceeds the decoder's RoPE table ({spec.max_seq_len})")
    n_caches = 0 if cfg.full else spec.n_layers
    ks = tuple(torch.zeros(spec.k_cache_shape(cfg.cache_len)) for _ in range(n_caches))
    vs = tuple(torch.zeros(spec.v_cache_shape(cfg.cache_len)) for _ in range(n_caches))
    pos = make_position_ids(cfg, past_len)
    if mrope:
        pos = torch.from_numpy(RopePositions.text()(pos))
    return (*first_inputs(mode, cfg.n_tokens, spec.hidden_size), pos, make_attention_mask(cfg, past_len), *ks, *vs)
