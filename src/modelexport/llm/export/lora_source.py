"""LoRA adapters as PEFT writes them (`adapter_config.json` + `adapter_model.safetensors`), read and
checked against the base model's shapes before any weight is loaded, and the slots the decoder graphs
get for them (llm/model/lora.py).

A compile with `--lora DIR` builds the base once with, for each adapted linear, two more graph inputs:
A as [in, R] and B as [R, out] (R the largest rank given). An adapter is then a few arrays fed at run
time: B carries PEFT's scaling (lora_alpha / r, or / sqrt(r) with rsLoRA) and the user's strength, a
smaller rank is padded with zeros, and a linear the adapter leaves alone gets zeros. Another adapter
of rank <= R on the same modules needs no recompile.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.errors import InputError, UnsupportedError

CONFIG = "adapter_config.json"
GENIE_BASE = "base"       # the bundle's all-zero adapter: a Genie dialog's base model again (its reset keeps an adapter)
WEIGHTS = "adapter_model.safetensors"
# PEFT's saved names: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.([\w.]+?)\.lora_([AB])\.weight$")
# the linears of a decoder layer, by HF's path inside the layer, and their (in, out) from the config
_LINEARS = {
    "self_attn.q_proj": lambda s: (s["hidden_size"], s["num_attention_heads"] * s["head_dim"]),
    "self_attn.k_proj": lambda s: (s["hidden_size"], s["num_key_value_heads"] * s["head_dim"]),
    "self_attn.v_proj": lambda s: (s["hidden_size"], s["num_key_value_heads"] * s["head_dim"]),
    "self_attn.o_proj": lambda s: (s["num_attention_heads"] * s["head_dim"], s["hidden_size"]),
    "mlp.gate_proj": lambda s: (s["hidden_size"], s["intermediate_size"]),
    "mlp.up_proj": lambda s: (s["hidden_size"], s["intermediate_size"]),
    "mlp.down_proj": lambda s: (s["intermediate_size"], s["hidden_size"]),
}


@dataclass(frozen=True)
class LoraTarget:
    """One adapted linear: layer `layer`'s `module` (HF's path inside the layer)."""
    layer: int
    module: str
    in_features: int
    out_features: int

    @property
    def path(self) -> str:
        return f"model.layers.{self.layer}.{self.module}"

    @property
    def a_name(self) -> str:
        return f"lora_a_{self.layer}_{self.module.replace('.', '_')}"

    @property
    def b_name(self) -> str:
        return f"lora_b_{self.layer}_{self.module.replace('.', '_')}"


@dataclass(frozen=True)
class LoraSlots:
    """The graphs' LoRA inputs: rank `rank`, one (A, B) pair per target, in layer order."""
    rank: int
    targets: tuple[LoraTarget, ...]

    def of_layers(self, layers) -> list[LoraTarget]:
        return [t for t in self.targets if t.layer in layers]

    def input_names(self, layers) -> list[str]:
        return [n for t in self.of_layers(layers) for n in (t.a_name, t.b_name)]

    def shapes(self) -> dict[str, tuple[int, int]]:
        return {n: s for t in self.targets for n, s in ((t.a_name, (t.in_features, self.rank)),
                                                         (t.b_name, (self.rank, t.out_features)))}

    def to_dict(self) -> dict:
        return {"rank": self.rank, "modules": sorted({t.module for t in self.targets}),
                "layers": sorted({t.layer for t in self.targets}), "inputs": 2 * len(self.targets)}


@dataclass(frozen=True)
class LoraAdapter:
    """A PEFT adapter folder, read: its name (the folder's), rank and per-module scaling."""
    name: str
    folder: Path
    rank: int
    modules: tuple[str, ...]            # the adapted linears' paths (model.layers.3.self_attn.q_proj)
    scaling: dict[str, float]           # path -> lora_alpha / r (PEFT's), rsLoRA's alpha / sqrt(r)
    sha256: str

    def to_dict(self) -> dict:
        return {"name": self.name, "rank": self.rank, "modules": len(self.modules), "sha256": self.sha256}


