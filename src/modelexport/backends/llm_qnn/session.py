"""Run an LLM bundle's graphs: `Forward` callables over ONNX Runtime sessions, for the
`htp-sim` backend of `modelexport.llm` and for `eval`.

stage "htp-sim":    the unshared twins (EPContext models) on the x86 HTP simulator. The
                    weight-shared binary is never loaded here: the simulator cannot run it.
stage "fake-quant": the QDQ ONNX models on ONNX Runtime's CPU EP (what quantization alone does).

A decoder split into parts is chained: part 1 takes input_ids, later parts the hidden states,
each its own layers' caches; the new K/V of all parts are concatenated in layer order.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...contract.bundle import open_bundle
from ...core.arguments import finite
from ...core.errors import InputError, ToolchainError, clip
from ...core.formats import bundle_format
from ...core.targets import get_target
from ...core.vocab import BundleKind, GraphKind, Role
from ...llm import LLM, LLM_BACKENDS, LoadOptions, attach_tokenizer
from ...llm.run.generate import StaticGraphSession
from ...llm.run.openers import open_llm_bundle, source_kind
from ...llm.export.lora_source import adapter_arrays, read_adapter, slots_from_inputs, zero_arrays
from ...llm.model.input_modes import (INPUT_MODES, POSITION_COS, POSITION_SIN, ROPE_TABLE, InputMode, get_input_mode,
                                       text_inputs)
from ...llm.model.mrope import ROPE_POSITION_IDS, RopePositions
from ...llm.model.static_decoder import DecoderSpec, new_key, new_value, past_key, past_value
from ...llm.run.tokenizers import load_tokenizer
from ...llm.run.vision_inputs import place_rows_at_positions
from ...toolchain.htp_options import run_provider_options
from ...toolchain.ort_qnn import EP_NAME, SessionPlan, create_session, node_assignment
from ...toolchain.simulator_memory import fits_on_simulator, variants_that_fit
from ..ort_qnn.run import check_runtime

STAGES = ("htp-sim", "fake-quant")


@dataclass
class _PartSession:
    session: object
    layers: range
    input_names: list[str]
    output_names: list[str]


class ChainedForward:
    """A `Forward` over the parts of one arN graph (or the full-context graph: no caches in or out),
    after the embedder part when the bundle's input mode has one: it takes token ids, and the first
    part gets what its input mode takes for text (llm/model/input_modes.text_inputs)."""

    def __init__(self, parts: list[_PartSession], n_layers: int, mode: InputMode = INPUT_MODES["tokens"],
                 embedder: object | None = None, hidden_size: int = 0):
        self.parts = parts
        self.n_layers = n_layers
        self.mode = mode
        self.embedder = embedder
        self.hidden_size = hidden_size
        self.calls = 0
        # a VLM prompt's image rows by absolute position (llm/run/vision_inputs.py): they replace the
        # embedding there; `both` feeds that position's id as no_token_id (it looks nothing up)
        self.image_rows: dict[int, np.ndarray] = {}
        self.no_token_id: int | None = None
        # M-RoPE graphs (rope_position_ids for positions): the 3-axis positions by slot (llm/model/mrope.py); text by default
        self.rope_positions = RopePositions.text()
        # a bundle compiled with --lora: its LoRA inputs, every call (zeros: the base alone; apply_lora)
        self.lora: dict[str, np.ndarray] = {}
        # `--positions cos-sin` graphs: RoPE's cos and sin rows by position (rope_table.npz), gathered per call
        self.rope_table: tuple[np.ndarray, np.ndarray] | None = None

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        return self.embedder.run(None, {"input_ids": ids})[0]

    def __call__(self, input_ids, position_ids, attention_mask, *caches):
        L = self.n_layers
        ks, vs = caches[:L], caches[L:]
        ids = np.ascontiguousarray(np.asarray(input_ids, dtype=np.int32))
        pos = np.ascontiguousarray(np.asarray(position_ids, dtype=np.int32))
        mask = np.ascontiguousarray(np.asarray(attention_mask, dtype=np.float32))
        first: dict[str, np.ndarray] = text_inputs(self.mode, ids, self._lookup, self.hidden_size)
        if self.image_rows:
            first = place_rows_at_positions(first, pos, self.image_rows, self.no_token_id)
        new_k: dict[int, np.ndarray] = {}
        new_v: dict[int, np.ndarray] = {}
        for ps in self.parts:
            # an M-RoPE graph takes the slots' 3-axis positions instead of position_ids
            positions = self._positions(ps, pos)
            feed = {**first, **positions, "attention_mask": mask}
            feed.update((k, v) for k, v in self.lora.items() if k in ps.input_names)
            name = _cache_names(ps)
            for i in ps.layers if caches else ():
                feed[name(past_key(i))] = np.ascontiguousarray(_np(ks[i]))
                feed[name(past_value(i))] = np.ascontiguousarray(_np(vs[i]))
            outs = dict(zip(ps.output_names, ps.session.run(ps.output_names, feed)))
            if ps is not self.parts[-1]:   # the hidden states, under the next part's name for them
                first = {self.parts[self.parts.index(ps) + 1].input_names[0]: outs[ps.output_names[0]]}
            for i in ps.layers if caches else ():
                new_k[i] = outs[name(new_key(i))]
                new_v[i] = outs[name(new_value(i))]
        self.calls += 1
        logits = torch.from_numpy(outs[self.parts[-1].output_names[0]])
        if not caches:
            return (logits,)
        return (logits, *[torch.from_numpy(new_k[i]) for i in range(L)], *[torch.from_numpy(new_v[i]) for i in range(L)])


    def _positions(self, ps: _PartSession, pos: np.ndarray) -> dict[str, np.ndarray]:
        """What this part's graph takes for the positions `pos` [1, N]: position_ids, M-RoPE's 3-axis
        positions (llm/model/mrope.py), or RoPE's cos and sin rows [1, 1, N, rotary_dim/2] (`--positions cos-sin`)."""
        if ROPE_POSITION_IDS in ps.input_names:
            return {ROPE_POSITION_IDS: self.rope_positions(pos)}
        if POSITION_COS in ps.input_names:
            cos, sin = self.rope_table
            return {POSITION_COS: np.ascontiguousarray(cos[pos][:, None]),
                    POSITION_SIN: np.ascontiguousarray(sin[pos][:, None])}
        return {"position_ids": pos}


