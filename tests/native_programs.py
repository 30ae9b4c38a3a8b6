"""A module with our custom ops → a portable ExecuTorch program (no delegate) run by ExecuTorch's
runtime with our kernels loaded: how the kernel tests run the C++ side."""
from __future__ import annotations

from pathlib import Path

import torch


def load_portable_program(module: torch.nn.Module, example_args: tuple, dynamic_shapes, path: Path):
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.extension.pybindings import portable_lib as pl

    from modelexport.llm.cpu.kernels import load_native_kernels

    ep = torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes, strict=False)
    prog = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    path.write_bytes(prog.buffer)
    load_native_kernels()
    return pl._load_for_executorch(str(path))
