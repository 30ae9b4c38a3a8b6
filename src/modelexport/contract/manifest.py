"""manifest.json: the contract between compile and everything after it.

inspect, run, verify, generate, eval, profile and report.html read the manifest; they never guess.
Everything a writer records has a typed field here; the values writers and readers must agree on
(bundle kind, format, graph kind, file role) are the `core.vocab` enums, stored as plain strings.

Schema 2 (this one) gave the sections schema 1 kept in untyped dicts their own types:

    schema 1                                  schema 2
    extra["parts"]                            Manifest.parts: [PartEntry]      (ONNX and PyTorch bundles)
    extra["llm"], extra["parameters"]         Manifest.llm: LlmSection, Manifest.parameters   (LLM bundles)
    extra["timings" | "cache" | "qairt"]      Manifest.timings, .cache, .qairt
    extra["dlc_note"]                         Manifest.dlc_note
    graphs[i].extra[...]                      GraphSpec fields of the same names (part, n_tokens, ...)

A schema-1 manifest still opens: `Manifest`'s before-validator moves those keys into the typed
fields, and reads the same. There is no `extra` any more; what stays free-form is typed as a dict
and says so: `options`, `calibration`, `placement`, `numerics` (as before), `PartEntry.quantization`
and `.rewrites` (what the quantizer / the rewrite passes report), `LlmSection.quantization` (the
quantizer's report per graph) and the per-stage entries of `Timings` (named by each writer).

Inside the typed sections a field a writer set to None is kept in the JSON as null (the sections
used to be dicts that kept them); only unset optional fields are left out.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from pydantic import (BaseModel, ConfigDict, Field, SerializationInfo,
                      SerializerFunctionWrapHandler, model_serializer, model_validator)
from pydantic import ValidationError  # noqa: F401  (re-exported: bundle.py reads it from here, off CLI start-up)

from ..core.files import MANIFEST_NAME, REPORT_NAME, sha256_file  # noqa: F401  (re-exported)
from ..core.vocab import BundleKind, Format, GraphKind, Role
from .llm_records import (  # noqa: F401  (re-exported)
    DecoderShape, WeightSharing, LogitsAgreement, PteLlmProgram, ExecutorchRunnerProgram, GeniePipelineCheck, GenieCheck, WeightRounding, QualityRecipe,
    GenieXFolder)
from .records import BundlePath, _inside_the_bundle, _Recorded  # noqa: F401  (re-exported)

SCHEMA_VERSION = 2


GRAPH_NAMING = ("{type}_ar{N}_cl{C}_{i}_of_{n}: type prompt (N>1), token (N=1) or full (N=C: the whole context, "
                "no KV cache), C = max_seq_len, part i of n")


class Encoding(BaseModel):
    """Quantization of one tensor: per-tensor (scale, zero_point) or per-axis arrays."""
    dtype: str
    scale: float | list[float] | None = None
    zero_point: int | list[int] | None = None
    axis: int | None = None
    bits: int | None = None
    block_size: int | None = None


class TensorSpec(BaseModel):
    name: str
    shape: list[int | str]
    dtype: str
    encoding: Encoding | None = None


# ---------------------------------------------------------------------------------------------
# per graph

class HostTwin(_Recorded):
    """LLM bundles: the unshared binary compiled from the same QDQ graph, which the x86 simulator runs
    (it cannot load weight-shared binaries)."""
    epcontext_model: BundlePath
    context_binary: BundlePath
    qnn_graph_name: str | None = None
    const_bytes: int | None = None
    bytes: int | None = None
    optimization_level: int | None = None   # read back from the binary (finalized cheaply: it runs on the host only)


class MemoryEstimate(_Recorded):
    """LLM bundles: the estimated HTP memory of one graph (backends/llm_qnn/memory.py)."""
    weights_bytes: int
    io_bytes: int
    activation_bytes: int
    total_bytes: int
    total_mb: float


class Delegate(_Recorded):
    """PyTorch bundles: one delegate blob of a .pte method, where it sits in the file."""
    backend_id: str
    location: str
    offset: int | None = None
    size: int | None = None
    alignment: int | None = None


class QnnGraph(_Recorded):
    """PyTorch bundles: a QNN graph inside a method's delegate, read back from its context binary."""
    method: str
    graph: str
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    vtcm_mb: float | None = None
    const_bytes: int | None = None