def _cache_names(ps: _PartSession):
    """Bundles made before the caches took Genie's names call them past_key_3 / new_key_3."""
    if any(n.endswith("_in") for n in ps.input_names):
        return lambda n: n
    return lambda n: n[:-3] if n.endswith("_in") else "new_" + n[len("past_"):-4]


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _spec(bundle) -> DecoderSpec:
    llm = bundle.manifest.llm
    if llm is None:
        raise InputError(f"{bundle.path} records no LLM section in its manifest", "recompile the bundle")
    s = llm.spec
    return DecoderSpec(n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim,
                       hidden_size=s.hidden_size, vocab_size=s.vocab_size, max_seq_len=s.max_seq_len)


def open_forwards(bundle, stage: str = "htp-sim", target: str | None = None,
                  variants: list[int] | None = None, every_variant: bool = False) -> tuple[dict, DecoderSpec, int]:
    """({N: Forward}, spec, max_seq_len) for the bundle's graphs at `stage`, each taking token ids (the
    embedder part chained first when the bundle has one); a graph built for a shorter context length C
    (`--context-lengths`) is keyed (N, C). The full-context graph (N = max_seq_len, no caches: a
    generation loop cannot use it) only when `variants` names it. On the simulator, the graphs one
    process holds; `every_variant`: all of them, each part loaded for its call only when they do not fit."""
    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}", f"choose one of: {', '.join(STAGES)}")
    m = bundle.manifest
    if m.kind != BundleKind.LLM:
        raise InputError(f"{bundle.path} is not an LLM bundle")
    target = target or m.targets[0]
    spec = _spec(bundle)
    variants = variants or [n for n in m.llm.variants if n != spec.max_seq_len]
    by_key: dict = {}
    for g in m.graphs:
        if g.target == target and g.n_tokens in variants:
            c = g.context_len or spec.max_seq_len
            by_key.setdefault(g.n_tokens if c == spec.max_seq_len else (g.n_tokens, c), []).append(g)
    if not by_key:
        raise InputError(f"{bundle.path} has no graphs for {target}", f"its targets: {', '.join(m.targets)}")
    on_demand = False
    if stage == "htp-sim" and every_variant:   # the simulator holds about 3 GB of binaries per process
        on_demand = not fits_on_simulator([bundle.file(g.host_twin.context_binary) for gs in by_key.values() for g in gs])
    elif stage == "htp-sim":
        by_key = _fitting(bundle, by_key)
    mode = get_input_mode(m.llm.inputs)
    embedders = _embedder_graphs(bundle, mode, target)
    out = {}
    for key, gs in by_key.items():
        parts = []
        for g in sorted(gs, key=lambda g: g.part_index):
            sess = _OnDemand(bundle, g, stage, target) if on_demand else _stage_session(bundle, g, stage, target)
            names_in = [i.name for i in sess.get_inputs()]
            names_out = [o.name for o in sess.get_outputs()]
            a, b = g.layers
            parts.append(_PartSession(sess, range(a, b), names_in, names_out))
        n = key[0] if isinstance(key, tuple) else key
        embedder = _stage_session(bundle, embedders[n], stage, target) if mode.embedder else None
        out[key] = ChainedForward(parts, spec.n_layers, mode, embedder, spec.hidden_size)
        out[key].rope_table = rope_table(bundle)
    return out, spec, spec.max_seq_len


