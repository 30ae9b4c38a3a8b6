"""ExecuTorch's C++ runtime (its pybindings extension), without ExecuTorch's export stack.

`executorch.extension.pybindings.portable_lib` is a thin wrapper over the `_C` extension, but its
first line imports `executorch.exir._warnings`, and `executorch/exir/__init__` pulls torch.export,
dynamo and inductor: ~9 CPU-s of every `modelexport generate` on a built program, for one warning
class. Besides that warning the wrapper only imports torch first (the extension links libtorch),
which is done here too; the module is the same object the wrapper re-exports."""
from __future__ import annotations

import importlib
from types import ModuleType


def runtime() -> ModuleType:
    """The `_C` pybindings module (`_load_for_executorch`, the thread pool, ...)."""
    import torch  # noqa: F401  (the extension needs libtorch loaded, as portable_lib does first)
    return importlib.import_module("executorch.extension.pybindings._C")
