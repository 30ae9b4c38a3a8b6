"""Load an ONNX model, check it, and fix its dynamic dimensions.

The HTP runs static graphs only: every input dimension must be a number. `--input-shape
name=1,3,224,224` fixes symbolic or unknown dimensions; a model that still has one is refused
(compile) or audited as it is (audit shows where the EP gives up).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from google.protobuf.message import DecodeError

from ..core.errors import InputError, Setting
from . import frontend

_SHAPE_EXAMPLE = Setting("input_shapes", {"image": [1, 3, 224, 224]})
# ONNX element type → numpy dtype name
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
               9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


@dataclass
class IOSpec:
    name: str
    shape: list[int | str]          # a str is a symbolic / unknown dimension
    dtype: str                      # numpy name

    @property
    def dynamic_dims(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not isinstance(d, int) or d <= 0]

    @property
    def static_shape(self) -> tuple[int, ...]:
        if self.dynamic_dims:
            raise InputError(f"input {self.name!r} has dynamic dimensions {self.shape}", "give {setting}",
                             Setting("input_shapes", {self.name: self.shape_to_fill}))
        return tuple(int(d) for d in self.shape)

    @property
    def shape_to_fill(self) -> list[int | str]:
        """The shape with N where the user must give a size."""
        return self.shape_with({})

    def shape_with(self, placeholders: Mapping[str, str]) -> list[int | str]:
        """The shape with each size to give written as its dimension's placeholder, else N."""
        return [d if isinstance(d, int) and d > 0 else placeholders.get(str(d), "N") for d in self.shape]

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype}


