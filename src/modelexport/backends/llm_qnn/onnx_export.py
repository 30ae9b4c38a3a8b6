"""Static decoder (or a layer range of it) → ONNX, with names that are the same in every variant.

`torch.onnx.export(..., dynamo=False)` (onnxscript is not installed). RMSNorm is written in its
decomposed form (opset 17 has no RMSNormalization). After export every initializer that is not a
named parameter is renamed after its content (`const_<sha>`), so the arN and ar1 graphs carry the
same weight under the same name: that is what lets the QNN EP store it once in a weight-shared
context binary.

A *part* of a split decoder (`layers=(a, b)`) takes `hidden_states` instead of `input_ids`
unless it is the first part, and returns `hidden_states_out` instead of logits unless it is the
last; RoPE tables, mask and the caches of its own layers are its other inputs.
"""
from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

import torch
from torch import nn

from ...llm.static_decoder import StaticDecoder, new_key, new_value, past_key, past_value
from ...llm.parts import PartRange, split_layers  # noqa: F401  (split_layers: re-exported)

OPSET = 17            # what the TorchScript exporter is asked for (it goes up to 20)
# the opset the QDQ graphs need (int4 and uint16 Q/DQ, block-wise DequantizeLinear). The graph is
# converted here, without its weights (~0.1 s); ONNX Runtime's quantizer would otherwise convert it
# with the weights in memory and shape-infer a deep copy (~10 s and ~1 GB more per graph, measured).
QUANT_OPSET = 21


def part_input_names(part) -> list[str]:
    first = "input_ids" if part.is_first else "hidden_states"
    L = part.layers()
    return [first, "position_ids", "attention_mask"] + [past_key(i) for i in L] + [past_value(i) for i in L]


def part_output_names(part) -> list[str]:
    last = "logits" if part.is_last else "hidden_states_out"
    L = part.layers()
    return [last] + [new_key(i) for i in L] + [new_value(i) for i in L]


class DecoderPart(nn.Module):
    """Layers [a, b) of a StaticDecoder (+ embedding if first, + norm/lm_head if last)."""

    def __init__(self, decoder: StaticDecoder, part: PartRange):
        super().__init__()
        self.decoder = decoder
        self.part = part

    def forward(self, x, position_ids, attention_mask, *caches):
        d, part = self.decoder, self.part
        n = len(part.layers())
        k_caches, v_caches = caches[:n], caches[n:]
        cos, sin = d.model.rotary_emb(position_ids)
        if part.is_first:
            x = d.model.embed_tokens(x)
        new_k, new_v = [], []
        for j, i in enumerate(part.layers()):
            x, k, v = d.model.layers[i](x, cos, sin, attention_mask, k_caches[j], v_caches[j])
            new_k.append(k)
            new_v.append(v)
        if part.is_last:
            x = d.lm_head(d.model.norm(x))
        return (x, *new_k, *new_v)

    def input_names(self) -> list[str]:
        return part_input_names(self.part)

    def output_names(self) -> list[str]:
        return part_output_names(self.part)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        full = self.decoder.example_inputs()
        n_layers = self.decoder.spec.n_layers
        ks, vs = full[3:3 + n_layers], full[3 + n_layers:]
        first = full[0]
        if not self.part.is_first:
            first = torch.zeros((1, self.decoder.cfg.n_tokens, self.decoder.spec.hidden_size))
        L = self.part.layers()
        return (first, full[1], full[2], *[ks[i] for i in L], *[vs[i] for i in L])


# parts whose float32 weights pass this are exported through a file (the exporter writes its own
# external data there above protobuf's 2 GiB) instead of an in-memory buffer, which also holds the
# serialized bytes twice more while they are parsed back
IN_MEMORY_EXPORT_BYTES = 512 * 2**20


def part_float_bytes(mod: "DecoderPart") -> int:
    from ...llm.weight_dtype import part_modules
    seen = {id(p): p for m in part_modules(mod.decoder, mod.part) for p in m.parameters()}
    return sum(4 * p.numel() for p in seen.values())


def export_part(decoder: StaticDecoder, part: PartRange, out_path: Path,
                in_memory_bytes: int = IN_MEMORY_EXPORT_BYTES) -> Path:
    """Write one part as ONNX (its weights as external data beside it); returns the path.
    `in_memory_bytes`: above it the export goes through a file (a test forces it on a tiny model)."""
    import tempfile

    import onnx

    from ...llm.weight_dtype import in_float32, part_modules

    mod = DecoderPart(decoder, part).eval()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad(), in_float32(part_modules(decoder, part)), \
            tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".export-") as tmp:
        warnings.simplefilter("ignore")
        through_file = part_float_bytes(mod) > in_memory_bytes
        target = str(Path(tmp) / "part.onnx") if through_file else io.BytesIO()
        torch.onnx.export(mod, mod.example_inputs(), target, input_names=mod.input_names(),
                          output_names=mod.output_names(), opset_version=OPSET, do_constant_folding=True,
                          dynamo=False)
        model = onnx.load(target) if through_file else onnx.load_from_string(target.getvalue())
        del target
    rename_initializers(model)
    model.graph.name = out_path.stem
    onnx.save_model(model, str(out_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out_path.name + ".data", size_threshold=1024)
    del model
    graph = onnx.load(str(out_path), load_external_data=False)   # weights stay where they are
    onnx.save_model(onnx.version_converter.convert_version(graph, QUANT_OPSET), str(out_path))
    return out_path


def rename_initializers(model) -> None:
    """Initializers that are not named parameters get `const_<sha256[:16]>` of their bytes
    (plus dtype and shape), so identical weights have identical names in every variant."""
    from onnx import numpy_helper

    g = model.graph
    renames: dict[str, str] = {}
    taken = set()
    for init in g.initializer:
        if "." in init.name and not init.name.startswith("onnx::"):
            taken.add(init.name)
            continue
        arr = numpy_helper.to_array(init)
        h = hashlib.sha256(str(arr.dtype).encode() + str(arr.shape).encode() + arr.tobytes()).hexdigest()[:16]
        new = f"const_{h}"
        renames[init.name] = new
    seen = set()
    keep = []
    for init in g.initializer:
        if init.name in renames:
            init.name = renames[init.name]
        if init.name in seen:
            continue
        seen.add(init.name)
        keep.append(init)
    del g.initializer[:]
    g.initializer.extend(keep)
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
