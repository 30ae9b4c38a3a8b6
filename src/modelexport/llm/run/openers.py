"""The LLM backends `modelexport.llm.load` can open, registered by name.

cpu      an ExecuTorch XNNPACK program (`cpu_runtime`): given a GGUF or HF folder it is built
         once and cached by the weights' sha256 + options (`xnnpack_export`); a `.pte` or a
         bundle carrying one is used as is.
htp-sim  the compiled QNN graphs of an LLM bundle on the x86 HTP simulator: registered by the
         format that writes those bundles (`modelexport.backends.llm_qnn.session`).
"""
from __future__ import annotations

import time
from pathlib import Path

from ...contract.bundle import open_bundle
from ...core.errors import InputError
from ...core.formats import retired
from ...core.vocab import BundleKind
from ...frontends.gguf_file import read_gguf_info
from ...frontends.hf_folder import read_hf_config
from ...frontends.llm_families import check_model_context
from ...frontends.source_hash import recorded_source
from .. import LLM, LLM_BACKENDS, LoadOptions, attach_tokenizer
from .tokenizers import load_tokenizer, load_tokenizer_json


def source_kind(path: Path) -> str:
    """gguf | hf | pte | bundle; InputError for anything else."""
    if not path.exists():
        raise InputError(f"{path} does not exist",
                         "give a .gguf file, a Hugging Face model folder, a .pte or a modelexport bundle (`modelexport compile` makes one)")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return "bundle"
        if (path / "config.json").is_file():
            return "hf"
        raise InputError(f"{path} is neither a bundle (manifest.json) nor a Hugging Face folder (config.json)",
                         "give a .gguf file, a Hugging Face model folder, a .pte or a modelexport bundle")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"GGUF":
        return "gguf"
    if len(head) >= 8 and head[4:8] == b"ET12":  # ExecuTorch flatbuffer identifier
        return "pte"
    if path.suffix == ".pte":
        return "pte"
    raise InputError(f"{path} is not a GGUF, an ExecuTorch program or a model folder",
                     "give a .gguf file, a Hugging Face model folder, a .pte or a modelexport bundle")


_KIND_NAMES = {"hf": "a Hugging Face folder (float weights)", "pte": "an ExecuTorch program, already built",
               "bundle": "an LLM bundle"}


def open_llm_bundle(path: Path):

    bundle = open_bundle(path)
    if bundle.manifest.kind != BundleKind.LLM:
        raise InputError(f"{path} is a '{bundle.manifest.kind}' bundle, not an LLM",
                         "generate runs LLM bundles (modelexport compile of a GGUF or HF folder), GGUF files or HF folders")
    gone = retired(bundle.manifest.format, bundle.manifest.kind)
    if gone:
        raise InputError(f"{path} is {gone[0]}", gone[1])
    return bundle


# --------------------------------------------------------------------------------------------
DEFAULT_CPU_CONTEXT = 2048


def model_context(path: Path) -> int | None:
    """The context a GGUF file or HF folder was trained for, from its header or config.json (no weight read)."""
    kind = source_kind(path)
    if kind == "gguf":
        own = read_gguf_info(path).context_length
    elif kind == "hf":
        own = getattr(read_hf_config(path), "max_position_embeddings", None)
    else:
        own = None
    return int(own) if own else None


def require_context(path: Path, max_seq_len: int) -> None:
    """Refuse a --max-seq-len beyond the model's own context before any weight is loaded."""
    check_model_context(max_seq_len, model_context(path))


def _cpu_context(path: Path, asked: int | None) -> int:
    """--max-seq-len as given (checked); unset: 2048, capped at the model's own context (a small model's
    default must not be refused as "beyond the model's context" for a flag the user never gave)."""
    if asked is not None:
        require_context(path, asked)
        return asked
    own = model_context(path)
    return min(DEFAULT_CPU_CONTEXT, own) if own else DEFAULT_CPU_CONTEXT


@LLM_BACKENDS.register("cpu")
def open_cpu(path: Path, opts: LoadOptions) -> LLM:
    from ..cpu.session import ExecuTorchSession, default_threads
    from ..cpu.export import CpuExportOptions, build_cached

    kind = source_kind(path)
    info: dict = {"source": str(path), "source_kind": kind}
    tokenizer = None
    if kind == "bundle":   # LLM bundles hold NPU graphs: the CPU program is built from the model they came from
        bundle = open_llm_bundle(path)
        src = bundle.manifest.source
        if not src.path or not Path(src.path).exists():
            raise InputError(f"bundle {path} carries no CPU program and its source model "
                             f"({src.path or 'not recorded'}) is not on this machine",
                             "run generate on the GGUF or HF folder itself, or use --backend htp-sim")
        path = recorded_source(bundle.manifest, "building its CPU program")
        kind = source_kind(path)
        info.update(bundle=str(bundle.path), source=str(path), source_kind=kind)
    if not opts.gguf_blocks and kind != "gguf":   # nothing to re-quantize: say so rather than ignore it
        raise InputError(f"--requantize-gguf applies to a GGUF file; {path.name} is {_KIND_NAMES[kind]}",
                         "leave --requantize-gguf out")
    if kind in ("gguf", "hf"):
        t0 = time.perf_counter()
        eopts = CpuExportOptions(quant=opts.quant, max_seq_len=_cpu_context(path, opts.max_seq_len),
                                 gguf_blocks=opts.gguf_blocks)
        entry, meta, hit = build_cached(path, eopts, progress=opts.progress, use_cache=opts.use_cache,
                                        cache_dir=opts.cache_dir)
        info.update(pte=str(entry / meta["pte"]), cache_hit=hit, build_s=round(time.perf_counter() - t0, 2),
                    export=meta, quant=opts.quant, model=path.name)
        pte = entry / meta["pte"]
        if tokenizer is None and opts.tokenizer is None:
            tokenizer = load_tokenizer_json(entry / "tokenizer.json")
    elif kind == "pte":
        pte = path
        info.update(pte=str(pte), model=pte.name)
        if tokenizer is None and opts.tokenizer is None:
            beside = pte.parent / "tokenizer.json"
            if not beside.is_file():
                raise InputError(f"no tokenizer for {pte}", "pass --tokenizer (tokenizer.json, a .model or a .gguf)")
            tokenizer = load_tokenizer_json(beside)
    if opts.tokenizer is not None:
        tokenizer = load_tokenizer(opts.tokenizer)
    t0 = time.perf_counter()
    session = ExecuTorchSession(pte, threads=opts.threads or default_threads())
    info["load_s"] = round(time.perf_counter() - t0, 3)
    return attach_tokenizer(session, tokenizer, backend="cpu", info=info, extra_eos_ids=session.eos_ids)
