"""Static decoder (or a layer range of it) → ONNX, with names that are the same in every variant.

`torch.onnx.export(..., dynamo=False)` (onnxscript is not installed). RMSNorm is written in its
decomposed form (opset 17 has no RMSNormalization). After export every initializer that is not a
named parameter is renamed after its content (`const_<sha>`), so the arN and ar1 graphs carry the
same weight under the same name: that is what lets the QNN EP store it once in a weight-shared
context binary.

A *part* of a split decoder (`layers=(a, b)`) takes `hidden_states` instead of `input_ids`
unless it is the first part, and returns `hidden_states_out` instead of logits unless it is the
last; RoPE tables, mask and the caches of its own layers are its other inputs. (The part's joined
QDQ graph names both after the layer they follow, `hidden_states_after_layer_<i>`: part_stage.py.)
"""
from __future__ import annotations

import hashlib
import io
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from ...quant.chunk_join import set_external
from ..model.input_modes import INPUT_IDS, INPUTS_EMBEDS
from ..model.lora import set_lora
from ..model.static_decoder import StaticDecoder, new_key, new_value, past_key, past_value, position_input_names
from ..model.parts import PartRange, split_layers  # noqa: F401  (split_layers: re-exported)
from .lora_source import LoraSlots
from .weight_dtype import in_float32, part_modules

OPSET = 17            # what the TorchScript exporter is asked for (it goes up to 20)
# the opset the QDQ graphs need (int4 and uint16 Q/DQ, block-wise DequantizeLinear). The graph is
# converted here, without its weights (~0.1 s); ONNX Runtime's quantizer would otherwise convert it
# with the weights in memory and shape-infer a deep copy (~10 s and ~1 GB more per graph, measured).
QUANT_OPSET = 21


def part_input_names(part, first_inputs: tuple[str, ...] = (INPUT_IDS,), caches: bool = True,
                     mrope: bool = False, lora: LoraSlots | None = None, cos_sin: bool = False) -> list[str]:
    """`first_inputs`: the input mode's (llm/model/input_modes.py), taken by the first part; `caches` False:
    the full-context graph, which has no KV inputs; `mrope`: positions are rope_position_ids (llm/model/mrope.py);
    `cos_sin`: positions are RoPE's cos and sin (`--positions cos-sin`); `lora`: the LoRA slots
    (llm/export/lora_source.py), whose A and B of the part's layers come last."""
    first = list(first_inputs) if part.is_first else ["hidden_states"]
    L = part.layers() if caches else range(0)
    adapters = lora.input_names(part.layers()) if lora else []
    return [*first, *position_input_names(mrope, cos_sin), "attention_mask"] + [past_key(i) for i in L] + \
        [past_value(i) for i in L] + adapters


def part_output_names(part, caches: bool = True) -> list[str]:
    last = "logits" if part.is_last else "hidden_states_out"
    L = part.layers() if caches else range(0)
    return [last] + [new_key(i) for i in L] + [new_value(i) for i in L]


def decoder_io(decoder: StaticDecoder) -> dict:
    """The keyword arguments of part_input_names for this decoder's graphs."""
    return {"first_inputs": decoder.input_mode.decoder_inputs, "caches": not decoder.cfg.full, "mrope": decoder.mrope,
            "lora": getattr(decoder, "lora_slots", None), "cos_sin": decoder.cos_sin}