@dataclass(frozen=True)
class LoraPlan:
    adapters: tuple[LoraAdapter, ...]
    slots: LoraSlots


def read_adapter(folder: str | Path, shape: dict | None = None, name: str | None = None,
                 slots: LoraSlots | None = None) -> LoraAdapter:
    """The adapter in `folder`, checked against the base's `shape` (config.json's sizes) or a bundle's
    `slots`: each module it adapts exists there with the same sizes, or the error names the module."""
    folder = Path(folder)
    cfg = _config(folder)
    modules: dict[str, int] = {}
    for key, dims in _tensor_shapes(folder / WEIGHTS).items():
        layer, module, ab = _parse_key(key, folder)
        sizes = _slot_sizes(slots, layer, module, folder) if slots else _base_sizes(shape, layer, module, folder)
        _check_sizes(f"model.layers.{layer}.{module}", ab, dims, sizes, folder)
        modules[f"model.layers.{layer}.{module}"] = dims[0] if ab == "A" else dims[1]
    if not modules:
        raise InputError(f"{folder / WEIGHTS} holds no lora_A / lora_B weights of decoder layers",
                         "give the folder PEFT's save_pretrained wrote for a LoRA adapter")
    digest = hashlib.sha256((folder / CONFIG).read_bytes() + (folder / WEIGHTS).read_bytes()).hexdigest()
    adapter = LoraAdapter(name or folder.name, folder, max(modules.values()), tuple(sorted(modules)),
                          {m: _scaling(cfg, m, r) for m, r in modules.items()}, digest)
    if slots is not None:
        check_fits(adapter, slots)
    return adapter


