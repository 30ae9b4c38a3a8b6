"""The bundle's graphs as the folder GenieX loads (`compile LLM --positions cos-sin --geniex`).

GenieX, Qualcomm's open successor to Genie (`qualcomm/geniex-qairt-plugin`, read at fb1c582), loads a
flat folder: the context binaries, `metadata.json`, `genie_config.json`, `tokenizer.json` and
`tokenizer_config.json` side by side (`core/src/llm/llm_spec_loader.cpp`). It finds each graph by its
name in the binary, `(<type>_)?ar<N>_cl<C>_<i>_of_<n>`, with exactly two AR sizes (the larger prefills);
reads each graph's tensors from `metadata.json` (`model_files`, keyed by those names; only `shape` is
read) and takes the KV head count from the first dimension of `past_key_*` there, so the caches are
listed as [kv_heads, 1, ...] (the same bytes as our [1, kv_heads, ...]); feeds RoPE only as
`position_ids_cos` / `_sin`, computed from `rope-theta` and `rope-scaling` in the config; and picks its
model code by `model_id`'s prefix. The graphs are the bundle's own: each binary is copied with its
graphs renamed to their manifest names (toolchain/qnn_context/rename.py), and read back.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...contract.llm_records import GenieXFolder
from ...core.errors import UnsupportedError
from ...core.vocab import Role
from ...toolchain.qnn_context.rename import rename_graphs

# GenieX's model code by `model_id` prefix (models/dispatch.h); the others load as Llama 3
MODEL_ID_PREFIX = {"qwen3": "qwen3_", "qwen2": "qwen2_5_", "phi3": "phi_3_5_"}
DEFAULT_PREFIX = "llama_v3_"


def check_request(opts: Any, variants: list[int], max_seq_len: int) -> None:
    """What GenieX's folder needs, said before any weight loads."""
    if (opts.positions or "ids") != "cos-sin":
        raise UnsupportedError("--geniex: GenieX feeds RoPE only as position_ids_cos / _sin",
                               "add --positions cos-sin")
    if len([n for n in variants if n != max_seq_len]) != 2:
        raise UnsupportedError("--geniex: GenieX runs exactly two graph sizes, one to prefill and one to decode",
                               "give two variants, e.g. --variants ar1,ar32")
    if (opts.inputs or "tokens") != "tokens" or opts.lora:
        raise UnsupportedError("--geniex: the folder is built for token-id decoders without LoRA inputs",
                               "leave --inputs and --lora out, or leave --geniex out")


def kv_shape(name: str, shape: list) -> list:
    """A tensor's shape as GenieX reads it: a cache's [1, H, a, b] as [H, 1, a, b] (the same bytes)."""
    if name.startswith("past_") and len(shape) == 4 and shape[0] == 1:
        return [shape[1], 1, shape[2], shape[3]]
    return list(shape)


def metadata(manifest, target: str) -> dict:
    graphs = [g for g in manifest.graphs if g.target == target and g.n_tokens != manifest.llm.max_seq_len]
    io = {g.name: {"inputs": {t.name: {"shape": kv_shape(t.name, t.shape)} for t in g.inputs},
                   "outputs": {t.name: {"shape": kv_shape(t.name, t.shape)} for t in g.outputs}} for g in graphs}
    prefix = MODEL_ID_PREFIX.get(manifest.llm.architecture, DEFAULT_PREFIX)
    return {"model_id": f"{prefix}{manifest.llm.architecture}_modelexport", "model_files": io}


def write_folder(a, target: str, genie_cfg: dict[str, Any], tokenizer: Path) -> GenieXFolder:
    """`<target>/geniex/`: the renamed binaries (rename_graphs reads each back through libQnnSystem),
    metadata.json, the config and the tokenizer files."""
    m, folder = a.m, f"{target}/geniex"
    graphs = [g for g in m.graphs if g.target == target and g.n_tokens != m.llm.max_seq_len]
    by_binary: dict[str, dict[str, str]] = {}
    for g in graphs:
        by_binary.setdefault(str(g.file), {})[g.qnn_graph_name] = g.name
    bins = []
    for rel, names in by_binary.items():
        out = a.w.path(f"{folder}/{Path(rel).name}", role=Role.GENIEX)
        out.write_bytes(rename_graphs(a.w.dir.joinpath(rel).read_bytes(), names))   # read back there
        bins.append(out.name)
    meta = metadata(m, target)
    a.w.path(f"{folder}/metadata.json", role=Role.GENIEX_CONFIG).write_text(json.dumps(meta, indent=1))
    cfg = json.loads(json.dumps(genie_cfg))
    cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = sorted(bins)
    cfg["dialog"]["tokenizer"]["path"] = "tokenizer.json"
    a.w.path(f"{folder}/genie_config.json", role=Role.GENIEX_CONFIG).write_text(json.dumps(cfg, indent=2))
    _tokenizer_files(tokenizer.parent, folder, a.w.path)
    return GenieXFolder(folder=folder, model_id=meta["model_id"], binaries=sorted(bins),
                        graphs=sorted(meta["model_files"]))


def _tokenizer_files(src: Path, folder: str, place: Callable[..., Path]) -> None:
    """tokenizer.json, and tokenizer_config.json with the `chat_template` string GenieX's pipeline requires."""
    shutil.copyfile(src / "tokenizer.json", place(f"{folder}/tokenizer.json", role=Role.GENIEX_CONFIG))
    config_path = src / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    if not isinstance(config.get("chat_template"), str):
        chat = src / "chat_template.jinja"
        config["chat_template"] = chat.read_text() if chat.exists() else "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    place(f"{folder}/tokenizer_config.json", role=Role.GENIEX_CONFIG).write_text(json.dumps(config, indent=1))
