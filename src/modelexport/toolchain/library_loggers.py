"""Start-up chatter of libraries we import, not meant for our users: torchao's optional CUDA
kernels that cannot load on this CPU host, torch's pytree deprecation notes, transformers' note on
the `mrope_section` a Qwen2-VL text model keeps in its Qwen2 config on purpose, onnxscript's
constant folder saying it leaves a multi-output node (a Split) unfolded (ONNX Runtime computes it
when the graph runs: nothing is lost but a fold), and ExecuTorch's and
torch's FutureWarnings about their own calls while a CPU program is built (MODELEXPORT_DEBUG=1 shows
them again). Quieted in every process that imports them: the CLI's, and a sweep's workers.
Its own module, without imports, because the CLI calls it on every start."""
from __future__ import annotations

import logging
import os
import warnings

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
# (logger, text of the one message dropped): the frontends write these fields knowingly
DROPPED_MESSAGES = (("transformers.modeling_rope_utils", "Unrecognized keys in `rope_parameters`"),
                    ("onnxscript.optimizer._constant_folding", "Skipping constant folding for op"))


# Python warnings libraries raise inside a build the user asked for and cannot act on (FutureWarnings
# of ExecuTorch's and torch's own calls; ExecuTorch's note on the KV cache buffers it is told to treat as
# mutable): (category, message regex, module regex) for warnings.filterwarnings
DROPPED_WARNINGS = (
    (FutureWarning, "", r"(executorch|torch)(\..*)?$"),
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", ""),
    (UserWarning, "Mutation on a buffer in the model is detected", r"executorch\..*"),
)


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_library_loggers() -> None:
    if os.environ.get("MODELEXPORT_DEBUG"):
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message, module in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, text in DROPPED_MESSAGES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.text == text for f in logger.filters):
            logger.addFilter(_DropMessage(text))
