"""manifest.json: the contract between compile and everything after it.

inspect, run, verify, generate and profile read the manifest; they never guess.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..core.files import MANIFEST_NAME, REPORT_NAME, sha256_file  # noqa: F401  (re-exported)

SCHEMA_VERSION = 1


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


class GraphSpec(BaseModel):
    name: str
    file: str | None = None              # the file in the bundle holding this graph
    kind: str = "model"                  # e.g. context-binary, epcontext-onnx, pte-method, onnx
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    target: str | None = None
    htp_arch: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class FileEntry(BaseModel):
    path: str
    size: int
    sha256: str
    role: str = "artifact"


class SourceModel(BaseModel):
    path: str | None = None
    sha256: str | None = None
    format: str | None = None           # onnx, pytorch, hf-folder, gguf
    description: str | None = None


class Manifest(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: str = "model"                 # model | llm
    created_by: str = "modelexport"
    source: SourceModel = Field(default_factory=SourceModel)
    targets: list[str] = Field(default_factory=list)
    htp_arch: dict[str, int] = Field(default_factory=dict)   # target → arch, as read back from binaries
    precision: str | None = None
    format: str | None = None           # context-binary, pte, ...
    qairt_build: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    calibration: dict[str, Any] = Field(default_factory=dict)
    graphs: list[GraphSpec] = Field(default_factory=list)
    files: list[FileEntry] = Field(default_factory=list)
    placement: dict[str, Any] = Field(default_factory=dict)
    numerics: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True)


def tool_versions() -> dict[str, str]:
    """Versions of the libraries that shaped an artifact, read from installed metadata."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("modelexport", "torch", "executorch", "onnxruntime", "onnxruntime-qnn", "onnx", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out
