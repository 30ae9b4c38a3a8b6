"""The precision table: a name → activation/weight types, for every format (ONNX Runtime's QNN
quantizer, ExecuTorch's QnnQuantizer, the LLM path).

Names follow ExecuTorch's QnnQuantizer ("16a8w" = 16-bit activations, 8-bit weights). `fp16`
keeps the float graph and asks the HTP to run it in float16 (`enable_htp_fp16_precision=1`).
`16a4w_block` is 16a4w with one weight scale per block of input channels (LPBQ, HTP V69+).
The SQNR floors are the default pass marks of `modelexport verify` (dB, compiled vs float on the
same inputs); `--min-sqnr` overrides them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.arguments import finite
from ..core.errors import InputError


@dataclass(frozen=True, eq=False, repr=False)
class Precision(str):
    """A row of the table, and its name: the value `modelexport.compile` parses a precision into once,
    which travels where the name did (PartSpec, manifests, folder names, cache keys) and compares,
    hashes, prints and pickles as the name."""
    name: str
    activation_bits: int
    weight_bits: int
    activation_type: str | None      # onnxruntime.quantization.QuantType member name; None = float
    weight_type: str | None
    min_sqnr_db: float
    feature: str | None = None       # a targets.FEATURE_FLOORS entry the target must have
    description: str = ""
    block_wise: bool = False         # weight scales per block of input channels, not per output channel

    def __new__(cls, name: str, *args, **kwargs):
        return super().__new__(cls, name)

    @property
    def quantized(self) -> bool:
        return self.activation_type is not None

    def quant_types(self):
        from onnxruntime.quantization import QuantType
        return QuantType[self.activation_type], QuantType[self.weight_type]

    def to_dict(self) -> dict:
        return {"name": self.name, "activation_bits": self.activation_bits, "weight_bits": self.weight_bits,
                "activation_type": self.activation_type, "weight_type": self.weight_type,
                "quantized": self.quantized, "min_sqnr_db": self.min_sqnr_db}


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp16", 16, 16, None, None, 35.0, "fp16", "float graph run in float16 on the HTP"),
    Precision("8a8w", 8, 8, "QUInt8", "QUInt8", 15.0, None, "uint8 activations, uint8 per-channel weights"),
    Precision("16a8w", 16, 8, "QUInt16", "QUInt8", 18.0, None, "uint16 activations, uint8 per-channel weights"),
    Precision("16a16w", 16, 16, "QUInt16", "QInt16", 25.0, None, "uint16 activations, int16 symmetric weights"),
    Precision("16a4w", 16, 4, "QUInt16", "QInt4", 5.0, None, "uint16 activations, int4 symmetric per-channel weights"),
    Precision("16a4w_block", 16, 4, "QUInt16", "QInt4", 5.0, "block_quant_4bit",
              "uint16 activations, int4 weights with one scale per block of input channels (LPBQ)", block_wise=True),
)}

# ONNX Runtime's QDQ quantizer has no block-wise weights, so the ONNX path offers the others (the
# LLM path makes 16a4w_block itself: 16a4w, then its MatMul weights rewritten, see block_weights).
ONNX_PRECISIONS = tuple(n for n, p in PRECISIONS.items() if not p.block_wise)


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


# other spellings (ONNX Runtime's w8a16, Qualcomm's LPBQ ...), by _key; the names themselves are added below
ALIASES = {"float16": "fp16", "int8": "8a8w", "w8a8": "8a8w", "a8w8": "8a8w", "w8a16": "16a8w", "a16w8": "16a8w",
           "w16a16": "16a16w", "a16w16": "16a16w", "w4a16": "16a4w", "a16w4": "16a4w",
           "w4a16block": "16a4w_block", "lpbq": "16a4w_block"}
_NAMES = {**{_key(n): n for n in PRECISIONS}, **ALIASES}


def get_precision(name: str | Precision, offered: tuple[str, ...] | None = None) -> Precision:
    """The table entry for `name` or one of its spellings (an entry is itself); `offered` is the names
    a format takes (default: all), anything else is refused as unknown, with that list as the fix."""
    found = name.name if isinstance(name, Precision) else _NAMES.get(_key(name))
    choices = offered or tuple(PRECISIONS)
    if found not in choices:
        raise InputError(f"unknown precision {name!r}", f"choose one of: {', '.join(choices)}")
    return PRECISIONS[found]


def pass_mark(min_sqnr: float | None, precision: str | Precision) -> float:
    """The SQNR (dB) a compiled graph passes at: the user's --min-sqnr, else its precision's floor."""
    return min_sqnr if min_sqnr is not None else get_precision(precision).min_sqnr_db


def min_sqnr_option(value) -> float | None:
    """--min-sqnr DB as compile's own pass mark (None: each precision's); the CLI hands a list."""
    if value is None:
        return None
    given = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
    try:
        db = float(given)
    except (TypeError, ValueError):
        shown = " ".join(map(str, given)) if isinstance(given, (list, tuple)) else str(given)
        raise InputError(f"--min-sqnr {shown!r}: one number of dB here (NAME=DB per output is for --precision auto)",
                         "write --min-sqnr 25") from None
    finite("--min-sqnr", db, "25")
    return db


BLOCK_MULTIPLE = 16     # ExecuTorch's QNN LPBQ recipes use blocks of 16, 32, 64 and 128 input channels


def check_block_size(block_size: int | None) -> None:
    """--block-size: input channels per 4-bit weight scale (LPBQ). None means the default."""
    if block_size is None:
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0 or block_size % BLOCK_MULTIPLE:
        raise InputError(f"--block-size {block_size} is not a block size QNN's block quantization (LPBQ) takes: "
                         f"it must be a positive multiple of {BLOCK_MULTIPLE} that divides the layers' input channels",
                         "use --block-size 32 or 64 (16 keeps more accuracy, 128 compresses more)")


def precision_from_bitwidths(act_bits: int | None, weight_bits: int | None, quantize: bool) -> Precision:
    """The seeds' `--quantize --act-bitwidth A --weights-bitwidth W` spelling → a table entry."""
    if not quantize and act_bits is None and weight_bits is None:
        return PRECISIONS["fp16"]
    a, w = act_bits or 8, weight_bits or 8
    per_channel = [p for p in PRECISIONS.values() if p.quantized and not p.block_wise]
    for p in per_channel:
        if (p.activation_bits, p.weight_bits) == (a, w):
            return p
    pairs = ", ".join(f"--act-bitwidth {p.activation_bits} --weights-bitwidth {p.weight_bits}" for p in per_channel)
    raise InputError(f"no QNN precision with {a}-bit activations and {w}-bit weights", f"use one of: {pairs}")
