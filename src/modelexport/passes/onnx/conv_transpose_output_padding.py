"""`conv-transpose-output-padding-as-pads`: a ConvTranspose's output_padding goes into its end pads.

A grouped ConvTranspose with output_padding computes garbage on the HTP at fp16: DeepFilterNet's
ERB decoder (Hush's dfnet16k: depthwise [1, 3] kernels, stride (1, 2), pads 1, output_padding 1)
gave 1.9 dB where its fp16 graph on the CPU holds; one such layer alone −2.8 dB, the same layer
without output_padding or without groups 68.9 dB. The output's size is
(in − 1) · stride + dilation · (k − 1) + 1 − pad_begin − pad_end + output_padding, so where
pad_end ≥ output_padding the same output comes from pad_end − output_padding and no
output_padding: the values the padding would add are the ones the end pad would have cut.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair


def _ints(node, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def _set_ints(node, name: str, values: list[int]) -> None:
    from onnx import helper
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(name, values)])


@onnx_repair("conv-transpose-output-padding-as-pads", 77, "a ConvTranspose's output_padding goes into its end pads "
             "where they are at least as wide (the HTP computes a grouped one with output_padding wrongly at fp16)")
def output_padding_as_pads(model, ctx: RepairContext) -> dict | None:
    done = []
    for node in model.graph.node:
        if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
            continue
        extra, pads = _ints(node, "output_padding"), _ints(node, "pads")
        if not extra or not any(extra) or pads is None or _ints(node, "output_shape") is not None:
            continue
        rank = len(extra)
        if len(pads) != 2 * rank or any(pads[rank + i] < extra[i] for i in range(rank)):
            continue
        _set_ints(node, "pads", pads[:rank] + [pads[rank + i] - extra[i] for i in range(rank)])
        _set_ints(node, "output_padding", [0] * rank)
        done.append(node.name or node.output[0])
    return {"nodes": done[:20], "count": len(done)} if done else None
