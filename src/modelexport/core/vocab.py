"""The words a bundle's writers and readers must agree on, one `StrEnum` each.

Every value here is written by some compile (`backends/*/compile.py`) and read by some later step;
the manifest stores them as these plain strings, so the JSON is unchanged by using the enums. A
reader compares with the members, never with a literal, and accepts nothing a writer cannot produce.
"""
from __future__ import annotations

from enum import StrEnum


class BundleKind(StrEnum):
    """`Manifest.kind`: what a bundle holds."""
    MODEL = "model"                    # ONNX / PyTorch models (ort_qnn, executorch_qnn)
    LLM = "llm"                        # ar-N static decoders + Genie config (llm_qnn)


class Format(StrEnum):
    """`Manifest.format`: the artifact format a bundle was compiled to (`compile --format`)."""
    CONTEXT_BINARY = "context-binary"  # EPContext .onnx + raw QNN context binary per target
    DLC = "dlc"                        # QNN IR container dumped through libQnnIr.so
    PTE = "pte"                        # ExecuTorch program with the QNN delegate


class GraphKind(StrEnum):
    """`GraphSpec.kind`: what one compiled graph of a bundle is."""
    CONTEXT_BINARY = "context-binary"  # a graph inside a QNN context binary
    DLC = "dlc"                        # a DLC of one part
    PTE_METHOD = "pte-method"          # a method of a .pte


class Role(StrEnum):
    """`FileEntry.role`: what a file in a bundle is for."""
    FLOAT_MODEL = "float-model"                    # the float reference (.onnx, .pt2)
    QUANTIZED_MODEL = "quantized-model"            # the QDQ (fake-quant) .onnx
    QUANTIZED_MODEL_DATA = "quantized-model-data"  # its external tensor data
    VERIFY_INPUTS = "verify-inputs"                # samples `verify` compares on (.npz)
    PTE = "pte"                                    # an ExecuTorch program
    HOST_PTE = "host-pte"                          # LLMs: the unshared twin of a .pte (simulator)
    TOKENIZER = "tokenizer"                        # tokenizer.json
    TOKENIZER_CONFIG = "tokenizer-config"          # the tokenizer's other files
    HOST_EPCONTEXT_MODEL = "host-epcontext-model"  # LLMs: the unshared twin's EPContext model (simulator)
    HOST_CONTEXT_BINARY = "host-context-binary"    # LLMs: the unshared twin's context binary
    CONTEXT_BINARY = "context-binary"              # a QNN context binary for a target
    EPCONTEXT_MODEL = "epcontext-model"            # the EPContext .onnx referencing a context binary
    GENIE_CONFIG = "genie-config"                  # Genie's dialog config (checked by libGenie)
    GENIE_LUT = "genie-lut"                        # LLMs taking embeddings: Genie's token → embedding table
    LORA_ADAPTER = "lora-adapter"                  # LLMs: a PEFT LoRA adapter's files, fed as graph inputs
    LORA_INPUTS = "lora-inputs"                    # LLMs: one LoRA graph input of an adapter, float32 .raw (Genie's files)
    ROPE_TABLE = "rope-table"                      # LLMs, --positions cos-sin: cos and sin by position (.npz)
    GENIEX = "geniex"                              # LLMs, --geniex: a context binary of a target's GenieX folder
    GENIEX_CONFIG = "geniex-config"                # LLMs, --geniex: its metadata.json, config and tokenizer files
    DLC = "dlc"                                    # a QNN IR container
    REPORT = "report"                              # report.html
    ARTIFACT = "artifact"                          # anything else
