"""PyTorch inputs: an nn.Module object, `model.py:factory`, or a saved ExportedProgram `.pt2`.

A factory returns the module and its example inputs as `(module, example_inputs)`, or a module
with an `example_inputs()` method. Module paths (`layers.3.mlp.act`) survive torch.export in
each node's `nn_module_stack`, which the audit reads.
"""
from __future__ import annotations

import copy
import hashlib
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..core.errors import InputError
from .torch_nested import flatten_module_inputs
from .user_code import call_user, user_function


@dataclass
class LoadedModule:
    module: Any                        # torch.nn.Module in eval mode
    example_inputs: tuple
    source: str                        # what the user named
    sha256: str | None = None          # of the source file, when there is one
    exported: Any = None               # an ExportedProgram when the source was a .pt2
    description: str = ""
    extra: dict = field(default_factory=dict)
    input_names: list[str] | None = None   # of the flattened leaves when the inputs were nested


def flatten_loaded(loaded: LoadedModule) -> LoadedModule:
    """Nested example inputs (`(x, (h0, c0))`) → a module taking the named flat leaves."""
    module, flat, names = flatten_module_inputs(loaded.module, loaded.example_inputs)
    if names is not None:
        loaded.module, loaded.example_inputs, loaded.input_names = module, flat, names
        loaded.exported = None          # re-exported from the flat module
        loaded.extra["flattened_inputs"] = names
    return loaded


def without_parametrizations(loaded: LoadedModule) -> LoadedModule:
    """Weights computed in forward by a parametrization (`weight_norm`, as Wav2Vec2's positional
    conv has) break ExecuTorch's QNN passes before any node is placed. They are constants at
    inference: a copy of the module gets their values as plain parameters. Not through
    `remove_parametrizations`: it deletes the property from the parametrized class, which the copy
    shares with the user's module (measured: the user's module then had no `weight`)."""
    import torch
    from torch.nn.utils import parametrize
    owners = [name for name, m in loaded.module.named_modules() if parametrize.is_parametrized(m)]
    if not owners:
        return loaded
    module = copy.deepcopy(loaded.module)
    baked = []
    for name in owners:
        m = module.get_submodule(name)
        with torch.no_grad():
            values = {t: getattr(m, t).detach().clone() for t in m.parametrizations.keys()}
        del m._modules["parametrizations"]
        m.__class__ = m.__class__.__bases__[0]        # the module's own class again, for this instance only
        for t, value in values.items():
            m.register_parameter(t, torch.nn.Parameter(value, requires_grad=False))
            baked.append(f"{name}.{t}" if name else t)
    loaded.module = module
    loaded.exported = None
    loaded.extra["baked_parametrizations"] = baked
    return loaded


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def from_module(module: Any, example_inputs: Any, source: str = "<nn.Module>") -> LoadedModule:
    import torch
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{source} is a {type(module).__name__}, not a torch.nn.Module",
                         "pass an nn.Module (or a factory returning one)")
    if example_inputs is None:
        maker = getattr(module, "example_inputs", None)
        if not callable(maker):
            raise InputError(f"no example inputs for {source}",
                             "return (module, example_inputs) from the factory, or give the module an example_inputs() method")
        example_inputs = maker()
    loaded = LoadedModule(module.eval(), _as_tuple(example_inputs), source, description=type(module).__name__)
    return flatten_loaded(without_parametrizations(loaded))


def load_factory(spec: str) -> LoadedModule:
    """`path/to/model.py:factory` → call factory() in a fresh module namespace."""
    factory, path = user_function(spec)
    func = spec.rpartition(":")[2]
    made = call_user(factory, f"{path.name}:{func}", path)
    inputs = None
    if isinstance(made, tuple) and len(made) == 2:
        made, inputs = made
    loaded = from_module(made, inputs, spec)
    loaded.sha256 = _sha256(path)
    return loaded


@contextmanager
def _logger_off(name: str) -> Iterator[None]:
    log = logging.getLogger(name)
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def _refuse_dynamic(ep: Any, path: Path) -> None:
    """QNN compiles one fixed shape: a program exported with a dynamic Dim would be compiled at its
    example shape without a word, so it is refused here, before any work."""
    dynamic = []
    for n in ep.graph.nodes:
        shape = getattr(n.meta.get("val"), "shape", None) if n.op == "placeholder" else None
        for i, d in enumerate(shape or ()):
            if not isinstance(d, int):
                dynamic.append(f"{n.name} dim {i} ({d})")
    if dynamic:
        raise InputError(f"{path} was exported with dynamic shapes ({', '.join(dynamic[:4])}); "
                         "QNN compiles one fixed shape per program",
                         "export it again without dynamic_shapes (torch.export.export(model, example_inputs)), "
                         "once per shape you need, and compile each")


def load_pt2(path: str | Path) -> LoadedModule:
    import torch
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p} does not exist", "check the path of the .pt2 file")
    try:
        with _logger_off("torch.export"):   # it logs the whole traceback before raising
            ep = torch.export.load(p)
    except Exception as e:  # torch raises many types for a corrupt archive
        raise InputError(f"{p} is not a readable torch.export archive: {type(e).__name__}: {str(e)[:200]}",
                         "save it with torch.export.save(exported_program, path)") from None
    args, kwargs = getattr(ep, "example_inputs", None) or ((), {})
    if not args:
        raise InputError(f"{p} carries no example inputs", "export with example inputs and save again")
    _refuse_dynamic(ep, p)
    return flatten_loaded(LoadedModule(ep.module(), tuple(args), str(p), _sha256(p), exported=ep,
                                       description="ExportedProgram"))