def rope_table(bundle) -> tuple[np.ndarray, np.ndarray] | None:
    """A `--positions cos-sin` bundle's cos and sin by position ([max_seq_len, rotary_dim/2] each); None for others."""
    if getattr(bundle.manifest.llm, "positions", "ids") != "cos-sin":
        return None
    with np.load(bundle.file(ROPE_TABLE)) as t:
        return t["cos"], t["sin"]


def _fitting(bundle, by_key: dict) -> dict:
    """The graphs one simulator process holds: every N (with all its context lengths) when they fit
    together, else the N with the most tokens per call that fits (toolchain/simulator_memory.py)."""
    by_n: dict[int, list] = {}
    for key, gs in by_key.items():
        by_n.setdefault(key[0] if isinstance(key, tuple) else key, []).extend(
            bundle.file(g.host_twin.context_binary) for g in gs)
    keep = set(variants_that_fit(by_n))
    return {k: gs for k, gs in by_key.items() if (k[0] if isinstance(k, tuple) else k) in keep}


class _OnDemand:
    """A graph's session loaded for each call and released after it: one part on the simulator at a
    time, for a decoder whose graphs do not fit in one process together. Its IO names are read from the
    model file (an EPContext model is a few kB: its weights are in the binary)."""

    def __init__(self, bundle, g, stage: str, target: str):
        import onnx   # deferred: onnx, only for decoders too large to hold
        self._open = lambda: _stage_session(bundle, g, stage, target)
        path = bundle.file(g.host_twin.epcontext_model if stage == "htp-sim" else g.quantized_model)
        graph = onnx.load(str(path), load_external_data=False).graph
        init = {t.name for t in graph.initializer}
        self._inputs = [_Named(i.name) for i in graph.input if i.name not in init]
        self._outputs = [_Named(o.name) for o in graph.output]

    def get_inputs(self) -> list:
        return self._inputs

    def get_outputs(self) -> list:
        return self._outputs

    def run(self, names, feed):
        session = self._open()
        try:
            return session.run(names, feed)
        finally:
            del session


@dataclass(frozen=True)
class _Named:
    name: str