def _config(folder: Path) -> dict:
    if not folder.is_dir():
        raise InputError(f"--lora {folder}: not a folder", "give a PEFT adapter folder (adapter_config.json and "
                         "adapter_model.safetensors, as peft's save_pretrained writes them)")
    for f in (CONFIG, WEIGHTS):
        if not (folder / f).is_file():
            raise InputError(f"--lora {folder}: no {f} there", "give a PEFT adapter folder (adapter_config.json and "
                             "adapter_model.safetensors, as peft's save_pretrained writes them)")
    try:
        cfg = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{folder / CONFIG} is not valid JSON ({e})", "write it again with peft's save_pretrained") from None
    kind = str(cfg.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise UnsupportedError(f"{folder} is a {kind} adapter; only LoRA adapters are taken", "give a LoRA adapter")
    for key, why in (("use_dora", "DoRA's magnitude vectors"), ("modules_to_save", "modules saved whole")):
        if cfg.get(key):
            raise UnsupportedError(f"{folder}: {why} ({key}) cannot be applied as run-time inputs",
                                   "merge this adapter into the base (peft's merge_and_unload) and compile that")
    if cfg.get("bias", "none") != "none":
        raise UnsupportedError(f"{folder}: LoRA biases (bias={cfg['bias']!r}) are not taken",
                               "train with bias='none', or merge the adapter into the base and compile that")
    return cfg


def _header(path: Path) -> tuple[dict, int]:
    """The safetensors header (name -> dtype, shape, offsets) and where the data starts."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not a safetensors file ({e})", "write it again with peft's save_pretrained") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Name -> shape from the safetensors header alone (no tensor is read)."""
    return {k: v["shape"] for k, v in _header(path)[0].items()}


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (F32, F16 or BF16 stored), without torch."""
    header, start = _header(path)
    raw = np.memmap(path, np.uint8, mode="r")
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        data = np.asarray(raw[start + a:start + b])
        if h["dtype"] not in _DTYPES:
            raise UnsupportedError(f"{path}: tensor {name} is {h['dtype']}", "save the adapter in float32, float16 or bfloat16")
        out[name] = _DTYPES[h["dtype"]](data).reshape(h["shape"]).astype(np.float32)
    return out


# safetensors dtype -> bytes to numpy (bfloat16: the upper half of a float32)
_DTYPES = {"F32": lambda d: d.view(np.float32), "F16": lambda d: d.view(np.float16),
           "BF16": lambda d: (d.view(np.uint16).astype(np.uint32) << 16).view(np.float32)}


def _parse_key(key: str, folder: Path) -> tuple[int, str, str]:
    m = _KEY.search(key)
    if m is None:
        what = "an embedding's LoRA" if "lora_embedding" in key else f"weight {key!r}"
        raise UnsupportedError(f"{folder}: {what} is not a LoRA pair of a decoder layer's linear",
                               "adapt the attention and MLP projections only (target_modules), or merge the "
                               "adapter into the base and compile that")
    return int(m.group(1)), m.group(2), m.group(3)


def _base_sizes(shape: dict, layer: int, module: str, folder: Path) -> tuple[int, int]:
    path = f"model.layers.{layer}.{module}"
    if layer >= shape["num_hidden_layers"]:
        raise InputError(f"{folder} adapts {path}, but the base has {shape['num_hidden_layers']} layers",
                         "give the adapter trained for this base model")
    if module not in _LINEARS:
        raise UnsupportedError(f"{folder} adapts {path}, which is not one of the decoder's projections "
                               f"({', '.join(m.split('.')[1] for m in _LINEARS)})",
                               "give an adapter of those projections, or merge it into the base and compile that")
    return _LINEARS[module](shape)


def _slot_sizes(slots: LoraSlots, layer: int, module: str, folder: Path) -> tuple[int, int]:
    t = next((t for t in slots.targets if t.layer == layer and t.module == module), None)
    if t is None:
        raise InputError(f"adapter {folder.name!r} adapts model.layers.{layer}.{module}, which the bundle has no LoRA "
                         "input for", f"compile the base again with --lora {folder}")
    return t.in_features, t.out_features


def _check_sizes(path: str, ab: str, dims: list[int], sizes: tuple[int, int], folder: Path) -> None:
    want = sizes[0] if ab == "A" else sizes[1]
    got = dims[1] if ab == "A" and len(dims) == 2 else dims[0] if len(dims) == 2 else None
    if got != want:
        side = "input" if ab == "A" else "output"
        raise InputError(f"{folder} is for another base: its {path}.lora_{ab} has {side} size {got}, this model's "
                         f"{path} {want}", "give the adapter trained for this base model")


def slots_from_inputs(shapes: dict[str, list[int]]) -> LoraSlots | None:
    """The slots of a bundle's graphs, from their LoRA inputs' names and shapes (None: it has none)."""
    by_suffix = {m.replace(".", "_"): m for m in _LINEARS}
    targets, rank = {}, 0
    for name, shape in shapes.items():
        m = re.fullmatch(r"lora_a_(\d+)_(\w+)", name)
        if m and m.group(2) in by_suffix:
            b = shapes.get(f"lora_b_{m.group(1)}_{m.group(2)}")
            targets[(int(m.group(1)), list(_LINEARS).index(by_suffix[m.group(2)]))] = \
                LoraTarget(int(m.group(1)), by_suffix[m.group(2)], int(shape[0]), int(b[1]))
            rank = int(shape[1])
    return LoraSlots(rank, tuple(targets[k] for k in sorted(targets))) if targets else None


def _scaling(cfg: dict, path: str, rank: int) -> float:
    """PEFT's scaling of one module: its alpha (alpha_pattern's, else lora_alpha) over r, or over
    sqrt(r) with use_rslora."""
    alpha = float(cfg.get("lora_alpha", 8))
    for pattern, a in (cfg.get("alpha_pattern") or {}).items():
        if re.search(rf"(^|\.){pattern}$", path):
            alpha = float(a)
            break
    return alpha / (math.sqrt(rank) if cfg.get("use_rslora") else rank)


def plan_lora(folders: list[str] | tuple[str, ...], shape: dict | None, family_fused: bool) -> LoraPlan | None:
    """The adapters of `--lora` and the slots that hold every one of them (None: no --lora)."""
    if not folders:
        return None
    need = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
    if not shape or any(k not in shape for k in need):
        raise UnsupportedError("--lora takes a Hugging Face model folder's config for the shapes it checks; this "
                               "source gives none", "compile the base model's Hugging Face folder with --lora")
    shape = full_shape(shape)
    if family_fused:
        raise UnsupportedError("--lora: this family fuses its projections (qkv_proj / gate_up_proj), which the "
                               "graphs split", "merge the adapter into the base (peft's merge_and_unload) and compile that")
    adapters = [read_adapter(f, shape) for f in folders]   # each checked against the base
    names = [a.name for a in adapters]
    if GENIE_BASE in names:
        raise InputError(f"--lora: an adapter folder is named {GENIE_BASE!r}, the name the bundle gives the base model",
                         "rename the adapter's folder")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"--lora: two adapter folders are both named {dup[0]!r}", "give each adapter folder its own name")
    return LoraPlan(tuple(adapters), slots_for(adapters, shape))


def full_shape(shape: dict) -> dict:
    """config.json's sizes with HF's defaults: KV heads = heads, head_dim = hidden / heads."""
    heads = shape["num_attention_heads"]
    return {**shape, "num_key_value_heads": shape.get("num_key_value_heads") or heads,
            "head_dim": shape.get("head_dim") or shape["hidden_size"] // heads}


def slots_for(adapters, shape: dict) -> LoraSlots:
    paths = sorted({m for a in adapters for m in a.modules},
                   key=lambda p: (int(p.split(".")[2]), list(_LINEARS).index(p.split(".", 3)[3])))
    targets = []
    for p in paths:
        layer, module = int(p.split(".")[2]), p.split(".", 3)[3]
        targets.append(LoraTarget(layer, module, *_LINEARS[module](shape)))
    return LoraSlots(max(a.rank for a in adapters), tuple(targets))


def check_fits(adapter: LoraAdapter, slots: LoraSlots) -> None:
    """A run-time adapter fits the bundle's slots: rank <= the slots' and only modules that have one."""
    if adapter.rank > slots.rank:
        raise InputError(f"adapter {adapter.name!r} has rank {adapter.rank}; the bundle was built for LoRA rank "
                         f"{slots.rank} at most", f"compile the base again with --lora {adapter.folder}")
    have = {t.path for t in slots.targets}
    extra = [m for m in adapter.modules if m not in have]
    if extra:
        raise InputError(f"adapter {adapter.name!r} adapts {extra[0]}, which the bundle has no LoRA input for "
                         f"({len(extra)} such module{'s' if len(extra) > 1 else ''})",
                         f"compile the base again with --lora {adapter.folder}")


def adapter_arrays(adapter: LoraAdapter, slots: LoraSlots, strength: float = 1.0, dtype=np.float16) -> dict:
    """{input name: array} of this adapter in the slots: A^T [in, R], B^T [R, out] times its scaling and
    `strength`, zero-padded to rank R; zeros for the slots' modules it leaves alone. float16: the graphs'
    LoRA inputs (Genie fills such inputs of float16 or 8/16-bit fixed point only); float32 for Genie's files."""
    check_fits(adapter, slots)
    weights = {}
    for key, t in read_tensors(adapter.folder / WEIGHTS).items():
        layer, module, ab = _parse_key(key, adapter.folder)
        weights[(f"model.layers.{layer}.{module}", ab)] = t
    out = {}
    for t in slots.targets:
        a = np.zeros((t.in_features, slots.rank), np.float32)
        b = np.zeros((slots.rank, t.out_features), np.float32)
        if (t.path, "A") in weights:
            wa, wb = weights[(t.path, "A")], weights[(t.path, "B")]
            r = wa.shape[0]
            a[:, :r] = wa.T
            b[:r, :] = wb.T * (adapter.scaling[t.path] * strength)
        out[t.a_name], out[t.b_name] = a.astype(dtype), b.astype(dtype)
    return out


def zero_arrays(slots: LoraSlots, dtype=np.float16) -> dict:
    """The base model alone: every LoRA input zero."""
    return {n: np.zeros(s, dtype) for n, s in slots.shapes().items()}
