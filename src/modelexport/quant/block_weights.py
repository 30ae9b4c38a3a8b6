"""Block-wise 4-bit MatMul weights in the form the QNN EP lowers to HTP LPBQ (16a4w_block).

ONNX Runtime's QDQ quantizer gives a MatMul weight one scale per output channel; at 4 bits that
loses too much (SmolLM2 16a4w: fake-quant perplexity 75 vs float 31.7). The HTP's low-power block
quantization (LPBQ) keeps one scale per block of `block` input channels, itself quantized: a float
scale per output channel times a 4-bit integer per block. The QNN EP fuses this ONNX pattern into
it (its `LowPowerBlockQuantizedMatMulFusion`; checked here on the x86 simulator: all on the HTP):

    DequantizeLinear(uint8 block scales [K/block, N], float per-channel scale [N], 0, axis=1) -> S
    DequantizeLinear(int4 weight [K, N], S, int4 zeros [K/block, N], axis=0, block_size=block) -> MatMul

This module rewrites the per-channel int4 weights of a quantized graph into that pattern, from
the float weights, after ONNX Runtime has quantized everything else.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .chunk_join import external_entry, node_tensors, set_external

DEFAULT_BLOCK = 32          # the GGUF Q4_1 block; 64 crashed the x86 simulator loading the binary (see docs)
_QMIN, _QMAX = -8, 7            # int4, the whole grid
_SCALE_LEVELS = 15              # uint4 block scales 1..15
_SLICE_ELEMENTS = 2**20         # weights searched per slice of columns (4 MB of float32: the buffers stay in cache; 2^22 was ~1.5x slower)


@dataclass
class BlockWeight:
    q: np.ndarray               # int8 values in [-8, 7], [K, N]
    block_scales: np.ndarray    # uint8 in [1, 15], [K/block, N]
    channel_scale: np.ndarray   # float32, [N]

    def dequantized(self, block: int) -> np.ndarray:
        k, n = self.q.shape
        s = self.block_scales.astype(np.float32) * self.channel_scale        # [K/block, N]
        return (self.q.reshape(k // block, block, n) * s[:, None, :]).reshape(k, n)


def quantize_blocks(w: np.ndarray, block: int, importance: np.ndarray | None = None,
                    channel_factors: tuple[float, ...] = (1.0,)) -> BlockWeight:
    """LPBQ quantization of a [K, N] MatMul weight: the column's scale of scales is its largest
    block's fitting scale / 15 (times the one of `channel_factors` with the smallest error: below 1
    clips that block). Each block takes the integer scale below or above its fitting one with the
    smaller squared error; with `importance` [K] (each input's mean square on real text, llama.cpp's
    "imatrix"), any of 1..15 with the smallest error weighted by it. Columns are independent, so a
    wide weight is done in slices of columns: the search's temporaries stay a few times a slice."""
    k, n = w.shape
    step = max(1, _SLICE_ELEMENTS // k)
    if n > step:
        parts = [quantize_blocks(w[:, i:i + step], block, importance, channel_factors) for i in range(0, n, step)]
        return BlockWeight(np.concatenate([p.q for p in parts], axis=1),
                           np.concatenate([p.block_scales for p in parts], axis=1),
                           np.concatenate([p.channel_scale for p in parts]))
    wb = w.astype(np.float32).reshape(k // block, block, n)
    ideal = np.maximum(wb.max(axis=1) / _QMAX, wb.min(axis=1) / _QMIN)          # [K/block, N]
    ideal = np.maximum(ideal, np.finfo(np.float32).tiny)
    top = (ideal.max(axis=0) / _SCALE_LEVELS).astype(np.float32)               # [N]
    weight = None if importance is None else importance.astype(np.float32).reshape(k // block, block, 1)
    search = (_LevelSearch if weight is None else _TorchLevelSearch)(wb, weight)
    best = None
    for f in channel_factors:
        channel = (top * f).astype(np.float32)
        # every level with importance weights: a block often does best far below its fitting scale,
        # clipping inputs that are rarely large (SmolLM2: 1.12x float's held-out perplexity, 1.16x
        # with levels fit-3..fit+1). Unweighted, clipping by weight error does not pay (all 15 levels:
        # 1.23x on held-out text but 1.35x on the reference span, against 1.26x and 1.23x), so
        # nearest keeps the two levels around the fitting one.
        fit = ideal / channel
        levels = ([np.full(fit.shape, lv, np.float32) for lv in range(1, _SCALE_LEVELS + 1)] if weight is not None
                  else [np.clip(r(fit), 1, _SCALE_LEVELS) for r in (np.floor, np.ceil)])
        err, s = search.best_level(channel, levels)
        total = err.sum(axis=0)                                                 # [N]
        if best is None:
            best = [total, s, channel]
            continue
        better = total < best[0]
        best = [np.minimum(total, best[0]), np.where(better, s, best[1]), np.where(better, channel, best[2])]
    q = search.rounded(best[1] * best[2])
    return BlockWeight(q.reshape(k, n), best[1].astype(np.uint8), best[2].astype(np.float32))


class _LevelSearch:
    """The candidate block scales of wb [K/block, block, N] (float32) scored in one reused buffer:
    the same float32 operations, in the same order, as `((clip(round(wb / eff)) * eff - wb) ** 2
    * weight).sum(axis=1)`, so the same errors to the bit and the same choices, without a new array
    per operation. The integers are not kept per candidate: only the chosen scale, rounded again at
    the end. Numpy here: the plain search (2 candidates) runs in the quantization workers, which do
    not load torch (+0.2 GB and 3 s each); the importance search is `_TorchLevelSearch`."""

    def __init__(self, wb: np.ndarray, weight: np.ndarray | None):
        self.wb, self.weight, self.buf = wb, weight, np.empty_like(wb)

    def _quantized(self, eff: np.ndarray) -> np.ndarray:
        e = eff[:, None, :]
        np.divide(self.wb, e, out=self.buf)
        np.round(self.buf, out=self.buf)
        return np.clip(self.buf, _QMIN, _QMAX, out=self.buf)

    def errors(self, eff: np.ndarray) -> np.ndarray:
        """Per block the (weighted) squared error [K/block, N] of rounding under scales eff [K/block, N]."""
        d = self._quantized(eff)
        np.multiply(d, eff[:, None, :], out=d)
        np.subtract(d, self.wb, out=d)
        np.square(d, out=d)
        if self.weight is not None:
            np.multiply(d, self.weight, out=d)
        return d.sum(axis=1)

    def best_level(self, channel: np.ndarray, levels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per block the one of `levels` (candidate integer scales, each [K/block, N]) under the column
        scales `channel` [N] with the smallest error, the first on a tie: (error, scale)."""
        best_err = best_s = None
        for s in levels:
            err = self.errors(s * channel)
            if best_err is None:
                best_err, best_s = err, s
            else:
                better = err < best_err
                best_err = np.where(better, err, best_err)
                best_s = np.where(better, s, best_s)
        return best_err, best_s

    def rounded(self, eff: np.ndarray) -> np.ndarray:
        """The integers (int8 [K/block, block, N]) under the chosen scales eff [K/block, N]."""
        return self._quantized(eff).astype(np.int8)


class _TorchLevelSearch(_LevelSearch):
    """The importance search (15 levels x the channel factors: ~40x the plain one's candidates) by
    torch's threaded in-place ops, 2x numpy's speed on one thread (its round and clip are slow); the
    sum over the block stays numpy's, whose order is sequential where torch's is not (a 1B
    down_proj: 11.6 s in numpy arrays before)."""

    def __init__(self, wb: np.ndarray, weight: np.ndarray | None):
        import torch
        super().__init__(wb, weight)
        self.t_wb, self.t_buf = torch.from_numpy(wb), torch.from_numpy(self.buf)
        self.t_weight = None if weight is None else torch.from_numpy(weight)

    def _quantized(self, eff: np.ndarray) -> np.ndarray:
        import torch
        torch.div(self.t_wb, torch.from_numpy(np.ascontiguousarray(eff[:, None, :])), out=self.t_buf)
        self.t_buf.round_().clamp_(_QMIN, _QMAX)
        return self.buf

    def errors(self, eff: np.ndarray) -> np.ndarray:
        import torch
        self._quantized(eff)
        d = self.t_buf
        d.mul_(torch.from_numpy(np.ascontiguousarray(eff[:, None, :]))).sub_(self.t_wb)
        d.mul_(d)
        if self.t_weight is not None:
            d.mul_(self.t_weight)
        return self.buf.sum(axis=1)


def rewrite_block_weights(qdq_model, float_weights: dict[str, np.ndarray], block: int,
                          rounded: dict[str, BlockWeight] | None = None) -> int:
    """Turn every MatMul weight named in `float_weights` ({MatMul node name: float [K, N]}) from
    its per-channel DequantizeLinear into the LPBQ pair, in place; returns how many. `rounded`
    ({node name: BlockWeight}) gives a node's blocks as already chosen (a data-aware rounding)."""
    from onnx import helper, numpy_helper

    g = qdq_model.graph
    opset = next((o.version for o in qdq_model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 21:
        raise ValueError(f"block-wise DequantizeLinear needs ONNX opset 21, the model has {opset}")
    producers = {o: node for node in g.node for o in node.output}
    inits = {i.name: i for i in g.initializer}
    dead: set[str] = set()
    done = 0
    new_inits = []
    for node in list(g.node):
        if node.op_type != "MatMul" or node.name not in float_weights:
            continue
        w = float_weights[node.name]
        dq = producers.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or w.shape[0] % block:
            continue
        bw = (rounded or {}).get(node.name) or quantize_blocks(w, block)
        if bw.q.shape != w.shape or bw.block_scales.shape != (w.shape[0] // block, w.shape[1]):
            raise ValueError(f"the rounded weight of {node.name} is {bw.q.shape} in blocks {bw.block_scales.shape}, "
                             f"the graph's is {w.shape} in blocks of {block}")
        k, n = w.shape
        base = dq.input[0]
        dead.update(x for x in dq.input if x in inits)
        names = {s: f"{base}_lpbq_{s}" for s in ("q", "scales", "channel", "channel_zero", "zero", "block_scale")}
        new_inits += [
            int4_tensor(names["q"], bw.q),
            numpy_helper.from_array(bw.block_scales, names["scales"]),
            numpy_helper.from_array(bw.channel_scale, names["channel"]),
            numpy_helper.from_array(np.zeros(n, np.uint8), names["channel_zero"]),
            int4_tensor(names["zero"], np.zeros((k // block, n), np.int8)),
        ]
        scale_dq = helper.make_node("DequantizeLinear", [names["scales"], names["channel"], names["channel_zero"]],
                                    [names["block_scale"]], name=f"{dq.name}_block_scale", axis=1)
        g.node.insert(list(g.node).index(dq), scale_dq)
        dq.domain = ""   # ONNX's own DequantizeLinear (opset 21) has block_size; the contrib one does not
        del dq.input[:]
        dq.input.extend([names["q"], names["block_scale"], names["zero"]])
        del dq.attribute[:]
        dq.attribute.extend([helper.make_attribute("axis", 0), helper.make_attribute("block_size", block)])
        done += 1
    still_used = {x for node in g.node for x in node.input}
    keep = [i for i in g.initializer if i.name not in dead or i.name in still_used]
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    return done


def rewrite_channel_weights(qdq_model, rounded: dict[str, BlockWeight]) -> int:
    """Replace the integers and scales of the per-channel int4 DequantizeLinear feeding each MatMul
    named in `rounded` ({node name: BlockWeight with one block}) in place; returns how many."""
    from onnx import TensorProto, numpy_helper

    g = qdq_model.graph
    producers = {o: node for node in g.node for o in node.output}
    inits = {i.name: i for i in g.initializer}
    done = 0
    for node in g.node:
        bw = rounded.get(node.name) if node.op_type == "MatMul" else None
        dq = producers.get(node.input[1]) if bw is not None else None
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or dq.input[1] not in inits:
            continue
        q_init, s_init = inits[dq.input[0]], inits[dq.input[1]]
        if list(q_init.dims) != list(bw.q.shape) or q_init.data_type != TensorProto.INT4:
            raise ValueError(f"{node.name}: the graph's weight is {list(q_init.dims)} (type {q_init.data_type}), "
                             f"the rounded one int4 {list(bw.q.shape)}")
        q_init.CopyFrom(int4_tensor(q_init.name, bw.q))
        s_init.CopyFrom(numpy_helper.from_array((bw.channel_scale * bw.block_scales[0]).astype(np.float32), s_init.name))
        done += 1
    return done


def load_rounded(path, node_modules: dict[str, str]) -> dict[str, BlockWeight]:
    """{node name: BlockWeight} from the rounded-weights file (keyed by module name) for the
    MatMul nodes `node_modules` ({node name: module name}) it holds."""
    with np.load(path) as f:
        have = {k.rpartition("|")[0] for k in f.files}
        return {node: BlockWeight(f[f"{mod}|q"], f[f"{mod}|block_scales"], f[f"{mod}|channel_scale"])
                for node, mod in node_modules.items() if mod in have}


def to_block_weights(qdq_path, float_path, node_names: set[str], block: int,
                     rounded: dict[str, BlockWeight] | None = None) -> int:
    """Rewrite the quantized model file `qdq_path` (external data beside it) in place: the weights
    of the MatMul nodes `node_names`, taken in float from `float_path`, become LPBQ blocks (as
    given in `rounded` for the nodes it names). One float weight is read at a time and the graph's
    other tensors are copied file to file, so the process holds about one weight, not the graph."""
    import onnx

    qdq_path, float_path = Path(qdq_path), Path(float_path)
    fm = onnx.load(str(float_path), load_external_data=False)
    inits = {i.name: i for i in fm.graph.initializer}
    wanted = {n.name: inits[n.input[1]] for n in fm.graph.node if n.op_type == "MatMul" and n.name in node_names}
    model = onnx.load(str(qdq_path), load_external_data=False)
    n = rewrite_block_weights(model, _FloatWeights(wanted, float_path.parent), block, rounded)
    _save(model, qdq_path)
    return n


def to_channel_weights(qdq_path, rounded: dict[str, BlockWeight]) -> int:
    """Rewrite the per-channel int4 weights of the nodes in `rounded` in the model file `qdq_path`."""
    import onnx
    qdq_path = Path(qdq_path)
    model = onnx.load(str(qdq_path), load_external_data=False)
    n = rewrite_channel_weights(model, rounded)
    _save(model, qdq_path)
    return n


def int4_tensor(name: str, q: np.ndarray):
    """An INT4 TensorProto of the int8 values `q` in [-8, 7], packed two per byte as raw data (the
    repeated-int32 form takes 4 bytes a value and seconds of Python per weight)."""
    from onnx import TensorProto, helper

    from .ort_fast_paths import pack_bytes_to_4bit
    return helper.make_tensor(name, TensorProto.INT4, list(q.shape),
                              bytes(pack_bytes_to_4bit(np.ascontiguousarray(q, np.int8).tobytes())), raw=True)


class _FloatWeights:
    """{MatMul node name: its float weight}, each read from the external data when asked for."""
    def __init__(self, tensors: dict, folder):
        self.tensors, self.folder = tensors, str(folder)

    def __contains__(self, node_name) -> bool:
        return node_name in self.tensors

    def __getitem__(self, node_name) -> np.ndarray:
        import onnx
        from onnx import numpy_helper
        t = onnx.TensorProto()
        t.CopyFrom(self.tensors[node_name])
        onnx.external_data_helper.load_external_data_for_tensor(t, self.folder)
        return numpy_helper.to_array(t)


def _save(model, qdq_path) -> None:
    """Save `model` (read without its external data, some initializers replaced) over `qdq_path`:
    the tensors still external are copied from their data files, tensors held in memory above
    1 KB are written out, each once, into one new data file that then replaces the old ones."""
    import onnx

    data = qdq_path.with_name(qdq_path.name + ".data")
    tmp = data.with_name(data.name + ".tmp")
    sources: dict[str, object] = {}
    try:
        with open(tmp, "wb") as out:
            for init in [*model.graph.initializer, *node_tensors(model.graph.node)]:
                e = external_entry(init)
                if e is not None:
                    src = sources.get(e["location"]) or sources.setdefault(e["location"],
                                                                           open(qdq_path.parent / e["location"], "rb"))
                    src.seek(int(e.get("offset", 0)))
                    blob = src.read(int(e["length"]))
                elif init.HasField("raw_data") and len(init.raw_data) > 1024:
                    blob = init.raw_data
                    init.ClearField("raw_data")
                else:
                    continue
                offset = out.tell()
                out.write(blob)
                set_external(init, data.name, offset, len(blob))
    finally:
        for f in sources.values():
            f.close()
    for location in sources:
        (qdq_path.parent / location).unlink(missing_ok=True)
    os.replace(tmp, data)
    onnx.save_model(model, str(qdq_path))