@dataclass
class LoadedOnnx:
    """An ONNX model in memory, with its IO as the HTP will see it."""
    path: Path | None
    model: Any                       # onnx.ModelProto
    sha256: str                      # of the file as given (before any shape fixing)
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    fixed_shapes: dict[str, list[int]] = field(default_factory=dict)
    kind: str = "onnx"
    repairs: list[dict] = field(default_factory=list)           # backends' graph repairs, for the manifest
    detached_metadata: list[tuple[str, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem if self.path else (self.model.graph.name or "model")

    @property
    def dynamic_inputs(self) -> list[IOSpec]:
        return [i for i in self.inputs if i.dynamic_dims]

    def require_static(self) -> None:
        dyn = self.dynamic_inputs
        if dyn:
            shown = ", ".join(f"{i.name}{i.shape}" for i in dyn)
            holders = dimension_placeholders(dyn)
            which = (f"replace {', '.join(holders.values())} by the sizes you will run" if holders
                     else "replace N by the size you will run")
            raise InputError(f"the model has dynamic input dimensions ({shown}); the HTP runs static graphs only",
                             f"fix them with {{setting}} ({which})",
                             Setting("input_shapes", {i.name: i.shape_with(holders) for i in dyn}))

    def to_bytes(self) -> bytes:
        return self.model.SerializeToString()


_ANONYMOUS_DIM = re.compile(r"^(unk__\d+|\?|None|-?\d+|)$")   # tf2onnx's unk__N, unknown or numbered


def dimension_placeholders(inputs: Iterable[IOSpec]) -> dict[str, str]:
    """{symbolic dimension name: its placeholder} when the inputs' sizes to give carry several names
    (a graph model's num_atoms, num_edges: NUM_ATOMS, NUM_EDGES); {} for one or none (all N)."""
    names = sorted({str(d) for i in inputs for d in i.shape
                    if not (isinstance(d, int) and d > 0) and not _ANONYMOUS_DIM.match(str(d))})
    return {n: re.sub(r"\W+", "_", n).strip("_").upper() or "N" for n in names} if len(names) > 1 else {}


def parse_input_shapes(specs: Iterable[str] | Mapping[str, Iterable[int]] | None) -> dict[str, list[int]]:
    """`["image=1,3,224,224", "mask=1x128"]` or `{"image": [1,3,224,224]}` → {name: [dims]}."""
    if not specs:
        return {}
    if isinstance(specs, Mapping):
        items = [(k, list(v)) for k, v in specs.items()]
    else:
        items = []
        for s in specs:
            name, sep, dims = str(s).partition("=")
            if not sep or not name.strip():
                raise InputError(f"--input-shape {s!r} is not NAME=DIMS", "write it as {setting}", _SHAPE_EXAMPLE)
            try:
                items.append((name.strip(), [int(d) for d in re.split(r"[,x\s]+", dims.strip().strip("[]()")) if d]))
            except ValueError:
                raise InputError(f"--input-shape {s!r}: dimensions must be integers",
                                 "write it as {setting}", _SHAPE_EXAMPLE) from None
    out = {}
    for name, dims in items:
        if not dims or any(d <= 0 for d in dims):
            raise InputError(f"--input-shape for {name!r} must be positive integers, got {dims}",
                             "write it as {setting}", _SHAPE_EXAMPLE)
        out[name] = dims
    return out


def parse_input_values(specs: Iterable[str] | Mapping[str, Any] | None, inputs: list[IOSpec]) -> dict[str, Any]:
    """`["sr=16000", "mask=1,0,1"]` or `{"sr": 16000}` → {name: numpy array of the input's dtype and shape}."""
    import numpy as np
    if not specs:
        return {}
    if isinstance(specs, Mapping):
        items = list(specs.items())
    else:
        items = []
        for s in specs:
            name, sep, value = str(s).partition("=")
            if not sep or not name.strip() or not value.strip():
                raise InputError(f"--input-value {s!r} is not NAME=VALUE", "write it as --input-value sr=16000")
            items.append((name.strip(), [v for v in re.split(r"[,\s]+", value.strip().strip("[]()")) if v]))
    by_name = {i.name: i for i in inputs}
    out = {}
    for name, value in items:
        spec = by_name.get(name)
        if spec is None:
            raise InputError(f"--input-value names {name!r}, which the model does not have as an input",
                             f"the model's inputs are: {', '.join(by_name) or '(none)'}")
        try:
            arr = np.asarray(value, dtype=spec.dtype)
        except (TypeError, ValueError):
            raise InputError(f"--input-value {name}: {value!r} is not a {spec.dtype} value",
                             f"give {spec.dtype} numbers, e.g. --input-value {name}=1") from None
        if arr.ndim == 1 and arr.size == 1 and len(spec.shape) == 0:
            arr = arr.reshape(())
        static = all(isinstance(d, int) and d > 0 for d in spec.shape) and spec.shape != ["?rank"]
        if static and list(arr.shape) != list(spec.shape):
            if arr.size != int(np.prod(spec.shape or [1])):
                raise InputError(f"--input-value {name} has {arr.size} value(s); the input's shape is {spec.shape}",
                                 f"give {int(np.prod(spec.shape or [1]))} comma-separated value(s)")
            arr = arr.reshape(spec.shape)
        out[name] = arr
    return out


def _io_specs(values, initializer_names: set[str]) -> list[IOSpec]:
    out = []
    for v in values:
        if v.name in initializer_names:
            continue
        tt = v.type.tensor_type
        dims: list[int | str] = []
        if tt.HasField("shape"):
            for i, d in enumerate(tt.shape.dim):
                dims.append(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or f"?{i}"))
        else:
            dims = ["?rank"]
        out.append(IOSpec(v.name, dims, ONNX_DTYPES.get(tt.elem_type, f"onnx:{tt.elem_type}")))
    return out


def _not_onnx(path: Path, why: str) -> InputError:
    return InputError(f"{path} is not a valid ONNX model ({why})",
                      "give a .onnx file written by torch.onnx.export or an ONNX tool; re-export it if it was truncated")


def _parse(data: bytes, path: Path):
    import onnx
    if not data:
        raise _not_onnx(path, "the file is empty")
    if data[:4] in (b"PK\x03\x04", b"GGUF") or data[:1] in (b"{", b"<"):
        raise _not_onnx(path, "it looks like a zip/GGUF/JSON/HTML file")
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise _not_onnx(path, f"protobuf decode failed: {str(e).splitlines()[0][:120]}") from None
    if model.ir_version <= 0 or not model.graph.node or not model.opset_import:
        raise _not_onnx(path, "no graph, IR version or opset in it")
    return model


def _apply_shapes(model, shapes: dict[str, list[int]], inputs: list[IOSpec]) -> None:
    """Write the fixed dims into the graph inputs and re-infer every other shape."""
    import onnx
    by_name = {i.name: i for i in inputs}
    unknown = sorted(set(shapes) - set(by_name))
    if unknown:
        raise InputError(f"--input-shape names {', '.join(unknown)}, which the model does not have as inputs",
                         f"the model's inputs are: {', '.join(by_name) or '(none)'}")
    for v in model.graph.input:
        if v.name not in shapes:
            continue
        dims, spec = shapes[v.name], by_name[v.name]
        if spec.shape != ["?rank"] and len(dims) != len(spec.shape):
            raise InputError(f"--input-shape {v.name} has {len(dims)} dimensions; the model's input has {len(spec.shape)} {spec.shape}",
                             f"give {len(spec.shape)} numbers")
        for i, (want, have) in enumerate(zip(dims, spec.shape)):
            if isinstance(have, int) and have > 0 and have != want:
                raise InputError(f"--input-shape {v.name}: dimension {i} is fixed to {have} in the model, not {want}",
                                 f"use {have} there (only symbolic dimensions can be set)")
        shape = v.type.tensor_type.shape
        del shape.dim[:]
        for d in dims:
            shape.dim.add().dim_value = d
    # Stale symbolic shapes of intermediate values and outputs would contradict the fixed inputs; the
    # static ones of ops ONNX cannot infer (com.microsoft: a repair typed them) are kept.
    custom = {o for n in model.graph.node if n.domain not in ("", "ai.onnx") for o in n.output}
    kept = [v for v in model.graph.value_info if v.name in custom and v.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    declared = {}     # every output's shape: symbolic ones, and static ones the exporter wrote for another input
    for o in model.graph.output:  # size (ppocr_v2_rec declares 25 steps for its 320-wide input's 80)
        if o.type.tensor_type.HasField("shape"):
            declared[o.name] = onnx.TensorShapeProto()
            declared[o.name].CopyFrom(o.type.tensor_type.shape)
            o.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:
        raise InputError(f"the fixed shapes do not fit the model: {str(e).splitlines()[0][:200]}",
                         "check the --input-shape values against the model's inputs") from None
    for o in inferred.graph.output:      # not inferred (after an op ONNX does not know): the exporter's shape again
        if o.name in declared and not o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.CopyFrom(declared[o.name])
    model.CopyFrom(inferred)


@frontend("onnx", kind="onnx", accepts=lambda obj: (isinstance(obj, (str, Path)) and str(obj).lower().endswith(".onnx"))
          or type(obj).__name__ == "ModelProto" or isinstance(obj, LoadedOnnx))
def load_onnx(source, input_shapes: Iterable[str] | Mapping[str, Iterable[int]] | None = None,
              allow_dynamic: bool = False) -> LoadedOnnx:
    """Read and check an ONNX model; fix dynamic dims from `input_shapes`.

    Raises InputError for a missing, corrupt or non-ONNX file and (unless `allow_dynamic`) for
    dynamic input dimensions left unfixed."""
    import onnx
    if isinstance(source, LoadedOnnx):
        if input_shapes:
            source = load_onnx(source.model, input_shapes, allow_dynamic)
        elif not allow_dynamic:
            source.require_static()
        return source
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise InputError(f"{path} does not exist", "check the model path")
        if path.is_dir():
            raise InputError(f"{path} is a folder, not an ONNX file", "give the .onnx file")
        data = path.read_bytes()
        model = _parse(data, path)
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
            try:
                onnx.load_external_data_for_model(model, str(path.parent))
            except Exception as e:
                raise InputError(f"{path} refers to external weight files that cannot be read: {e}",
                                 "keep the .onnx.data file next to the model") from None
    else:
        path, model = None, onnx.ModelProto()
        model.CopyFrom(source)
        data = model.SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise InputError(f"{path or 'the model'} is not a valid ONNX model: {str(e).splitlines()[0][:200]}",
                         "re-export the model; `python -c \"import onnx; onnx.checker.check_model('m.onnx')\"` shows the details") from None
    inits = {t.name for t in model.graph.initializer}
    inputs = _io_specs(model.graph.input, inits)
    shapes = parse_input_shapes(input_shapes)
    if shapes:
        _apply_shapes(model, shapes, inputs)
        inputs = _io_specs(model.graph.input, inits)
    else:
        # Shapes of intermediate values help MAC counts and the EP; inference never hurts here.
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:
            pass
    loaded = LoadedOnnx(path, model, sha, inputs, _io_specs(model.graph.output, set()), shapes)
    if not allow_dynamic:
        loaded.require_static()
    return loaded
