"""Consecutive chunks of one decoder part, each quantized on its own, joined into the part's graph.

The host exports and quantizes a part in chunks of a few layers (`llm/model/parts.host_chunks`), so what
one process holds grows with the chunk, not with the part; the HTP still gets one graph per part.
The join is exact: a chunk boundary is the residual stream, which the QDQ graphs keep float (the
residual adds and norms are float nodes, see `llm_graphs.FLOAT_NODES`), so chunk k's
`hidden_states_out` feeds chunk k+1's `hidden_states` as it would inside one graph.

No weight is loaded: the graphs are read without their external data, the chunks' data files are
appended into the part's one data file (page-aligned) and each tensor's offset moved by where its
chunk landed.
"""
from __future__ import annotations

from pathlib import Path

# the tensor a chunk hands to the next one, under the name it has inside the joined graph
BOUNDARY_IN, BOUNDARY_OUT = "hidden_states", "hidden_states_out"
_ALIGN = 4096


def _boundary(end_layer: int) -> str:
    return f"hidden_states_after_layer_{end_layer}"


def name_part_boundaries(path: Path, first_layer: int, end_layer: int, is_first: bool, is_last: bool) -> None:
    """Give a part's graph its boundary tensors' names in the whole decoder: `hidden_states` in,
    `hidden_states_out` out become `hidden_states_after_layer_<i>`, the same tensor under the same
    name on both sides of a cut. Genie hands a part's outputs to the next part by name (measured:
    with `hidden_states_out` -> `hidden_states` the second part never received the first's output).
    Only the small .onnx is rewritten (a new file: it may be a hard link into a cache entry)."""
    import onnx
    renames = {}
    if not is_first:
        renames[BOUNDARY_IN] = _boundary(first_layer)
    if not is_last:
        renames[BOUNDARY_OUT] = _boundary(end_layer)
    if not renames:
        return
    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        vi.name = renames.get(vi.name, vi.name)
    for node in g.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
        node.output[:] = [renames.get(x, x) for x in node.output]
    path.unlink()
    onnx.save(model, str(path))


def external_entry(init) -> dict[str, str] | None:
    """A TensorProto's external-data entry ({location, offset, length}), or None when it is inline."""
    from onnx import TensorProto
    if init.data_location != TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in init.external_data}


def node_tensors(nodes):
    """The tensors held in the nodes' attributes (Constant values; subgraphs' too): exporters and
    ONNX Runtime's quantizer put large ones in the external data as well."""
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from sub.initializer
                yield from node_tensors(sub.node)


def set_external(init, location: str, offset: int, length: int) -> None:
    """Point a TensorProto at `length` bytes at `offset` of the file `location` (beside the model)."""
    from onnx import TensorProto
    init.data_location = TensorProto.EXTERNAL
    del init.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = init.external_data.add()
        e.key, e.value = k, v


def _same_inline(a, b) -> bool:
    return (external_entry(a) is None and external_entry(b) is None and a.data_type == b.data_type
            and list(a.dims) == list(b.dims) and a.SerializeToString() == b.SerializeToString())


def join_chunks(chunks: list[tuple[Path, int]], out_path: Path, input_order: list[str],
                output_order: list[str]) -> Path:
    """`chunks`: (the chunk's QDQ .onnx, the layer it ends at), first to last. Writes `out_path`
    (+ `out_path.name + '.data'`) with the graph inputs and outputs in the given orders."""
    import onnx

    models = [onnx.load(str(p), load_external_data=False) for p, _ in chunks]
    joined = onnx.ModelProto()
    joined.CopyFrom(models[0])
    g = joined.graph
    for field in (g.node, g.initializer, g.input, g.output, g.value_info):
        del field[:]
    g.name = out_path.stem
    data_name = out_path.name + ".data"
    inputs, outputs, inits = {}, {}, {}
    node_names: set[str] = set()
    values: set[str] = set()          # every tensor name already in the joined graph
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path.parent / data_name, "wb") as data:
        for k, (model, (path, end_layer)) in enumerate(zip(models, chunks)):
            src = model.graph
            renames: dict[str, str] = {}
            if k > 0:
                renames[BOUNDARY_IN] = _boundary(chunks[k - 1][1])
            if k < len(chunks) - 1:
                renames[BOUNDARY_OUT] = _boundary(end_layer)
            shared = {i.name for i in src.input} - set(renames)      # position_ids, mask, caches
            # one chunk's data file lands at `base` in the joined one
            base = data.tell()
            if base % _ALIGN:
                data.write(b"\0" * (_ALIGN - base % _ALIGN))
                base = data.tell()
            files = {e["location"] for i in src.initializer if (e := external_entry(i))}
            if len(files) > 1:
                raise ValueError(f"{path.name}: its weights are in {len(files)} files, one is expected")
            if files:
                with open(path.parent / files.pop(), "rb") as f:
                    while block := f.read(64 * 2**20):
                        data.write(block)
            for init in src.initializer:
                name = init.name
                if name in inits:
                    if _same_inline(inits[name], init) or (external_entry(init) and not name.endswith(("_scale", "_zero_point"))):
                        continue         # the same constant (names of weights are their content or module)
                    renames[name] = f"{name}__chunk{k}"
                new = joined.graph.initializer.add()
                new.CopyFrom(init)
                new.name = renames.get(name, name)
                if (e := external_entry(init)):
                    set_external(new, data_name, base + int(e.get("offset", 0)), int(e["length"]))
                inits[new.name] = new
            produced = [o for n in src.node for o in n.output]
            for name in produced:
                if name in values and name not in renames:
                    renames[name] = f"{name}__chunk{k}"
            for node in src.node:
                new = g.node.add()
                new.CopyFrom(node)
                if new.name in node_names:
                    new.name = f"{new.name}__chunk{k}"
                node_names.add(new.name)
                for i, name in enumerate(new.input):
                    new.input[i] = renames.get(name, name)
                for i, name in enumerate(new.output):
                    new.output[i] = renames.get(name, name)
                values.update(new.output)
                for t in node_tensors([new]):
                    if (e := external_entry(t)):
                        set_external(t, data_name, base + int(e.get("offset", 0)), int(e["length"]))
            for vi in src.input:
                if vi.name in shared:
                    inputs.setdefault(vi.name, vi)
            for vi in src.output:
                if vi.name not in renames:
                    outputs[vi.name] = vi
            values.update(shared)
            values.update(inits)
    missing = [n for n in input_order if n not in inputs] + [n for n in output_order if n not in outputs]
    if missing:
        raise ValueError(f"joined chunks lack {missing[:4]}")
    g.input.extend(inputs[n] for n in input_order)
    g.output.extend(outputs[n] for n in output_order)
    onnx.save_model(joined, str(out_path))
    return out_path
