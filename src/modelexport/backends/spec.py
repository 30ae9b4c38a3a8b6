"""What every backend's compile takes: the parts (models) of a bundle and the options."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..core.arguments import at_least
from ..core.errors import InputError
from ..toolchain.htp_options import DEFAULT_OPTIMIZATION_LEVEL, vtcm_whole_mb

DEFAULT_MAX_SEQ_LEN = 512   # an LLM's context when --max-seq-len is not given (every LLM backend)


def max_seq_len_of(value) -> int:
    """--max-seq-len checked (None: the default); 0 or less is refused, never taken for "not given"."""
    at_least("--max-seq-len", value, 2, str(DEFAULT_MAX_SEQ_LEN))
    return DEFAULT_MAX_SEQ_LEN if value is None else int(value)


@dataclass
class PartSpec:
    """One model of a bundle (seed 003: a vision encoder, a token embedder, a decoder ...)."""
    model: Any                               # path, ModelProto or LoadedOnnx
    name: str | None = None
    precision: str = "8a8w"
    calibration: Any = None                  # DIR | list.txt | .npz | "random" | arrays
    input_shapes: Any = None
    input_values: Any = None                 # ONNX: inputs fixed to a value (folds control flow on them)


@dataclass
class CompileOptions:
    """Options every format takes (ONNX models: exactly these)."""
    targets: list[str] = field(default_factory=lambda: ["SM8650"])
    output_format: str = "context-binary"
    vtcm_mb: int | float | str | None = None             # MB, or a size with a unit ('1MB', '1048576B'): whole MB
    optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    per_channel: bool = True
    strict: bool = False
    use_cache: bool = True
    jobs: int | None = None
    random_samples: int = 8
    overrides: list[str] = field(default_factory=list)   # 'REGEX=PRECISION' per-module precisions

    def __post_init__(self):
        # one parse of the VTCM size, checked against the targets before any work; whole MB from here on
        self.vtcm_mb = vtcm_whole_mb(self.vtcm_mb, self.targets)


@dataclass
class OnnxCompileOptions(CompileOptions):
    """ONNX → context binaries / EPContext models / DLC."""
    strict_numerics: bool = False                        # compile's own numerics below the pass mark: exit 7, nothing written
    min_sqnr: Any = None                                 # the pass mark (dB), or --precision auto's budget (also NAME=DB)
    max_drop: float | None = None                        # --precision auto: the task metric may fall this much below float's
    eval_fn: Any = None                                  # its metric: metric(predict) -> float, a callable or "FILE.py:FUNCTION"
    self_check: bool = True                              # run compile's own numerics check (--precision auto's candidates: no)
    image_mean: Any = None                               # --calibration photos/: "R,G,B" on 0..1 pixels (default 0)
    image_std: Any = None                                # (default 1)
    image_bgr: bool = False                              # --calibration photos/: channels in B, G, R order
    calibration_method: str = "minmax"                   # activation ranges: minmax | percentile (quant/onnx_qdq.RANGE_METHODS)
    split_weights: bool = False                          # each convolution's 8-bit weights as two halves (quant/weight_split)


@dataclass
class TorchCompileOptions(CompileOptions):
    """PyTorch → ExecuTorch (.pte)."""
    output_format: str = "pte"
    block_size: int | None = None                        # 16a4w_block: input channels per scale
    rewrites: list[str] = field(default_factory=list)    # opt-in rewrite passes (modelexport.passes)
    fallback: str | None = None                          # where QNN-refused nodes go: xnnpack (default) | portable
    dynamic_shapes: Any = None                           # torch.export dynamic_shapes (Python API; the HTP refuses them)
    strict_numerics: bool = False                        # compile's own numerics below the pass mark: exit 7, nothing written


@dataclass
class LlmCompileOptions(CompileOptions):
    """LLMs (GGUF / HF folder → static decoders)."""
    block_size: int | None = None                        # 16a4w_block: input channels per scale
    variants: Any = None                                 # arN graphs, e.g. "ar1,ar32" or [32, 1]
    max_seq_len: int | None = None                       # context of the static decoders (None: DEFAULT_MAX_SEQ_LEN)
    context_lengths: Any = None                          # graphs per context length over one copy of the weights, e.g. "256,512"
    context_limit_mb: float | None = None                # per-context HTP memory limit (split above it)
    host_chunk_mb: float | None = None                   # float32 weights exported / quantized at a time on the host
    calibration_samples: int | None = None               # samples per variant from the calibration text
    rounding: str | None = None                          # 4-bit weight rounding (quant/weight_rounding.ROUNDINGS)
    max_ppl_ratio: float | None = None                   # quality budget: perplexity x float on held-out text
    inputs: str | None = None                            # the decoder's first input: tokens | embeddings | both (llm/model/input_modes.py)
    positions: str | None = None                         # ids (position_ids) | cos-sin (RoPE's cos and sin as inputs)
    geniex: bool = False                                 # a GenieX folder per target (backends/llm_qnn/geniex.py)
    embedder_precision: str | None = None                # the embedder part of --inputs embeddings: fp16 | 8bit
    executorch_program: bool = False                     # context binaries: also the program qnn_llama_runner runs
    lora: Any = None                                     # PEFT adapter folders: LoRA inputs in the graphs (llm/export/lora_source.py)
    vision_precision: str | None = None                  # a VLM folder's vision part: 16a8w (default) | 8a8w
    image_size: int | None = None                        # a VLM folder's vision part: the square it is built for
    image_calibration: str | None = None                 # VLM text decoders: .npz of vision rows to calibrate image positions on
    vision_encoder: str | None = None                    # the user's vision encoder ONNX beside a text LLM (a VLM bundle)
    image_token: str | None = None                       # --vision-encoder: the prompt token its rows replace (text or id)
    image_mean: Any = None                               # --vision-encoder: "R,G,B" normalization (default ImageNet's)
    image_std: Any = None
    strict_numerics: bool = False                        # compile's own numerics below the pass mark: exit 7, nothing written
    min_sqnr: Any = None                                 # the pass mark (dB) of the logits against float (default per precision)


# The options that only a vision-language compile reads (a text LLM or a .pte refuses them by these names).
VISION_FLAGS = {"vision_encoder": "--vision-encoder", "image_token": "--image-token", "image_size": "--image-size",
                "vision_precision": "--vision-precision", "image_mean": "--image-mean", "image_std": "--image-std"}


def vision_flags_given(opts: LlmCompileOptions) -> list[str]:
    return [flag for name, flag in VISION_FLAGS.items() if getattr(opts, name) is not None]


# Which kinds of model take an option outside CompileOptions: named in the error when it is given to another kind.
OPTION_OWNERS = {TorchCompileOptions: "PyTorch models", LlmCompileOptions: "LLMs (a GGUF file or HF folder)"}


def build_options(options_type: type[CompileOptions], given: dict[str, Any]) -> CompileOptions:
    """The typed options of one format from keyword arguments; an InputError for an option that is not
    this format's (unset values, None and empty lists, count as not given)."""
    mine = {f.name for f in fields(options_type)}
    out, wrong = {}, []
    for name, value in given.items():
        if name in mine:
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        elif value not in (None, [], ()):
            wrong.append(name)
    if wrong:
        known = {f.name for t in OPTION_OWNERS for f in fields(t)}
        owners = sorted({owner for t, owner in OPTION_OWNERS.items() for f in fields(t) if f.name in wrong})
        unknown = [w for w in wrong if w not in known]
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(sorted(unknown))}",
                             f"compile takes: {', '.join(sorted(known | mine))}")
        flags = " / ".join("--" + w.replace("_", "-") for w in wrong)
        verb, them = ("applies", "it") if len(wrong) == 1 else ("apply", "them")
        raise InputError(f"{flags} {verb} to {' and '.join(owners)}", f"leave {them} out for this model")
    return options_type(**out)


_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def part_name(base: str, taken: set[str]) -> str:
    """`base` as a part's name: safe as a folder name in the bundle, and not in `taken` (which it joins)."""
    base = "".join(c if c in _NAME_OK else "_" for c in base) or "model"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name