class GraphSpec(_Recorded):
    """One compiled graph. The first fields every graph has; the rest are set by the writers that
    know them (which, in the comments). Schema 1 kept those in `extra`."""
    name: str
    file: BundlePath | None = None       # the file in the bundle holding this graph
    kind: GraphKind
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    target: str | None = None
    htp_arch: int | None = None
    part: str | None = None              # the part (ONNX / PyTorch) or graph name (LLM) it belongs to
    # context binaries (ONNX and LLM bundles)
    epcontext_model: BundlePath | None = None   # the EPContext .onnx that loads it
    soc_model: int | None = None
    vtcm_mb: float | None = None
    optimization_level: int | None = None
    spill_fill_bytes: int | None = None
    const_bytes: int | None = None
    onnx_inputs: list[TensorSpec] | None = None    # the ONNX model's own IO (float, before QDQ)
    onnx_outputs: list[TensorSpec] | None = None
    # dlc
    nodes: int | None = None             # nodes of the QDQ model the DLC was dumped from
    # pte-method
    delegates: list[Delegate] | None = None
    delegate_calls: dict[str, int] | None = None
    kernel_calls: dict[str, int] | None = None
    qnn_graphs: list[QnnGraph] | None = None
    # LLM decoder graphs
    n_tokens: int | None = None          # N of arN: tokens per call
    context_len: int | None = None       # C of clC: the context it is built for (None: llm.max_seq_len)
    part_index: int | None = None        # 1-based part of a decoder split by layers
    n_parts: int | None = None
    layers: list[int] | None = None      # [first, end) decoder layers of the part
    qnn_graph_name: str | None = None    # the graph's name inside the weight-shared binary
    shared: bool | None = None           # its binary holds several graphs sharing one copy of the weights
    shared_weights_bytes: int | None = None
    host_twin: HostTwin | None = None
    quantized_model: BundlePath | None = None   # the QDQ .onnx it was compiled from
    memory_estimate: MemoryEstimate | None = None

    # schema 1 wrote these as dict entries, None included
    keeps_none: ClassVar[frozenset[str] | None] = frozenset({
        "vtcm_mb", "optimization_level", "spill_fill_bytes", "const_bytes", "qnn_graph_name", "shared_weights_bytes"})


class FileEntry(BaseModel):
    path: BundlePath
    size: int
    sha256: str
    role: Role = Role.ARTIFACT


class SourceModel(BaseModel):
    path: str | None = None
    sha256: str | None = None
    format: str | None = None           # onnx, pytorch, hf-folder, gguf
    description: str | None = None


# ---------------------------------------------------------------------------------------------
# per part (ONNX and PyTorch bundles)

class PartFiles(_Recorded):
    """A part's files in the bundle (besides its compiled graphs)."""
    float_model: BundlePath | None = None       # .onnx or .pt2
    quantized_model: BundlePath | None = None   # the QDQ .onnx (quantized ONNX parts)
    verify_inputs: BundlePath | None = None     # .npz of the samples `verify` compares on


class PartEntry(_Recorded):
    """One model of a bundle: where it came from, its precision and IO, its files, what was cached."""
    name: str
    source: str | None = None
    sha256: str | None = None
    precision: str
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] | None = None              # ONNX parts
    fixed_shapes: dict[str, list[int]] | None = None     # ONNX parts: --input-shape applied
    quantization: dict[str, Any] | None = None           # ONNX parts: what the quantizer reports (free-form)
    files: PartFiles = Field(default_factory=PartFiles)
    cache_hit: dict[str, bool] = Field(default_factory=dict)   # "quantize" and per target
    rewrites: list[dict[str, Any]] | None = None         # PyTorch parts: what each rewrite pass did (free-form)
    repairs: list[dict[str, Any]] | None = None          # ONNX parts: the graph repairs that ran, with their arguments


