from __future__ import annotations

from pathlib import Path

from ..contract.bundle import is_bundle, open_bundle
from ..contract.deployment import deployment
from ..core.errors import ModelExportError, VerificationError
from ..core.vocab import Role
from . import inspector


@inspector("bundle", is_bundle)
def read_bundle(path: Path) -> dict:
    b = open_bundle(path, verify=False)
    problems = b.problems()
    info = {"manifest": b.manifest.model_dump(mode="json", exclude_none=True),
            "integrity": {"ok": not problems, "problems": problems},
            "deployment": deployment(b.manifest).to_dict()}
    genie = {str(f.path): _genie_verdict(b.file(f.path)) for f in b.manifest.files if f.role == Role.GENIE_CONFIG}
    if genie:
        info["genie_config_check"] = genie
    return info


def _genie_verdict(config: Path) -> dict:
    """What Genie's own config parser (libGenie.so, in a child) says of the file as it is now —
    a hand-edited config is judged by Genie, not by us."""
    from ..toolchain.genie import validate_genie_config
    try:
        return validate_genie_config(config)
    except VerificationError as e:
        return {"accepted": False, "message": e.problem}
    except ModelExportError as e:    # no libGenie here: say so, judge nothing
        return {"accepted": None, "message": e.problem}