class DecoderPart(nn.Module):
    """Layers [a, b) of a StaticDecoder (+ the embedding of its input mode if first, + norm/lm_head if last)."""

    def __init__(self, decoder: StaticDecoder, part: PartRange):
        super().__init__()
        self.decoder = decoder
        self.part = part

    @property
    def n_first(self) -> int:
        return len(self.decoder.input_mode.decoder_inputs) if self.part.is_first else 1

    def forward(self, *inputs):
        names = self.lora_names()
        if not names:
            return self._layers(*inputs)
        lora = dict(zip(names, inputs[len(inputs) - len(names):]))
        set_lora(self.decoder.lora_branches, self.decoder.lora_slots, lora)
        try:
            return self._layers(*inputs[:len(inputs) - len(names)])
        finally:
            set_lora(self.decoder.lora_branches, self.decoder.lora_slots, None)

    def lora_names(self) -> list[str]:
        slots = getattr(self.decoder, "lora_slots", None)
        return slots.input_names(self.part.layers()) if slots else []

    def _layers(self, *inputs):
        d, part = self.decoder, self.part
        first, (positions, attention_mask, caches) = inputs[:self.n_first], d.split_positions(inputs[self.n_first:])
        n = len(part.layers())
        k_caches, v_caches = (caches[:n], caches[n:]) if caches else ((None,) * n,) * 2
        rope, window_bias = d.position_inputs(positions)
        x = d.embed(*first) if part.is_first else first[0]
        new_k, new_v = [], []
        for j, i in enumerate(part.layers()):
            x, k, v = d.model.layers[i](x, rope, window_bias, attention_mask, k_caches[j], v_caches[j])
            new_k.append(k)
            new_v.append(v)
        if part.is_last:
            x = d.lm_head(d.model.norm(x))
        return (x,) if d.cfg.full else (x, *new_k, *new_v)

    def input_names(self) -> list[str]:
        return part_input_names(self.part, **decoder_io(self.decoder))

    def output_names(self) -> list[str]:
        return part_output_names(self.part, decoder_io(self.decoder)["caches"])

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        slots = getattr(self.decoder, "lora_slots", None)
        shapes = slots.shapes() if slots else {}
        return (*self._graph_inputs(), *[torch.zeros(shapes[n], dtype=torch.float16) for n in self.lora_names()])

    def _graph_inputs(self) -> tuple[torch.Tensor, ...]:
        d = self.decoder
        full = d.example_inputs()
        n_first, n_layers = len(d.input_mode.decoder_inputs), d.spec.n_layers
        first = full[:n_first]
        if not self.part.is_first:
            first = (torch.zeros((1, d.cfg.n_tokens, d.spec.hidden_size)),)
        positions, mask, caches = d.split_positions(full[n_first:])
        if not caches:
            return (*first, *positions, mask)
        ks, vs = caches[:n_layers], caches[n_layers:]
        L = self.part.layers()
        return (*first, *positions, mask, *[ks[i] for i in L], *[vs[i] for i in L])


def export_part(decoder: StaticDecoder, part: PartRange, out_path: Path) -> Path:
    """Write one part as ONNX (its weights as external data beside it); returns the path.

    The exporter is given no weights (`export_params=False`): it serializes a graph whose weights
    are inputs named after the parameters, and each weight is then written here, one at a time, into
    the data file and made an initializer. Exporting the weights held them three times more at once
    (the serialized model inside the exporter, its bytes, the model read back): 4x the part's float32
    weights at the peak, ~1.8x now (one Llama-3.2-1B layer: +0.92 GB before, +0.41 GB now)."""
    return _export(DecoderPart(decoder, part).eval(), part_modules(decoder, part), out_path)


class TokenEmbedder(nn.Module):
    """The embedder part of an embeddings-in bundle (llm/model/input_modes.py): input_ids [1, N] → the
    embeddings entering layer 0 [1, N, hidden], the family's scale applied (the decoder's own lookup)."""

    def __init__(self, decoder: StaticDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids):
        return self.decoder.lookup(input_ids)

    def input_names(self) -> list[str]:
        return [INPUT_IDS]

    def output_names(self) -> list[str]:
        return [INPUTS_EMBEDS]

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return (torch.zeros((1, self.decoder.cfg.n_tokens), dtype=torch.int32),)


def export_embedder(decoder: StaticDecoder, out_path: Path) -> Path:
    """The embedder for the decoder's N tokens per call as ONNX (the table as external data)."""
    return _export(TokenEmbedder(decoder).eval(), [decoder.model.embed_tokens], out_path)