# ---------------------------------------------------------------------------------------------
# LLM bundles

class EmbedderPart(_Recorded):
    """The embedder part of an embeddings-in LLM bundle (`--inputs embeddings`): token ids → the
    embeddings the decoder's `inputs_embeds` takes, one graph per N in one weight-shared binary per
    target; `generate` / `eval` chain it before the decoder."""
    precision: str                       # fp16 | 8bit (backends/llm_qnn/embedder.EMBEDDER_PRECISIONS)
    what: str = ""
    graphs: list[GraphSpec] = Field(default_factory=list)   # per target and N (n_tokens), with host twins
    quantized_models: dict[str, BundlePath] = Field(default_factory=dict)   # graph → the ONNX it was compiled from
    bytes: dict[str, int] = Field(default_factory=dict)     # target → the device binary's size
    check: dict[str, LogitsAgreement] = Field(default_factory=dict)   # target → host twin vs float lookup
    genie_lut: BundlePath | None = None  # the same lookup as float32 rows, for Genie's dialog (embedder.GENIE_LUT_FILE)


class ImageTiling(_Recorded):
    """SmolVLM / Idefics3 image splitting (llm/model/image_tiling.py), from the folder's preprocessor config:
    each image resized to `longest_edge`, cut into tiles of `tile_size` (the vision part's size, run
    once per tile) plus a global image, the prompt's `<image>` expanded as transformers' processor does."""
    splitting: bool                      # do_image_splitting; off: one tile (the global image) per image
    tile_size: int                       # max_image_size.longest_edge == the vision part's image_size
    longest_edge: int                    # size.longest_edge: the first resize
    max_tiles: int                       # per image, the global image included (ceil(longest_edge / tile)^2 + 1)
    resample: int                        # PIL resampling filter (1 = LANCZOS, the processor's default)
    image_seq_len: int                   # image tokens per tile (= tokens_per_image)


class VisionEntry(_Recorded):
    """The vision part of a VLM bundle (`compile VLM_FOLDER`, or `compile TEXT_LLM --vision-encoder enc.onnx`):
    vision tower + projector as one graph,
    pixel_values [1, 3, S, S] in, image_embeds [1, tokens_per_image, hidden] out; the runtime resizes
    and normalizes an image as recorded here and puts the rows at the image tokens (`placement`)."""
    family: str                          # frontends/vlm_families.py row, or "onnx_encoder" (the user's encoder)
    encoder: SourceModel | None = None   # the user's encoder ONNX (compile --vision-encoder), as given
    graphs: list[GraphSpec] = Field(default_factory=list)   # per target, with its EPContext model
    model: BundlePath                    # the float ONNX graph
    quantized_model: BundlePath | None = None   # the QDQ graph it was compiled from (fake-quant on the CPU)
    precision: str
    image_size: int
    mean: list[float]
    std: list[float]
    rescale_factor: float
    image_token_id: int
    tokens_per_image: int
    placement: str                       # PLACEMENT_RULES key: replace_in_order
    position_rule: str = "text"          # vlm_families.POSITION_RULES key: "mrope_grid" = M-RoPE positions (llm/model/mrope.py)
    grid_thw: list[int] | None = None    # mrope_grid: the image's patch grid (frames, rows, columns), fixed by image_size
    spatial_merge_size: int = 1          # patches merged per side into one image token
    image_wrap_ids: list[int] = Field(default_factory=list)   # ids put around one image's tokens (Qwen2-VL: vision start / end)
    calibration: str = ""                # what the activation ranges were taken from
    decoder_image_calibration: str | None = None   # the text decoder's ranges include these vision rows at image tokens
    check: dict[str, LogitsAgreement] = Field(default_factory=dict)   # target → simulator vs float vision part
    tiling: ImageTiling | None = None    # None: one image resized to image_size, raw image tokens (no markers)


