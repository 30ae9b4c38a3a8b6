"""Start-up chatter of libraries we import, not meant for our users: torchao's optional CUDA
kernels that cannot load on this CPU host, torch's pytree deprecation notes (MODELEXPORT_DEBUG=1
shows them again). Quieted in every process that imports them: the CLI's, and a sweep's workers.
Its own module, without imports, because the CLI calls it on every start."""
from __future__ import annotations

import logging
import os

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_library_loggers() -> None:
    if os.environ.get("MODELEXPORT_DEBUG"):
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