def _export(mod: nn.Module, modules: list[nn.Module], out_path: Path) -> Path:
    import onnx

    out_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with linears_as_matmul(modules) as own_copies, in_float32(modules, skip=own_copies):
            buf = io.BytesIO()
            torch.onnx.export(mod, mod.example_inputs(), buf, input_names=mod.input_names(),
                              output_names=mod.output_names(), opset_version=OPSET, export_params=False,
                              # folding would turn weight-only subgraphs (Gemma's 1 + w) into new weights
                              # this export does not write: they stay nodes
                              do_constant_folding=False, dynamo=False)
            model = onnx.load_from_string(buf.getvalue())
            del buf
            _weights_as_initializers(model, {**dict(mod.named_parameters()), **dict(mod.named_buffers())},
                                     out_path.parent / (out_path.name + ".data"))
    rename_initializers(model)
    model.graph.name = out_path.stem
    onnx.save_model(onnx.version_converter.convert_version(model, QUANT_OPSET), str(out_path))
    return out_path


def _weights_as_initializers(model, tensors: dict[str, torch.Tensor], data_path: Path) -> None:
    """The graph inputs named after a parameter or buffer become initializers, their bytes appended
    to `data_path` (external data, one tensor in memory at a time)."""
    from onnx import TensorProto

    dtypes = {torch.float32: TensorProto.FLOAT, torch.int64: TensorProto.INT64, torch.bool: TensorProto.BOOL}
    g = model.graph
    weights = [(i, vi.name) for i, vi in enumerate(g.input) if vi.name in tensors]
    with open(data_path, "wb") as data:
        for _, name in weights:
            t = tensors[name].detach()
            if t.dtype not in dtypes:
                raise ValueError(f"{name}: {t.dtype} cannot be exported (lift it to float32 first)")
            raw = memoryview(t.contiguous().numpy()).cast("B")   # the tensor's own bytes, not a copy
            init = TensorProto(name=name, data_type=dtypes[t.dtype], dims=list(t.shape))
            set_external(init, data_path.name, data.tell(), raw.nbytes)
            data.write(raw)
            g.initializer.append(init)
            del raw
    for i, _ in reversed(weights):
        del g.input[i]


def _matmul_forward(self, x):
    y = torch.matmul(x, self.weight_t)
    return y if self.bias is None else y + self.bias


@contextmanager
def linears_as_matmul(modules: list[nn.Module]) -> Iterator[frozenset[int]]:
    """Each nn.Linear of `modules` computes x @ W^T from a float32 W^T made here from its (bf16)
    weight, so the exporter writes that tensor as the MatMul's initializer. Exported as nn.Linear,
    W is lifted to float32 and the tracer constant-folds its transpose: two float32 copies of the
    weights held at once, and the export's peak was ~4x the part's float32 weights (one 1B layer,
    226 MB: +0.92 GB). Yields the ids of the weights this replaces (not to be lifted; a weight the
    embedding shares, as a tied lm_head does, is lifted as before)."""
    # nn.Linear's forward, or the `linear` method of a module that projects with its weight before
    # doing more (static_decoder.SoftCappedHead)
    linears = {m: "forward" if isinstance(m, nn.Linear) else "linear" for mod in modules for m in mod.modules()
               if isinstance(m, nn.Linear) or callable(getattr(type(m), "linear", None))}
    shared = {id(p) for mod in modules for m in mod.modules() if m not in linears
              for p in m.parameters(recurse=False)}
    for lin, method in linears.items():
        # a parameter, so the exporter makes it an initializer (a plain tensor becomes a Constant node)
        lin.register_parameter("weight_t", nn.Parameter(lin.weight.detach().float().t().contiguous(), requires_grad=False))
        setattr(lin, method, types.MethodType(_matmul_forward, lin))
    try:
        yield frozenset(id(lin.weight) for lin in linears) - shared
    finally:
        for lin, method in linears.items():
            delattr(lin, method)
            del lin._parameters["weight_t"]


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
    seen, dropped = set(), []
    for i, init in enumerate(g.initializer):
        if init.name in renames:
            init.name = renames[init.name]
        if init.name in seen:
            dropped.append(i)
        seen.add(init.name)
    for i in reversed(dropped):       # in place: rebuilding the list would copy every initializer
        del g.initializer[i]
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