class LoraAdapterEntry(_Recorded):
    name: str
    rank: int
    modules: int                         # the linears it adapts
    sha256: str
    folder: str                          # in the bundle: lora/NAME (adapter_config.json, adapter_model.safetensors)
    genie_folder: str | None = None      # lora/NAME/genie: a float32 .raw per LoRA input (Genie's lora-version 1)


class LoraInputs(_Recorded):
    """`compile --lora`: the graphs take A [in, rank] and B [rank, out] of each adapted linear
    (llm/export/lora_source.py); the adapters compiled with the base are in the bundle."""
    rank: int
    modules: list[str]                   # the projections adapted (self_attn.q_proj, mlp.down_proj, ...)
    layers: list[int]
    inputs: int                          # graph inputs (two per adapted linear)
    adapters: list[LoraAdapterEntry] = Field(default_factory=list)
    genie_base: str | None = None        # lora/base/genie: zeros, the adapter that gives a Genie dialog the base back


class LlmSection(_Recorded):
    """What an LLM bundle's readers (session, per-layer, eval, summary, report) need."""
    architecture: str
    spec: DecoderShape
    variants: list[int]                  # the N of the arN graphs
    max_seq_len: int
    context_lengths: list[int] = Field(default_factory=list)   # --context-lengths, ascending ([]: max_seq_len only)
    n_parts: int
    parts: list[list[int]] = Field(default_factory=list)   # [first, end) layers per part
    split_note: str | None = None
    weight_bytes_per_token: int
    device_bytes: int
    bytes_per_parameter: float | None = None
    bos_id: int | None = None
    eos_ids: list[int] = Field(default_factory=list)
    rope_theta: float
    graph_naming: str = GRAPH_NAMING
    weight_sharing: dict[str, WeightSharing] = Field(default_factory=dict)   # "TARGET/part" →
    genie: dict[str, GenieCheck] = Field(default_factory=dict)               # target →
    # target → (LLM .pte bundles): kept so their manifests parse; no writer sets it
    pte: dict[str, PteLlmProgram] = Field(default_factory=dict)
    executorch: dict[str, ExecutorchRunnerProgram] = Field(default_factory=dict)   # target → (--executorch-program)
    geniex: dict[str, GenieXFolder] = Field(default_factory=dict)   # target → its GenieX folder (--geniex)
    quantization: dict[str, dict[str, Any]] = Field(default_factory=dict)   # graph → the quantizer's report (free-form)
    memory_limit_mb: float | None = None
    weight_rounding: WeightRounding | None = None     # how the 4-bit weights were rounded (--rounding)
    quality_recipe: QualityRecipe | None = None       # the modules --max-ppl-ratio raised, and why
    inputs: str = "tokens"               # the decoder's first input(s): tokens | embeddings | both (llm/model/input_modes.py)
    positions: str = "ids"               # position_ids, or RoPE's cos and sin (`--positions cos-sin`; rope_table.npz)
    no_token_id: int | None = None       # `both`: an id that looks nothing up (the position takes inputs_embeds alone)
    embedder: EmbedderPart | None = None  # `embeddings`: the part that looks text up
    full_context: bool = False           # a full-context graph (N = max_seq_len, no KV I/O) is among the variants
    vision: VisionEntry | None = None    # a VLM bundle's vision part (pixels → the rows of the image tokens)
    residual_scale: float = 1.0          # the graphs carry the residual stream at 1/this (llm/model/residual_scale.py)
    lora: LoraInputs | None = None       # `--lora`: the LoRA inputs of the graphs and the adapters in the bundle


# ---------------------------------------------------------------------------------------------
# how the bundle was made