def _stage_session(bundle, g, stage: str, target: str):
    """One graph's session at `stage`: its host twin on the simulator, or its QDQ ONNX on the CPU."""
    if stage == "htp-sim":
        return _sim_session(bundle.file(g.host_twin.epcontext_model), target)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(bundle.file(g.quantized_model)), so, providers=["CPUExecutionProvider"])


def _embedder_graphs(bundle, mode: InputMode, target: str) -> dict:
    """{N: the embedder part's graph for `target`} when the input mode looks text up in one."""
    if not mode.embedder:
        return {}
    part = bundle.manifest.llm.embedder
    graphs = {g.n_tokens: g for g in (part.graphs if part else []) if g.target == target}
    if not graphs:
        raise InputError(f"{bundle.path} takes embeddings (--inputs {mode.name}) but has no embedder part for {target}: "
                         "text cannot be looked up", "compile the model again with --inputs embeddings (this version "
                         "adds the embedder part), or with --inputs tokens")
    return graphs


def _sim_session(epcontext: Path, target: str):
    soc = get_target(target)
    try:
        sess = create_session(epcontext, SessionPlan(provider_options=run_provider_options(soc.soc_model, None)))
    except Exception as e:
        raise ToolchainError(f"the HTP simulator could not load {epcontext}: {clip(str(e), 1000)}",
                             "recompile the bundle with this QAIRT") from None
    if not node_assignment(sess).get(EP_NAME):
        raise ToolchainError(f"{epcontext.name} did not land on the QNN EP", "run `modelexport doctor`")
    return sess


def open_session(bundle, stage: str = "htp-sim", lora: str | Path | None = None, lora_scale: float = 1.0):
    """The generation loop's `DecoderSession` over the bundle's compiled graphs, opened by its format's
    `session` (core/formats.py: this module's `open_graph_session`)."""
    row = bundle_format(bundle.manifest.format, BundleKind.LLM)
    opener = (row.entry("session") if row else None) or open_graph_session
    if lora is None:
        return opener(bundle, stage)
    return opener(bundle, stage, lora, lora_scale)


def open_graph_session(bundle, stage: str = "htp-sim", lora: str | Path | None = None, lora_scale: float = 1.0):
    """A `StaticGraphSession` over a context-binary bundle's graphs at `stage` (with LoRA adapter `lora`)."""
    if stage == "htp-sim":
        check_runtime(bundle)
    graphs, spec, max_seq_len = open_forwards(bundle, stage)
    apply_lora(bundle, graphs, lora, lora_scale)
    return StaticGraphSession(graphs, spec, max_seq_len, vocab_size=spec.vocab_size)


def apply_lora(bundle, forwards: dict[int, ChainedForward], lora: str | Path | None, scale: float = 1.0) -> str | None:
    """Feed adapter `lora` (a name in the bundle, or a PEFT folder that fits its LoRA inputs) at `scale` to
    every graph; none: zeros, the base alone. Returns the adapter's name."""
    shapes = {i.name: list(i.shape) for f in forwards.values() for ps in f.parts for i in ps.session.get_inputs()
              if i.name.startswith("lora_")}
    slots = slots_from_inputs(shapes)
    if slots is None:
        if lora is not None:
            raise InputError(f"bundle {bundle.path} takes no LoRA adapter: it was compiled without --lora",
                             "compile the base again with --lora ADAPTER_DIR, or leave --lora out")
        return None
    finite("--lora-scale", scale, "1.0")
    adapter = find_adapter(bundle, lora, slots) if lora is not None else None
    arrays = adapter_arrays(adapter, slots, scale) if adapter else zero_arrays(slots)
    for f in forwards.values():
        f.lora = arrays
    return adapter.name if adapter else None


