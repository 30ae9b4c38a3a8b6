"""Hugging Face model folders (config.json + safetensors + tokenizer files), loaded offline.

Also writes such a folder from an already loaded LLM (e.g. one dequantized from a GGUF):
`save_pretrained` on a GGUF-loaded model refuses while the GGUF quantization config is
attached, so the weights are copied into a fresh model of the same class built from a clean
config, and that one is saved.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

from ..core.errors import InputError, OutputExistsError
from . import frontend
from .llm_families import check_config, family_of
from .loaded_llm import LoadedLLM, without_hf_progress_bars

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
_BPE_PAIR = ("vocab.json", "merges.txt")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in _TOKENIZER_FILES) or all((folder / f).is_file() for f in _BPE_PAIR)


def _is_hf_folder(obj) -> bool:
    return isinstance(obj, (str, Path)) and Path(obj).is_dir() and (Path(obj) / "config.json").is_file()


def _safetensors_shortfall(f: Path) -> int:
    """How many bytes `f` lacks against its own header (the header's largest data offset): a download
    cut short. 0 when whole; -1 when the header itself is unreadable."""
    try:
        with f.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return -1
            (n,) = struct.unpack("<Q", head)
            header = json.loads(fh.read(n)) if n < (100 << 20) else None
    except (OSError, ValueError):
        return -1
    if not isinstance(header, dict):
        return -1
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
               and "data_offsets" in v), default=0)
    return max(0, 8 + n + end - f.stat().st_size)


def check_hf_files(folder: Path) -> None:
    """The files an HF folder needs besides its config (read_hf_config checks that first), checked
    before any weight is read and before hashing gigabytes: every weight shard its index lists, each
    shard as long as its own header says, a tokenizer."""
    shards = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            listed = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InputError(f"{index} is not a valid weight index ({type(e).__name__}: {e})",
                             "copy the model's original model.safetensors.index.json into the folder") from None
        missing = [s for s in listed if not (folder / s).is_file()]
        if missing:
            raise InputError(f"{folder} lacks {len(missing)} of the {len(listed)} weight shards its index lists: "
                             f"{', '.join(missing)}",
                             "copy the missing shard files into the folder (every file model.safetensors.index.json "
                             "names), or download the model again")
    if not shards:
        raise InputError(f"{folder} has no *.safetensors weights",
                         "save the model with save_pretrained(..., safe_serialization=True)")
    for f in shards:
        short = _safetensors_shortfall(f)
        if short:
            what = "has no readable safetensors header" if short < 0 else f"is {short:,} bytes shorter than its header says"
            raise InputError(f"weight shard {f} {what}: the file is truncated or corrupt",
                             "copy that file again from the model's original files, or download the model again")
    if not _has_tokenizer(folder):
        raise InputError(f"{folder} has no tokenizer (none of tokenizer.json, tokenizer.model, vocab.json+merges.txt)",
                         "save the tokenizer into the folder too: tokenizer.save_pretrained(folder)")


def read_hf_config(folder: Path):
    """The transformers config of an HF folder, checked against the family table (its row exists,
    its feature values are in the row) before any weight is read."""
    from transformers import AutoConfig

    if not folder.is_dir():
        raise InputError(f"HF model folder not found: {folder}")
    if not (folder / "config.json").is_file():
        raise InputError(f"{folder} has no config.json: not a Hugging Face model folder")
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{folder}/config.json is not valid JSON: {e}") from None
    family = family_of(raw.get("model_type") if isinstance(raw, dict) else None, str(folder))
    check_config(family, raw, str(folder))    # the fields as written, named as written
    try:   # transformers fills what config.json leaves out (layer_types, rope_parameters) as the model will
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - its validators raise ValueError, TypeError, huggingface_hub's errors ...
        raise InputError(f"{folder}/config.json is not a valid {family.label} config: {type(e).__name__}: {e}",
                         "compare it with the model's original config.json") from None
    check_config(family, config, str(folder))  # and as transformers completes them
    return config


@frontend("hf_folder", kind="llm", accepts=_is_hf_folder)
def load_hf_folder(path: str | Path, dtype=None) -> LoadedLLM:
    """A float32 causal LM and its tokenizer from a local HF folder; never touches the network.
    `dtype` (e.g. torch.bfloat16, for a bf16 checkpoint used only as a weight source) loads the
    parameters in that type instead: half the memory of float32 (buffers stay float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    folder = Path(path)
    config = read_hf_config(folder)   # the family table first, then the files, then the weights
    check_hf_files(folder)
    arch = config.model_type
    try:
        with without_hf_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError, KeyError) as e:
        raise InputError(f"transformers could not load {folder}: {type(e).__name__}: {e}") from None
    model.eval()
    template = getattr(tokenizer, "chat_template", None)
    return LoadedLLM(model=model, tokenizer=tokenizer, config=model.config, source=folder, source_format="hf",
                     architecture=arch, chat_template=template if isinstance(template, str) and template else None,
                     load_seconds=round(time.perf_counter() - t0, 2))


def write_hf_folder(llm: LoadedLLM, out_dir: str | Path, *, dtype=None, force: bool = False) -> Path:
    """Write `llm` as a plain HF folder (safetensors + config + tokenizer + chat template).

    `dtype` defaults to float32 (what the frontends load; bf16 halves the size but rounds the
    dequantized weights). Written to a temporary sibling folder, then renamed into place; an
    existing folder is replaced only with `force=True`.
    """
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    if out.exists() and not force:
        raise OutputExistsError(f"{out} already exists", "pass force=True (--force) to replace it")
    dtype = dtype or torch.float32
    config = copy.deepcopy(llm.model.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = dtype
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {k: v.detach().to(dtype) for k, v in llm.model.state_dict().items()}
    missing, unexpected = fresh.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not _tied_alias(fresh, k)]
    if missing or unexpected:
        raise InputError(f"the weights do not fit a fresh {type(fresh).__name__}: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    fresh.tie_weights()
    _materialize_buffers(fresh, llm.model)
    if llm.chat_template and not isinstance(getattr(llm.tokenizer, "chat_template", None), str):
        llm.tokenizer.chat_template = llm.chat_template

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fresh.save_pretrained(tmp, safe_serialization=True)
        llm.tokenizer.save_pretrained(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _tied_alias(model, key: str) -> bool:
    return key == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))


def _materialize_buffers(fresh, source) -> None:
    """Non-persistent buffers (RoPE inv_freq) were created on the meta device: take the source's."""
    src = dict(source.named_buffers())
    for name, buf in list(fresh.named_buffers()):
        if buf.is_meta:
            mod_name, _, attr = name.rpartition(".")
            mod = fresh.get_submodule(mod_name) if mod_name else fresh
            mod._buffers[attr] = src[name].detach().clone()
