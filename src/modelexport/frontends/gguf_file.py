"""GGUF files (llama.cpp's format): what is inside, and loading one as a float32 HF causal LM.

`read_gguf_info` reads only the header through the `gguf` package's reader (gguf_reader.py: its
parse made fast for large vocabularies) (metadata, tensor table, tokenizer kind, chat template) and checks that every tensor's data lies inside the file.
`load_gguf_causal_lm` lets transformers dequantize the weights (`from_pretrained(...,
gguf_file=...)`), keeping the architecture the GGUF states; only the families of
`llm_families.FAMILIES` are accepted.
"""
from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from .llm_families import (BY_MODEL_TYPE, GGUF_ROPE_SCALING_BY_TENSOR, GGUF_ROPE_SCALINGS, SUPPORTED_GGUF_ARCHITECTURES,
                           LLMFamily, check_static_context, family_of_gguf)
from .loaded_llm import LoadedLLM, without_hf_progress_bars
from . import frontend


@dataclass(frozen=True)
class GgufTensor:
    name: str
    quant_type: str          # GGML type name: F32, F16, Q8_0, Q4_1, Q4_K, ...
    shape: tuple[int, ...]   # PyTorch order (rows first): GGUF's ne reversed
    n_elements: int
    n_bytes: int


@dataclass
class GgufInfo:
    path: str
    file_size: int
    gguf_version: int
    architecture: str
    name: str | None
    file_type: str | None            # e.g. "MOSTLY_Q4_1"
    context_length: int | None
    n_layers: int | None
    hidden_size: int | None
    intermediate_size: int | None
    n_heads: int | None
    n_kv_heads: int | None
    head_dim: int | None
    rope_theta: float | None
    rope_scaling_type: str | None    # <arch>.rope.scaling.type (none, linear, yarn, longrope), or the one a tensor states
    rope_scaling_factor: float | None  # <arch>.rope.scaling.factor
    rope_scaling: dict | None        # the HF rope parameters the scaling becomes (llm_families.GGUF_ROPE_SCALINGS)
    rope_scaling_problem: str | None  # why the scaling cannot be carried over (a key missing or unmapped)
    rms_norm_eps: float | None
    vocab_size: int | None
    tokenizer_model: str | None      # "gpt2" (byte-level BPE), "llama" (SentencePiece), ...
    tokenizer_pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None
    tied_embeddings: bool
    n_params: int
    quant_types: dict[str, int] = field(default_factory=dict)   # type name -> tensor count
    tensors: list[GgufTensor] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return self.architecture in SUPPORTED_GGUF_ARCHITECTURES

    def to_dict(self, *, with_tensors: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["supported"] = self.supported
        if not with_tensors:
            d.pop("tensors")
        else:
            d["tensors"] = [{**t, "shape": list(t["shape"])} for t in d["tensors"]]
        return d


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None or not f.types:
        return None
    from gguf import GGUFValueType
    if f.types[0] == GGUFValueType.ARRAY:
        return None  # arrays are read on purpose only (the token list alone has ~50k strings)
    return f.contents()


def _array_len(reader, key: str) -> int | None:
    f = reader.fields.get(key)
    return None if f is None else len(f.data)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise InputError(f"not a file: {path}", "pass the path of a .gguf file")


def _open_reader(path: Path):
    _check_file(path)
    from .gguf_reader import FastGGUFReader
    try:
        return FastGGUFReader(str(path), "r")
    except Exception as e:  # the reader raises ValueError/IndexError/... on damaged headers
        raise InputError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})",
                         "the file is truncated or corrupt: download or copy it again") from None


def read_gguf_matrices(path: str | Path) -> dict[str, tuple[str, Any]]:
    """Every 2-D tensor's bytes as the file stores them, not dequantized: name → (GGML type
    name, numpy uint8 [rows, bytes per row] for a quantized type, the values for F32/F16),
    memory-mapped. `gguf.quants` knows each type's block layout."""
    reader = _open_reader(Path(path))
    return {t.name: (t.tensor_type.name, t.data) for t in reader.tensors if len(t.shape) == 2}


def read_gguf_info(path: str | Path) -> GgufInfo:
    """Metadata and tensor table of a GGUF file; InputError if the file is damaged."""
    return _read_info(Path(path))[0]


