"""`genie_config.json` for Qualcomm's Genie runtime, checked by the real Genie config parser.

The config is written next to the context binaries (paths in it are relative to the bundle
folder: run `genie-t2t-run -c genie_config.json` from there). At build time Genie's own parser
checks it and Genie creates a dialog with it on the host twins (toolchain/genie.py,
genie_dialog.py); a config or bundle Genie rejects fails the compile with Genie's message.
"""
from __future__ import annotations

from typing import Any

from ...core.errors import UnsupportedError

N_THREADS = 3   # the engine's "n-threads"


def genie_config(*, ctx_bins: list[str], tokenizer: str, context_size: int, vocab: int, bos: int | None,
                 eos: list[int], head_dim: int, embedding: dict[str, Any] | None = None) -> dict[str, Any]:
    """`bos`: the id Genie puts before a conversation, None when the model's tokenizer adds none.
    `embedding`: the dialog's token → embedding table for a decoder that takes `inputs_embeds`
    (`lut_embedding`); Genie finds the decoder's input by that name and looks every token up there.

    Positions go in as `position_ids` ("absolute"): the graphs gather their RoPE tables themselves,
    computed from the HF model's own `inv_freq` and attention scaling, so llama3 / linear / yarn
    scaling is inside the graph and Genie needs no RoPE facts. With "rope", Genie would feed
    `position_ids_cos` / `_sin` inputs the graphs do not have ("Could not find I/O tensors").
    Graphs built with `--positions cos-sin` take exactly those: their config's block is genie_rope's."""
    pe: dict[str, Any] = {"type": "absolute"}
    return {"dialog": {
        "version": 1,
        "type": "basic",
        **({"embedding": embedding} if embedding else {}),
        "context": {"version": 1, "size": int(context_size), "n-vocab": int(vocab),
                    "bos-token": int(bos) if bos is not None else -1, "eos-token": [int(e) for e in eos] or [-1]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {
            "version": 1,
            "n-threads": N_THREADS,
            "backend": {"version": 1, "type": "QnnHtp",
                        "QnnHtp": {"version": 1, "use-mmap": True, "spill-fill-bufsize": 0, "mmap-budget": 0,
                                   "poll": True, "cpu-mask": "0xe0", "kv-dim": int(head_dim),
                                   "allow-async-init": False}},
            "model": {"version": 1, "type": "binary",
                      "binary": {"version": 1, "ctx-bins": list(ctx_bins)},
                      "positional-encoding": pe},
        },
    }}


# transformers' rope_parameters → Genie's rope-scaling keys, by rope type (Genie computes cos and sin itself)
GENIE_ROPE_SCALING = {"llama3": {"factor": "factor", "low_freq_factor": "low-freq-factor",
                                 "high_freq_factor": "high-freq-factor",
                                 "original_max_position_embeddings": "original-max-position-embeddings"}}


def genie_rope(qmeta: dict[str, Any]) -> dict[str, Any]:
    """The `positional-encoding` block of a `--positions cos-sin` decoder: Genie's "rope" with the model's
    theta, its rotary width and, for llama3 scaling, its factors. Another scaling type Genie would compute
    differently from the graphs' tables is refused."""
    params = qmeta.get("rope_parameters") or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    block: dict[str, Any] = {"type": "rope", "rope-dim": int(qmeta["rope_dim"]),
                             "rope-theta": float(qmeta["rope_theta"])}
    if kind == "default":
        return block
    keys = GENIE_ROPE_SCALING.get(kind)
    if keys is None:
        raise UnsupportedError(f"--positions cos-sin: Genie's rope block has no form of {kind} RoPE scaling",
                               "leave --positions out (the graphs then take position_ids and gather their own tables)")
    return {**block, "rope-scaling": {"rope-type": kind,
                                      **{g: params[k] for k, g in keys.items() if k in params}}}


def lut_embedding(lut: str, hidden_size: int) -> dict[str, Any]:
    """The dialog's `embedding` block for a table of float32 rows (`lut`, relative to the bundle
    folder): a text query is tokenized and looked up there, and so is each generated token;
    `GenieDialog_embeddingQuery` takes float32 embeddings of `hidden_size` per position, which Genie
    converts to the graph input's type (a float input: the residual stream stays float)."""
    return {"version": 1, "type": "lut", "lut-path": lut, "size": int(hidden_size), "datatype": "float32"}


def lora_block(adapters: list[tuple[str, str]]) -> dict[str, Any]:
    """The model binary's `lora` block for (name, folder) adapters: Genie's file-based LoRA (lora-version 1)
    copies `folder/<input name>.raw` (float32, C order) into each LoRA graph input of float16 when
    `GenieDialog_applyLora(dialog, "primary", name)` is called; folders relative to where Genie runs.
    A dialog starts without one, and its reset keeps the one applied."""
    return {"version": 1, "lora-version": 1,
            "adapters": [{"version": 1, "name": name, "path": folder} for name, folder in adapters]}


def lora_files(arrays: dict) -> list[tuple[str, Any]]:
    """(file name, float32 C-order array) of each LoRA input, as Genie's file-based LoRA reads them."""
    import numpy as np   # deferred: numpy, for --lora only
    return [(f"{name}.raw", np.ascontiguousarray(arr, np.float32)) for name, arr in arrays.items()]