def bundle_lora_slots(bundle):
    """The LoRA slots of the bundle's graphs, read from its QDQ graphs' inputs (None: it takes no adapter)."""
    import onnx   # deferred: onnx, only for bundles compiled with --lora
    if bundle.manifest.llm is None or bundle.manifest.llm.lora is None:
        return None
    shapes = {}
    for g in bundle.manifest.graphs:
        if g.quantized_model:
            for i in onnx.load(str(bundle.file(g.quantized_model)), load_external_data=False).graph.input:
                if i.name.startswith("lora_"):
                    shapes[i.name] = [d.dim_value for d in i.type.tensor_type.shape.dim]
    return slots_from_inputs(shapes)


def find_adapter(bundle, lora: str | Path, slots):
    """The adapter named `lora` in the bundle's manifest, or the PEFT folder `lora`, checked against the slots."""
    record = bundle.manifest.llm.lora
    entries = {a.name: a for a in (record.adapters if record else [])}
    if str(lora) in entries:
        return read_adapter(bundle.file(entries[str(lora)].folder), name=str(lora), slots=slots)
    if Path(lora).is_dir():
        return read_adapter(Path(lora), slots=slots)
    raise InputError(f"--lora {lora}: no adapter of that name in bundle {bundle.path}, and no such folder",
                     f"name one of: {', '.join(entries) or '(none compiled in)'}, or give a PEFT adapter folder")


def compiled_stages(bundle) -> tuple[str, ...]:
    """eval's compiled stages of a context-binary LLM bundle: it keeps the QDQ models and the twins."""
    return ("fake-quant", "htp-sim")


# bundle graph kinds that hold compiled HTP code
_HTP_GRAPH_KINDS = (GraphKind.CONTEXT_BINARY,)


def open_compiled_bundle(path: Path, backend: str):
    """The LLM bundle at `path` for a backend that runs compiled bundles (htp-sim, genie)."""
    kind = source_kind(path)
    if kind != "bundle":
        raise InputError(f"--backend {backend} runs compiled LLM bundles; {path} is a {kind} file",
                         "compile it first (modelexport compile ... -o BUNDLE), or use --backend cpu")
    _check_tokenizer_present(path)
    return open_llm_bundle(path)


def _check_tokenizer_present(path: Path) -> None:
    """A bundle whose tokenizer was deleted is said to be so, with the fix, before the integrity
    check (which would call it only a file that does not match the manifest)."""
    bundle = open_bundle(path, verify=False)
    gone = [f.path for f in bundle.manifest.files if f.role in (Role.TOKENIZER, Role.TOKENIZER_CONFIG)
            and not (path / f.path).is_file()]
    if gone:
        raise InputError(f"bundle {path} is missing its tokenizer: {', '.join(gone)} deleted",
                         f"copy the model's tokenizer files back into {path / 'tokenizer'} (tokenizer.json from the "
                         "model's folder), or compile the bundle again with --force")


def bundle_tokenizer(bundle, path: Path, opts: LoadOptions):
    """The bundle's tokenizer, or the one the user named instead."""
    tok_file = opts.tokenizer or next((bundle.file(f.path) for f in bundle.manifest.files if f.role == Role.TOKENIZER), None)
    if tok_file is None:
        raise InputError(f"bundle {path} carries no tokenizer", "pass --tokenizer")
    return load_tokenizer(tok_file)


@LLM_BACKENDS.register("htp-sim")
def open_htp_sim(path: Path, opts: LoadOptions) -> LLM:
    bundle = open_compiled_bundle(path, "htp-sim")
    graphs = [g for g in bundle.manifest.graphs if g.kind in _HTP_GRAPH_KINDS or g.htp_arch]
    if not graphs:
        raise InputError(f"bundle {path} has no HTP graphs (nothing compiled for the NPU)",
                         "compile the LLM for a target first, or use --backend cpu")
    session = open_session(bundle, lora=opts.lora, lora_scale=opts.lora_scale)
    info = {"source": str(path), "source_kind": "bundle", "model": path.name}
    if opts.lora is not None:
        info["lora"] = {"adapter": str(opts.lora), "scale": opts.lora_scale}
    return attach_tokenizer(session, bundle_tokenizer(bundle, path, opts), backend="htp-sim", info=info)