# The last header parsed, by file identity. A compile reads the header first (check_source) and
# then loads the weights: parsing a 50k-token vocabulary is seconds of pure Python, so the loader
# takes the parse the check made instead of repeating it (and drops it, so the reader's mapped
# pages do not outlive the load).
_LAST_PARSED: dict[tuple, tuple] = {}


def _file_identity(path: Path) -> tuple:
    st = path.stat()
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


def _read_info(path: Path, take: bool = False):
    """(GgufInfo, reader). `take`: hand over a remembered parse and forget it (the loader)."""
    _check_file(path)
    key = _file_identity(path)
    parsed = _LAST_PARSED.pop(key, None) if take else _LAST_PARSED.get(key)
    if parsed is None:
        parsed = _parse_info(path)
        if not take:
            _LAST_PARSED.clear()
            _LAST_PARSED[key] = parsed
    return parsed


def _parse_info(path: Path):
    reader = _open_reader(path)
    import gguf
    K = gguf.Keys                                # the key names, as llama.cpp's writer spells them
    size = path.stat().st_size
    arch = _field(reader, K.General.ARCHITECTURE)
    if not isinstance(arch, str):
        raise InputError(f"{path} has no general.architecture: not a model GGUF")

    def a(key):  # an architecture-scoped key: "{arch}.block_count"
        return _field(reader, key.format(arch=arch))

    tensors, counts, n_params = [], Counter(), 0
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise InputError(f"{path} is truncated: tensor {t.name} ends at byte {end}, the file has {size}",
                             "download or copy the file again")
        name = t.tensor_type.name
        tensors.append(GgufTensor(t.name, name, tuple(int(x) for x in reversed(t.shape.tolist())),
                                  int(t.n_elements), int(t.n_bytes)))
        counts[name] += 1
        n_params += int(t.n_elements)
    ft = _field(reader, K.General.FILE_TYPE)
    try:
        file_type = gguf.LlamaFileType(ft).name if ft is not None else None
    except ValueError:
        file_type = str(ft)
    n_heads = a(K.Attention.HEAD_COUNT)
    hidden = a(K.LLM.EMBEDDING_LENGTH)
    head_dim = a(K.Rope.DIMENSION_COUNT) or a(K.Attention.KEY_LENGTH) or (
        hidden // n_heads if hidden and n_heads else None)
    vocab = a(K.LLM.VOCAB_SIZE) or _array_len(reader, K.Tokenizer.LIST)
    names = {t.name for t in tensors}
    rope_type, rope_scaling, rope_problem = _rope_scaling(reader, arch, a(K.Rope.SCALING_TYPE), names,
                                                          a(K.Rope.FREQ_BASE) or 10000.0)
    return GgufInfo(
        path=str(path), file_size=size, gguf_version=int(_field(reader, "GGUF.version") or 0),
        architecture=arch, name=_field(reader, K.General.NAME), file_type=file_type,
        context_length=a(K.LLM.CONTEXT_LENGTH), n_layers=a(K.LLM.BLOCK_COUNT), hidden_size=hidden,
        intermediate_size=a(K.LLM.FEED_FORWARD_LENGTH), n_heads=n_heads,
        n_kv_heads=a(K.Attention.HEAD_COUNT_KV) or n_heads, head_dim=head_dim,
        rope_theta=a(K.Rope.FREQ_BASE), rope_scaling_type=rope_type,
        rope_scaling_factor=a(K.Rope.SCALING_FACTOR), rope_scaling=rope_scaling, rope_scaling_problem=rope_problem,
        rms_norm_eps=a(K.Attention.LAYERNORM_RMS_EPS),
        vocab_size=vocab, tokenizer_model=_field(reader, K.Tokenizer.MODEL),
        tokenizer_pre=_field(reader, K.Tokenizer.PRE),
        bos_token_id=_field(reader, K.Tokenizer.BOS_ID),
        eos_token_id=_field(reader, K.Tokenizer.EOS_ID),
        chat_template=_field(reader, K.Tokenizer.CHAT_TEMPLATE),
        tied_embeddings="output.weight" not in names, n_params=n_params,
        quant_types=dict(sorted(counts.items())), tensors=tensors), reader


def _as_written(value):
    """A float the header or a tensor holds as float32, as the shortest decimal that round-trips
    through float32: what the HF config (JSON) the converter read said (1.1, not 1.100000023841858)."""
    import numpy as np
    return float(str(np.float32(value))) if isinstance(value, float) else value


def _llama3_from_divisors(divisors: list[float], theta: float, dims: int) -> dict:
    """HF's llama3 parameters from llama.cpp's rope_freqs: the divisor of each inverse frequency
    inv_i = theta^(-2i/dims) is 1 (short wavelengths), `factor` (long ones), or between them
    1 / ((1 - s) / factor + s) with s = original * inv / (2π (high - low)) - low / (high - low), a
    line in inv: two of them give it, and low_freq_factor 1 (every Llama 3.x config) pins the three.
    Every divisor is recomputed from the result; ValueError when they do not agree."""
    inv = [theta ** (-2 * i / dims) for i in range(len(divisors))]
    factor = max(divisors)
    mid = [(x, (1 / d - 1 / factor) / (1 - 1 / factor)) for x, d in zip(inv, divisors) if 1 + 1e-6 < d < factor - 1e-6]
    if factor <= 1 or len(mid) < 2:
        raise ValueError(f"{len(mid)} smoothed frequencies (two are needed to solve the llama3 parameters)")
    (x0, s0), (x1, s1) = mid[0], mid[-1]
    slope = (s1 - s0) / (x1 - x0)
    high = 1 - 1 / (s0 - slope * x0)                          # low = 1: the intercept is -1 / (high - 1)
    params = {"factor": _as_written(float(factor)), "low_freq_factor": 1.0,
              "high_freq_factor": float(f"{high:.6g}"),
              "original_max_position_embeddings": round(slope * 2 * math.pi * (high - 1))}
    orig, hi = params["original_max_position_embeddings"], params["high_freq_factor"]
    for x, d in zip(inv, divisors):
        wavelen = 2 * math.pi / x
        s = (orig / wavelen - 1) / (hi - 1)
        want = 1.0 if wavelen < orig / hi else factor if wavelen > orig else 1 / ((1 - s) / factor + s)
        if abs(want - d) > 1e-4 * d:
            raise ValueError(f"the divisors are not a llama3 scaling with low_freq_factor 1 ({d} where {want})")
    return params


# how parameters written only as per-frequency divisors are solved back (GgufRopeScaling.solved_from)
ROPE_SOLVERS = {"llama3": _llama3_from_divisors}


def _rope_scaling(reader, arch: str, stated: str | None, names: set[str], theta: float):
    """(scaling type, the HF rope parameters it becomes or None, the problem if it cannot be carried
    over), from the header and the small factor tensors: no weight is read. A type without a row in
    GGUF_ROPE_SCALINGS comes back without parameters: `family_of_gguf` refuses it by name."""
    by_tensor = next((t for n, t in GGUF_ROPE_SCALING_BY_TENSOR.items() if n in names), None)
    rtype = stated if stated not in (None, "none") else by_tensor or stated
    scaling = GGUF_ROPE_SCALINGS.get(rtype)  # type: ignore[arg-type]
    if scaling is None:
        return rtype, None, None

    def key(k):
        return _field(reader, f"{arch}.rope.scaling.{k}")
    problems = [f"{arch}.rope.scaling.{k} is missing" for k in scaling.required if key(k) is None]
    problems += [f"{arch}.rope.scaling.{k}={key(k)} (transformers has no parameter for it; only {v} is read)"
                 for k, v in scaling.neutral if key(k) is not None and key(k) != v]
    problems += [f"tensor {n} is missing" for n in scaling.tensor_names() if n not in names]
    if problems:
        return rtype, None, f"rope.scaling.type={rtype!r}: " + "; ".join(problems)
    tensors = {t.name: [float(x) for x in t.data.reshape(-1).tolist()] for t in reader.tensors
               if t.name in scaling.tensor_names()}
    params = {"rope_type": scaling.rope_type,
              **{p: _as_written(key(k)) for p, k in scaling.keys if key(k) is not None},
              **{p: [_as_written(x) for x in tensors[n]] for p, n in scaling.tensors}}
    if scaling.solved_from:
        name, solver = scaling.solved_from
        try:
            params.update(ROPE_SOLVERS[solver](tensors[name], theta, 2 * len(tensors[name])))
        except ValueError as e:
            return rtype, None, f"{name} (the {rtype} scaling llama.cpp stores as divisors): {e}"
    return rtype, params, None


def check_gguf_header(info: GgufInfo, max_seq_len: int | None = None) -> LLMFamily:
    """The family row of a GGUF and what its header states against it, before any weight: the
    architecture and RoPE scaling type in the table, the scaling's keys all carried over, and (given
    the static graph's length) no longrope past its original context."""
    family = family_of_gguf(info.architecture, info.rope_scaling_type, info.path)
    check_rope_scaling(info.path, info.rope_scaling_problem, info.rope_scaling, family, max_seq_len)
    return family


def check_rope_scaling(where: str, problem: str | None, rope_scaling: dict | None, family: LLMFamily,
                       max_seq_len: int | None = None) -> None:
    """`check_gguf_header`'s RoPE part, also for facts remembered from an earlier read."""
    if problem:
        raise InputError(f"{where}: {problem}",
                         "use the model's HF folder, or a GGUF as llama.cpp's convert_hf_to_gguf.py writes it "
                         "(see docs/llm_export.md, 'Families')")
    if max_seq_len is not None and rope_scaling and not family.gguf_scaled_rope_slot:
        check_static_context(family, {"rope_parameters": rope_scaling}, max_seq_len)


# Per-layer tensors an architecture always has beyond the common ones (llama.cpp's names): a file
# without them is another architecture under this label.
LAYER_TENSORS_OF_ARCH = {"qwen2": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
                         "qwen3": ("attn_q_norm.weight", "attn_k_norm.weight")}


def check_gguf_tensors(info: GgufInfo) -> None:
    """The tensor table against what the header states, before any weight is read: transformers
    would fill a layer or a tensor the file lacks with random values and carry on (a model that
    answers nonsense), or stop with a traceback on a width it did not expect. Checked from the
    header alone: every layer 0..block_count-1 is there with the same tensors and shapes as the
    others, and the token embedding is [vocab, embedding_length]."""
    fix = "use the complete file as converted (llama.cpp's convert_hf_to_gguf.py), or download it again"
    layers: dict[int, dict[str, tuple[int, ...]]] = {}
    for t in info.tensors:
        m = re.match(r"blk\.(\d+)\.(.+)$", t.name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = t.shape
    where = f"{info.path} ({info.architecture})"
    if info.n_layers is not None and sorted(layers) != list(range(info.n_layers)):
        have = f"layers {min(layers)}..{max(layers)} ({len(layers)})" if layers else "no layer tensors"
        raise InputError(f"{where} states {info.n_layers} layers but holds {have}", fix)
    kinds = set().union(*layers.values()) if layers else set()
    for i, tensors in sorted(layers.items()):
        lacking = sorted(kinds - set(tensors))
        if lacking:
            raise InputError(f"{where}: layer {i} lacks {', '.join(f'blk.{i}.{k}' for k in lacking)}, "
                             "which the other layers have", fix)
        odd = [k for k in sorted(tensors) if tensors[k] != layers[min(layers)][k]]
        if odd:
            k = odd[0]
            raise InputError(f"{where}: blk.{i}.{k} is {list(tensors[k])}, blk.{min(layers)}.{k} is "
                             f"{list(layers[min(layers)][k])}: the layers do not agree", fix)
    needed = [k for k in LAYER_TENSORS_OF_ARCH.get(info.architecture, ()) if layers and k not in kinds]
    if needed:   # transformers would give them random values and carry on
        raise InputError(f"{where}: its layers lack {', '.join(needed)}, which every {info.architecture} layer has "
                         "(a file of another architecture labelled as this one?)", fix)
    emb = next((t for t in info.tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        raise InputError(f"{where} has no token_embd.weight (the token embedding)", fix)
    want = (info.vocab_size, info.hidden_size)
    if any(w is not None and w != d for w, d in zip(want, emb.shape)):
        raise InputError(f"{where}: token_embd.weight is {list(emb.shape)}, the header states vocabulary "
                         f"{info.vocab_size} x embedding_length {info.hidden_size}", fix)


_PATCH_LOCK = threading.Lock()


@contextmanager
def _reuse_parsed_gguf(path: Path, reader):
    """While transformers loads `path`, hand it the reader already parsed here and memoize
    `gguf.get_tensor_name_map`.

    Parsing the header of a large vocabulary's GGUF takes gguf-py's own reader seconds (20 s for
    Gemma 3's 262k tokens; transformers parses it once for the model and once for the tokenizer), and transformers rebuilds the same tensor-name map
    for every submodule (~400 times). Both are looked up on the `gguf` module at call time, so
    swapping the two attributes for the duration of the load is enough; they are restored after.
    """
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    target = os.path.realpath(path)

    def reader_factory(p, *args, **kwargs):
        if os.path.realpath(p) == target and not args and kwargs.get("mode", "r") == "r":
            return reader
        return real_reader(p, *args, **kwargs)

    with _PATCH_LOCK:  # the swap is process-wide: one load at a time
        gguf.GGUFReader = reader_factory
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def _is_gguf_path(obj) -> bool:
    return isinstance(obj, (str, Path)) and str(obj).lower().endswith(".gguf")


@frontend("gguf", kind="llm", accepts=_is_gguf_path)
def load_gguf_causal_lm(path: str | Path) -> LoadedLLM:
    """Dequantize a Llama-family GGUF into a float32 HF causal LM plus its tokenizer (offline)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    info, reader = _read_info(path, take=True)
    family = check_gguf_header(info)     # before any weight is read
    check_gguf_tensors(info)
    if info.tokenizer_model is None:
        raise InputError(f"{path} carries no tokenizer (tokenizer.ggml.model missing)",
                         "use a GGUF converted with its tokenizer, or an HF folder with tokenizer files")
    folder, name = str(path.parent), path.name
    t0 = time.perf_counter()
    try:
        with _reuse_parsed_gguf(path, reader), without_hf_progress_bars():
            config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
            _apply_header_facts(config, family, reader, info)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32,
                                                         local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except (ValueError, OSError, KeyError) as e:
        raise InputError(f"transformers could not load {path}: {type(e).__name__}: {e}",
                         f"check that the GGUF is a complete {'/'.join(SUPPORTED_GGUF_ARCHITECTURES)} model file") from None
    model.eval()
    model_type = model.config.model_type
    # a family lists the GGUF names it is filed under (llama.cpp files Mistral under "llama")
    family = BY_MODEL_TYPE.get(model_type)
    if family is None or info.architecture not in family.gguf_architectures:
        raise InputError(f"{path} states architecture {info.architecture!r} but transformers built {model_type!r}")
    chat_template = info.chat_template or _template_of(tokenizer)
    if chat_template and not _template_of(tokenizer):
        tokenizer.chat_template = chat_template
    return LoadedLLM(model=model, tokenizer=tokenizer, config=model.config, source=path, source_format="gguf",
                     architecture=model_type, chat_template=chat_template, gguf_info=info,
                     load_seconds=round(time.perf_counter() - t0, 2))


def _apply_header_facts(config, family: LLMFamily, reader, info: GgufInfo) -> None:
    """What the header states and transformers' GGUF loader does not read, set on the config the
    model is built from: the family row's `gguf_config_keys`, the query scale llama.cpp derives
    from the header (Gemma), the rotated part of a head (Phi-4-mini), and the RoPE scaling (without
    it a Gemma 3 4B+ file's global layers would rotate 8 times too fast: llama.cpp scales them by
    1/8; a yarn Qwen or a longrope Phi-3.5 would lose its scaled frequencies)."""
    for key, field_name in family.gguf_config_keys:
        value = _field(reader, f"{info.architecture}.{key}")
        if value is not None:
            setattr(config, field_name, value)
    if family.query_scale_field:          # as llama.cpp scales the scores of this file
        by_width = config.num_hidden_layers in family.gguf_hidden_per_head_query_scale_at
        setattr(config, family.query_scale_field,
                config.hidden_size // config.num_attention_heads if by_width else config.head_dim)
    rope = dict(config.rope_parameters or {})
    dims = _field(reader, f"{info.architecture}.rope.dimension_count")
    if family.gguf_partial_rotary and dims:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rope["partial_rotary_factor"] = dims / head_dim
    if info.rope_scaling:
        if family.gguf_scaled_rope_slot:      # one of the per-layer-type tables
            slot = family.gguf_scaled_rope_slot
            rope[slot] = {**rope.get(slot, {}), **info.rope_scaling}
        else:
            rope.update(info.rope_scaling)
    config.rope_parameters = rope


def _template_of(tokenizer) -> str | None:
    t = getattr(tokenizer, "chat_template", None)
    return t if isinstance(t, str) and t else None
