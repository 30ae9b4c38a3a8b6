"""What a static decoder takes as its first input(s): token ids, embeddings, or both (`compile LLM --inputs`).

One row per mode; the decoder, its export, its calibration, the bundle and the runtime read the row,
never the mode's name. The embeddings are those entering the first decoder layer: the family's
embedding scale (Gemma: x sqrt(hidden)) is applied by whoever looks the ids up (the decoder in
`tokens` / `both`, the bundle's embedder part in `embeddings`), never by the decoder to an
`inputs_embeds` it is given, so an embedder's output and a vision projector's features (a VLM's)
are fed the same way.

`both`: the decoder looks each id up and adds `inputs_embeds` to it; an id of `vocab_size` or more
(the manifest's `no_token_id`) looks nothing up, so that position's embedding is `inputs_embeds`
alone. Plain text is ids with zero embeddings (exactly the token path), a VLM's image positions
carry `no_token_id` and the projected features: every position is one or the other, no caller
has to subtract a table row, and the text path keeps its table inside the decoder (no embedder part).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import InputError

INPUT_IDS = "input_ids"
INPUTS_EMBEDS = "inputs_embeds"   # transformers' name for the same thing
# `--positions cos-sin`: RoPE's cos and sin of each token [1, 1, N, rotary_dim/2] as inputs, under the names
# AI Hub's and GenieX's graphs use (GenieX feeds only these); the graph then reads no position id
POSITION_COS, POSITION_SIN = "position_ids_cos", "position_ids_sin"
POSITIONS = ("ids", "cos-sin")
ROPE_TABLE = "rope_table.npz"   # cos and sin [max_seq_len, rotary_dim/2] by position, for the runtimes that feed them


@dataclass(frozen=True)
class InputMode:
    name: str
    decoder_inputs: tuple[str, ...]   # the decoder's first inputs, in order (then position_ids, attention_mask, caches)
    embedder: bool                    # the bundle carries an embedder part (ids -> embeddings) for text
    text_embeds: str | None           # what plain text feeds as inputs_embeds: "lookup" (the embedder's output), "zeros"
    what: str

    @property
    def takes_ids(self) -> bool:
        return INPUT_IDS in self.decoder_inputs

    @property
    def takes_embeddings(self) -> bool:
        return INPUTS_EMBEDS in self.decoder_inputs


INPUT_MODES = {m.name: m for m in (
    InputMode("tokens", (INPUT_IDS,), False, None, "token ids; the embedding lookup is the decoder's first op"),
    InputMode("embeddings", (INPUTS_EMBEDS,), True, "lookup",
              "embeddings [1, N, hidden] entering layer 0; the bundle's embedder part looks text up"),
    InputMode("both", (INPUT_IDS, INPUTS_EMBEDS), False, "zeros",
              "ids looked up and inputs_embeds added; an id >= vocab_size (no_token_id) looks nothing up"),
)}
DEFAULT_INPUT_MODE = "tokens"


def get_input_mode(name: str | None) -> InputMode:
    mode = INPUT_MODES.get((name or DEFAULT_INPUT_MODE).strip().lower())
    if mode is None:
        raise InputError(f"--inputs {name!r} is not an input mode",
                         f"choose one of: {', '.join(INPUT_MODES)} (default {DEFAULT_INPUT_MODE})")
    return mode


def text_inputs(mode: InputMode, ids, lookup, hidden_size: int) -> dict:
    """The decoder's first inputs for plain text, {name: numpy array}: `ids` int32 [1, N]; `lookup(ids)`
    gives float32 embeddings [1, N, hidden] (the embedder part, or the float decoder's own lookup when
    calibrating), called only when the mode feeds them."""
    import numpy as np
    out = {}
    if mode.takes_ids:
        out[INPUT_IDS] = ids
    if mode.text_embeds == "lookup":
        out[INPUTS_EMBEDS] = np.ascontiguousarray(lookup(ids), dtype=np.float32)
    elif mode.text_embeds == "zeros":
        out[INPUTS_EMBEDS] = np.zeros((*np.shape(ids), hidden_size), np.float32)
    return out


def no_token_id(mode: InputMode, table_rows: int, head_rows: int, tokenizer_size: int) -> int | None:
    """`both`: the id that looks nothing up (the manifest's `no_token_id`), None for the other modes.
    It is the table's row count, and stands for "no token" only when that is also lm_head's row
    count (the vocabulary the logits index) and above every id the tokenizer makes: else an id the
    model can emit or the tokenizer writes would be taken for an image position, or the reverse."""
    if mode.name != "both":
        return None
    if table_rows != head_rows:
        raise InputError(f"--inputs both needs one vocabulary: the embedding table has {table_rows} rows and lm_head "
                         f"{head_rows}, so no id is both past the table and outside the logits (no_token_id)",
                         "compile with --inputs embeddings (the embedder part looks text up) or --inputs tokens")
    if tokenizer_size > table_rows:
        raise InputError(f"--inputs both: the tokenizer has {tokenizer_size} ids and the embedding table {table_rows} "
                         f"rows, so the tokenizer's ids from {table_rows} on would be taken for no_token_id",
                         "compile with --inputs embeddings or --inputs tokens")
    return int(table_rows)
