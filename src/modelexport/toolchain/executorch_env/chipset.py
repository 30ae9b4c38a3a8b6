"""ExecuTorch's name for a SoC (its `QcomChipset` enum): what its QNN quantizer and compile specs take."""
from __future__ import annotations

from ...core.errors import TargetError
from ...core.targets import SoC


def chipset(soc: SoC):
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    try:
        return QcomChipset[soc.name]
    except KeyError:
        known = ", ".join(c.name for c in QcomChipset if c.name != "UNKNOWN_SM")
        raise TargetError(f"executorch's QNN backend has no chipset entry for {soc.name}",
                          f"choose one it knows: {known}") from None