class Timings(_Recorded):
    """Seconds. `total_s` and `memo_restore_s` are read; every other entry is a stage named by its
    writer (e.g. `encoder.quantize_s`, `encoder.SM8650.compile_s`, `quantize_stage_s`; PyTorch
    bundles: a dict per part and target), kept as written."""
    model_config = ConfigDict(extra="allow")
    total_s: float | None = None
    memo_restore_s: float | None = None

    @model_serializer(mode="wrap")
    def _written_nones(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)            # the stages first, as the writers record them, then the totals
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if k not in type(self).model_fields} | \
            {k: v for k, v in data.items() if k in type(self).model_fields}


class CacheInfo(_Recorded):
    """What the stage caches (and the bundle memo) gave."""
    enabled: bool
    root: str | None = None
    bundle_memo: bool | None = None      # the whole bundle was copied from the memo
    hits: int | None = None              # ONNX / PyTorch bundles: stage entries reused
    misses: int | None = None
    quantize_hit: bool | None = None     # LLM and PyTorch bundles: the quantized graph(s) came from the cache
    compile_hits: int | None = None
    compile_jobs: int | None = None
    resumed_graphs: list[str] | None = None   # LLM bundles: QDQ graphs an interrupted compile had finished


class QairtInfo(_Recorded):
    """The QAIRT the bundle was compiled with (its build id is `Manifest.qairt_build`)."""
    source: str | None = None
    version: str | None = None
    core_api: str | None = None
    htp_api: str | None = None
    build: str | None = None             # PyTorch bundles: ExecuTorch's QNN build and its pairing
    pairing: str | None = None


# ---------------------------------------------------------------------------------------------

_SCHEMA1_SECTIONS = ("parts", "llm", "parameters", "timings", "cache", "qairt", "dlc_note")


def upgrade_schema1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 manifest (plain JSON) → schema 2: the `extra` entries move to their typed places."""
    data = dict(data)
    extra = dict(data.pop("extra", None) or {})
    for key in _SCHEMA1_SECTIONS:
        if key in extra:
            data.setdefault(key, extra.pop(key))
    graphs = []
    for g in data.get("graphs") or []:
        if isinstance(g, dict) and isinstance(g.get("extra"), dict):
            g = dict(g)
            for k, v in g.pop("extra").items():
                g.setdefault(k, v)
        graphs.append(g)
    if "graphs" in data:
        data["graphs"] = graphs
    data["schema_version"] = SCHEMA_VERSION
    return data


class Manifest(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: BundleKind = BundleKind.MODEL
    created_by: str = "modelexport"
    source: SourceModel = Field(default_factory=SourceModel)
    targets: list[str] = Field(default_factory=list)
    htp_arch: dict[str, int] = Field(default_factory=dict)   # target → arch, as read back from binaries
    precision: str | None = None        # one precision, or "mixed" (then per part in `parts`)
    format: Format | None = None
    qairt_build: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    calibration: dict[str, Any] = Field(default_factory=dict)
    graphs: list[GraphSpec] = Field(default_factory=list)
    files: list[FileEntry] = Field(default_factory=list)
    placement: dict[str, Any] = Field(default_factory=dict)
    numerics: dict[str, Any] = Field(default_factory=dict)
    precision_search: dict[str, Any] = Field(default_factory=dict)   # --precision auto: every candidate and the choice
    parts: list[PartEntry] = Field(default_factory=list)      # model bundles
    llm: LlmSection | None = None                             # LLM bundles
    parameters: int | None = None                             # LLM bundles: the source model's
    timings: Timings = Field(default_factory=Timings)
    cache: CacheInfo | None = None
    qairt: QairtInfo | None = None
    dlc_note: str | None = None                               # dlc bundles: what a DLC is good for

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and int(data.get("schema_version") or 1) < 2:
            return upgrade_schema1(data)
        return data

    def part(self, name: str | None) -> PartEntry | None:
        """The part of that name (model bundles), or None."""
        return next((p for p in self.parts if p.name == name), None)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True)


def tool_versions() -> dict[str, str]:
    """Versions of the libraries that shaped an artifact, read from installed metadata."""
    out = {}
    for pkg in ("modelexport", "torch", "executorch", "onnxruntime", "onnxruntime-qnn", "onnx", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out
