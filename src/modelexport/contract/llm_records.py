"""The LLM section's records that stand alone: the decoder's shape, weight sharing, logits agreement, the
programs (`.pte`, qnn_llama_runner's), Genie's checks, how the weights were rounded and raised. Re-exported
by `contract.manifest`, where `LlmSection` gathers them."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from .records import BundlePath, _Recorded


class DecoderShape(_Recorded):
    """The static decoder's dimensions (`llm.model.static_decoder.DecoderSpec`)."""
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_seq_len: int


class WeightSharing(_Recorded):
    """One weight-shared context binary (a target and a part), read back through libQnnSystem."""
    file: BundlePath
    graphs: list[str]
    shared_weights_bytes: list[int]
    const_bytes: dict[str, int | None] = Field(default_factory=dict)
    bytes: int
    unshared_twins_bytes: int
    saved_bytes: int
    weights_stored_once: bool
    note: str | None = None


class LogitsAgreement(_Recorded):
    """How close one stage's logits are to another's on the same real-text samples (`float vs
    htp-sim`: the host twin on the simulator against the float decoder)."""
    sqnr_db: float
    cosine: float | None = None
    max_abs_error: float | None = None
    top1_agreement: float | None = None
    samples: int | None = None


def _numerics_by_pair(value: Any) -> Any:
    """Bundles written before the pairs were recorded kept {method: SQNR dB} of the twin vs float."""
    if isinstance(value, dict):
        return {k: ({"float vs htp-sim": {"sqnr_db": v}} if isinstance(v, (int, float)) else v) for k, v in value.items()}
    return value


class PteLlmProgram(_Recorded):
    """LLM `.pte` bundles: one target's program (decode + prefill methods over one weight-shared
    context binary) and its unshared host twin, both read back with ExecuTorch's own schema.
    Kept so those manifests still parse: no writer sets it (`--format pte` of an LLM writes a
    context-binary bundle with `ExecutorchRunnerProgram`), and the commands refuse such bundles
    (core/formats.RETIRED)."""
    file: BundlePath
    host_twin: BundlePath
    methods: list[str]                   # every method, the constant ones included
    decoder_methods: dict[str, int]      # method → tokens per call (N of arN)
    metadata: dict[str, int | bool | list[int]] = Field(default_factory=dict)   # constant method → value
    bytes: int
    host_twin_bytes: int
    kv_encodings: dict[str, list[float]] = Field(default_factory=dict)   # KV I/O → [scale, zero point], every method
    # method → "A vs B" (stages: float, fake-quant, htp-sim) → agreement of the logits, measured at compile
    numerics: Annotated[dict[str, dict[str, LogitsAgreement]], BeforeValidator(_numerics_by_pair)] = \
        Field(default_factory=dict)
    fake_quant: dict[str, BundlePath] = Field(default_factory=dict)   # method → QnnQuantizer's converted graph (.pt2)


class GenieXFolder(_Recorded):
    """LLM bundles with `--geniex`: one target's folder for GenieX (backends/llm_qnn/geniex.py): the bundle's
    binaries with their graphs renamed, metadata.json, the config and the tokenizer files."""
    folder: str
    model_id: str
    binaries: list[str]
    graphs: list[str]


class ExecutorchRunnerProgram(_Recorded):
    """LLM context-binary bundles with `--executorch-program`: one target's ExecuTorch program for
    `qnn_llama_runner` (kv_forward + prefill_forward over the bundle's own weight-shared binaries,
    graphs renamed to the methods) and its host twin, checked by driving the twin as the runner does
    (backends/llm_qnn/executorch_runner.py)."""
    file: BundlePath
    host_twin: BundlePath
    methods: list[str]                   # every method, the constant ones included
    metadata: dict[str, int | bool | list[int]] = Field(default_factory=dict)   # constant method → value
    bytes: int
    host_twin_bytes: int
    binaries_stored: int                 # QNN context binaries in the program (one per part: both methods share it)
    binary_bytes: int
    build_s: float | None = None
    decoder_model_version: str | None = None   # qnn_llama_runner's --decoder_model_version for this model
    eos_ids: list[int] = Field(default_factory=list)   # what the runner stops on with that version
    command: str | None = None           # the runner's command line on the phone
    check: dict[str, Any] = Field(default_factory=dict)   # the runner's loop on the twin vs the bundle's loop


class GeniePipelineCheck(_Recorded):
    """A VLM bundle's Genie pipeline (`genie_pipeline.json`: image-encoder, text-encoder and
    text-generator nodes) as libGenie built it on the host twins (backends/llm_qnn/genie_pipeline.py)."""
    file: BundlePath
    text_path_created: bool              # pipeline, generator node on the decoder, text-encoder node, connected
    image_encoder_created: bool          # Genie's image-encoder node on the vision part's binary
    image_encoder_note: str | None = None   # Genie's words when it refuses it
    checked_on: str | None = None


class GenieCheck(_Recorded):
    """The Genie config of a target and what libGenie said of it: the config parser (`accepted`)
    and a dialog created on the host twins (`dialog_created`: Genie's model validation passed)."""
    file: BundlePath
    accepted: bool
    status: int | None = None
    library: str | None = None
    dialog_created: bool | None = None
    dialog_checked_on: str | None = None
    dialog_note: str | None = None       # why no dialog was created, or what the dialogs did not see (a known limit of the host)
    pipeline: GeniePipelineCheck | None = None   # VLM bundles: Genie's multimodal pipeline


class WeightRounding(_Recorded):
    """The 4-bit weights' rounding (quant/weight_rounding.py)."""
    method: str                          # nearest | imatrix | seqmse | gptq | seqmse-gptq (ROUNDINGS)
    what: str = ""
    why: str | None = None               # asked for, the default, or why the default fell back
    modules: int = 0                     # 4-bit linears rounded
    tokens: int = 0                      # calibration tokens their input moments came from (0: not data-aware)
    moments_s: float = 0.0
    rounding_s: float = 0.0
    layer_by_layer: bool = False         # moments recorded and dropped one decoder layer at a time
    mean_output_error_db: float | None = None   # mean relative output error of the roundings, on those tokens


class QualityRecipe(_Recorded):
    """What `--max-ppl-ratio` chose: the modules raised, the perplexities, and the flags to reuse it."""
    max_ppl_ratio: float
    float_ppl: float
    quantized_ppl: float                 # with the recipe, weights as in the graphs, on held-out text
    ratio: float
    ratio_before: float                  # with no module raised
    raised: list[str] = Field(default_factory=list)
    precision: str
    overrides: list[str] = Field(default_factory=list)     # --override flags reproducing the recipe
    added_bytes_per_param: float
    evaluations: list[dict[str, Any]] = Field(default_factory=list)
    ranking: str = ""
    held_out: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0
