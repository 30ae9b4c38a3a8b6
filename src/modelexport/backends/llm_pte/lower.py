"""Lower the quantized decode and prefill graphs into one `.pte` with the QNN delegate.

ExecuTorch's `to_edge_transform_and_lower_to_qnn` with one graph per method (ExecuTorch's
Qualcomm LLM flow names them `kv_forward` and `prefill_forward`) and one compile spec each: with
weight sharing the QNN backend builds one context holding both graphs over one copy of the
weights (V73+). The host twin is the same program compiled without sharing: the x86 simulator
cannot load a shared binary. 4-bit block weights need linear layers as conv2d (QNN refuses
block-quantized FullyConnected: "could not create op").
"""
from __future__ import annotations

from typing import Any

from ...core.errors import VerificationError
from ...core.targets import SoC
from ..executorch_qnn.inspect import read_pte
from ...toolchain.native_io import capture_native_output
from ..executorch_qnn.lower import SEGMENT_ALIGNMENT, lowering_error
from ..executorch_qnn.specs import compile_specs


def lower_methods(graphs: dict[str, Any], inputs: dict[str, tuple], soc: SoC, weight_sharing: bool,
                  constants: dict[str, Any], block_wise: bool) -> bytes:
    """{method: quantized GraphModule} → the .pte's bytes."""
    from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn
    from executorch.exir import ExecutorchBackendConfig
    specs = compile_specs(soc, use_fp16=False, weight_sharing=weight_sharing)
    try:
        with capture_native_output() as log:
            edge = to_edge_transform_and_lower_to_qnn(graphs, inputs, {m: specs for m in graphs},
                                                      constant_methods=constants, convert_linear_to_conv2d=block_wise)
            program = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True,
                                                                 segment_alignment=SEGMENT_ALIGNMENT))
    except Exception as e:
        e.native_log = log  # type: ignore[attr-defined]
        raise lowering_error(e) from None
    return program.buffer


def read_program(data: bytes, methods: list[str]) -> dict:
    """The program read back with ExecuTorch's own schema: every decoder method calls a QnnBackend
    delegate and no CPU kernel, all of them one context binary holding every method's graph."""
    info = read_pte(data)
    by_name = {m["name"]: m for m in info["methods"]}
    for name in methods:
        m = by_name.get(name)
        if m is None or m["delegate_calls"].get("QnnBackend", 0) < 1:
            raise VerificationError(f"the .pte's method {name} {'is missing' if m is None else 'calls no QnnBackend delegate'}",
                                    "report this: the lowering lost a method")
        if m["kernel_calls"]:
            raise VerificationError(f"the .pte's method {name} runs ops on the CPU: {sorted(m['kernel_calls'])}",
                                    "report this: every op of the decoder should be on the HTP")
    binaries = {e["segment"]: e["qnn"]["context_binary"] for e in info["delegates"] if e.get("qnn")}
    if len(binaries) != 1:
        raise VerificationError(f"the .pte holds {len(binaries)} QNN context binaries, expected one shared by its methods",
                                "report this: the methods were compiled into separate contexts")
    binary = next(iter(binaries.values()))
    graphs = {g["name"]: (g.get("htp") or {}) for g in binary["graphs"]}
    if set(graphs) != set(methods):
        raise VerificationError(f"the .pte's context binary holds graphs {sorted(graphs)}, expected {sorted(methods)}",
                                "report this: a method's graph is missing from the binary")
    return {"size": info["size"], "binary": binary, "graphs": graphs,
            "binary_bytes": next(e["size"] for e in info["delegates"] if e.get("qnn")),
            "methods": [m["name"] for m in info["methods"]]}
