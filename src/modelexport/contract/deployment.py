"""What a deployer copies to the phone, read from the manifest alone: per target and per runtime
the files it loads, their bytes and bytes per parameter (device files only — host twins, QDQ
graphs and the report stay on this machine), what that runtime must be on the phone, the LLM's
parts against the memory limit and its decode ceiling. `inspect` and report.html both show it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..core.targets import get_target
from ..core.vocab import Role
from .manifest import Manifest


@dataclass(frozen=True)
class Runtime:
    """One way to run a bundle on the phone: the file roles it loads and what it needs there."""
    name: str
    model_roles: frozenset[Role]     # files of one target that hold the model
    extra_roles: frozenset[Role]     # files it also reads (configs, tokenizer), counted apart
    needs: str                       # filled from the bundle: {qairt}, {arch}, and tool versions
    needs_genie_config: bool = False # listed only for targets with a Genie config
    only_alone: bool = False         # listed only when no other runtime loads these files (no LLM, no EPContext)
    decode_graphs_only: bool = False # of an LLM's binaries, only the arN decoder's (Genie's config names those:
                                     # not the embedder part's, not the full-context graph's; Genie has its table)


# The HTP libraries a context binary needs on the phone (QAIRT's lib/aarch64-android + lib/hexagon-v<arch>).
_HTP_LIBS = "libQnnHtp.so, libQnnHtpV{arch}Stub.so, libQnnHtpV{arch}Skel.so, libQnnSystem.so of QAIRT {qairt} or newer"

RUNTIMES: tuple[Runtime, ...] = (
    Runtime("Genie", frozenset({Role.CONTEXT_BINARY, Role.GENIE_LUT}),
            frozenset({Role.GENIE_CONFIG, Role.TOKENIZER, Role.LORA_INPUTS}),
            "libGenie.so (genie-t2t-run -c {genie_config}) and " + _HTP_LIBS, needs_genie_config=True,
            decode_graphs_only=True),
    Runtime("ONNX Runtime (QNN EP)", frozenset({Role.EPCONTEXT_MODEL, Role.CONTEXT_BINARY}),
            frozenset({Role.TOKENIZER, Role.TOKENIZER_CONFIG, Role.LORA_INPUTS, Role.ROPE_TABLE}),
            "onnxruntime {onnxruntime} or newer with the QNN EP (onnxruntime-qnn {onnxruntime-qnn}), and " + _HTP_LIBS),
    Runtime("GenieX", frozenset({Role.GENIEX}), frozenset({Role.GENIEX_CONFIG}),
            "GenieX's QAIRT plugin, given the target's geniex/ folder (its binaries, metadata.json, genie_config.json, tokenizer)"),
    Runtime("ExecuTorch (QNN delegate)", frozenset({Role.PTE}), frozenset({Role.TOKENIZER, Role.TOKENIZER_CONFIG}),
            "an ExecuTorch {executorch} runtime built with the QNN backend, and " + _HTP_LIBS),
    Runtime("QNN (context binary)", frozenset({Role.CONTEXT_BINARY}), frozenset(),
            "the QNN API (QnnContext_createFromBinary, qnn-net-run --retrieve_context) and " + _HTP_LIBS,
            only_alone=True),
    Runtime("QNN IR (.dlc)", frozenset({Role.DLC}), frozenset(),
            "QAIRT {qairt} or newer: qnn-context-binary-generator or qnn-net-run --dlc_path, on the phone or at build time"),
)

# Files that never go to the phone.
HOST_ONLY = frozenset({Role.HOST_EPCONTEXT_MODEL, Role.HOST_CONTEXT_BINARY, Role.HOST_PTE, Role.QUANTIZED_MODEL,
                       Role.QUANTIZED_MODEL_DATA, Role.FLOAT_MODEL, Role.VERIFY_INPUTS, Role.REPORT})


@dataclass
class RuntimeFiles:
    runtime: str
    target: str
    files: list[str]
    model_bytes: int
    extra_bytes: int
    bytes_per_parameter: float | None
    needs: str


@dataclass
class PartMemory:
    graph: str
    target: str | None
    layers: list[int] | None
    estimate_mb: float | None
    limit_mb: float | None

    @property
    def within(self) -> bool | None:
        if self.estimate_mb is None or self.limit_mb is None:
            return None
        return self.estimate_mb <= self.limit_mb


@dataclass
class Deployment:
    runtimes: list[RuntimeFiles] = field(default_factory=list)
    host_only_files: list[str] = field(default_factory=list)
    host_only_bytes: int = 0
    parts: list[PartMemory] = field(default_factory=list)
    decode_ceiling_tok_s: dict[str, float] = field(default_factory=dict)   # target -> tok/s bound
    placement: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for p, part in zip(d["parts"], self.parts):
            p["within_limit"] = part.within
        return d


def _target_of_files(m: Manifest) -> dict[str, str]:
    """file -> target, from the graphs that name it, or the `TARGET/` folder it sits in."""
    out: dict[str, str] = {}
    for g in m.graphs:
        target = g.target or (m.targets[0] if len(m.targets) == 1 else None)
        for f in (g.file, g.epcontext_model):
            if f and target:
                out[str(f)] = target
    for f in m.files:
        head = str(f.path).split("/", 1)[0]
        if head in m.targets:
            out.setdefault(str(f.path), head)
    return out


def _needs(rt: Runtime, m: Manifest, target: str, genie_config: str | None) -> str:
    facts = {**m.versions, "qairt": m.qairt_build or "?", "arch": m.htp_arch.get(target, "?"),
             "genie_config": genie_config or "genie_config.json"}
    needs = rt.needs.format_map(_Missing(facts))
    runner = m.llm.executorch.get(target) if m.llm and Role.PTE in rt.model_roles else None
    if runner is not None and runner.command:   # the program for ExecuTorch's Qualcomm LLM runner
        needs += f"; run: {runner.command}"
    return needs


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _listed(files) -> list[str]:
    """The files' paths, an adapter's LoRA inputs (a .raw per input: hundreds for a real model) as their folder."""
    out, folders = [], {}
    for f in files:
        if f.role == Role.LORA_INPUTS:
            folder = str(f.path).rsplit("/", 1)[0]
            if folder not in folders:
                out.append(folder)
            folders[folder] = folders.get(folder, 0) + 1
        else:
            out.append(str(f.path))
    return [f"{p}/ ({folders[p]} files)" if p in folders else p for p in out]


def deployment(m: Manifest) -> Deployment:
    owner = _target_of_files(m)
    out = Deployment()
    genie_configs = {t: str(g.file) for t, g in (m.llm.genie.items() if m.llm else [])}
    loaded_elsewhere = m.llm is not None or any(f.role == Role.EPCONTEXT_MODEL for f in m.files)
    decode_files = {str(g.file) for g in m.graphs if m.llm and g.n_tokens != m.llm.max_seq_len}
    for target in m.targets:
        for rt in RUNTIMES:
            if rt.needs_genie_config and target not in genie_configs:
                continue
            if rt.only_alone and loaded_elsewhere:
                continue   # the binaries are already listed under the runtimes that load them
            # a model file outside every target's folder (Genie's embedding table) serves each target
            model = [f for f in m.files if f.role in rt.model_roles and owner.get(str(f.path), target) == target
                     and (not rt.decode_graphs_only or f.role != Role.CONTEXT_BINARY or str(f.path) in decode_files)]
            if not model:
                continue
            extra = [f for f in m.files if f.role in rt.extra_roles and owner.get(str(f.path), target) == target]
            if rt.needs_genie_config:   # this target's config, not another target's
                extra = [f for f in extra if f.role != Role.GENIE_CONFIG or str(f.path) == genie_configs[target]]
            model_bytes = sum(f.size for f in model)
            out.runtimes.append(RuntimeFiles(
                rt.name, target, _listed(model + extra), model_bytes, sum(f.size for f in extra),
                round(model_bytes / m.parameters, 4) if m.parameters else None,
                _needs(rt, m, target, genie_configs.get(target))))
    host = [f for f in m.files if f.role in HOST_ONLY]
    out.host_only_files = [str(f.path) for f in host]
    out.host_only_bytes = sum(f.size for f in host)
    limit = m.llm.memory_limit_mb if m.llm else None
    for g in m.graphs:
        if g.memory_estimate is not None or g.layers is not None:
            out.parts.append(PartMemory(g.name, g.target, g.layers,
                                        g.memory_estimate.total_mb if g.memory_estimate else None, limit))
    wbytes = m.llm.weight_bytes_per_token if m.llm else None
    if wbytes:
        for t in m.targets:
            soc = get_target(t)
            if soc.dram_gbps:
                out.decode_ceiling_tok_s[t] = round(soc.dram_gbps * 1e9 / wbytes, 1)
    if m.llm is not None:   # model bundles: their per-node placement is in the audit table
        out.placement = "every op on the HTP: a context binary holds HTP graphs only (nothing falls back at run time)"
    return out
