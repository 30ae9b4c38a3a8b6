"""The built-in plugins: the modules that register frontends, backends, bundle inspectors and LLM
runtimes when they are imported, by the registry they fill.

This table and the formats' (`core.formats`) are the places that name modules by string. A registry
imports its group on first use, so a lower layer (the frontends' or inspectors' registry,
`modelexport.llm.load`) finds what a higher one registered (a backend's inspector, the simulator's
LLM runtime) without importing it, and a command loads only the groups it uses. The bundle formats'
compile and inspect modules come from their rows in `core.formats.FORMATS`; a new input kind adds
its module here.
"""
from __future__ import annotations

import importlib

from .formats import modules

PLUGINS: dict[str, tuple[str, ...]] = {
    "frontend": ("modelexport.frontends.onnx_model", "modelexport.frontends.torch_frontend",
                 "modelexport.frontends.gguf_file", "modelexport.frontends.hf_folder"),
    "backend": modules("compile"),
    # asked in this order (a reader registered with first=True goes before the others)
    "inspector": ("modelexport.inspection.bundle_inspector", "modelexport.frontends.gguf_inspect",
                  "modelexport.frontends.hf_inspect", *modules("inspect"), "modelexport.llm.cpu.inspect"),
    "LLM backend": ("modelexport.llm.run.openers", "modelexport.backends.llm_qnn.session",
                    "modelexport.backends.llm_qnn.genie_generate"),
}


def load_plugins(group: str) -> None:
    """Import every module of `group` (each registers itself; a second call costs nothing)."""
    for module in PLUGINS[group]:
        importlib.import_module(module)
