from __future__ import annotations

from pathlib import Path

from ..contract.bundle import is_bundle, open_bundle
from ..contract.deployment import deployment
from ..core.errors import ModelExportError, VerificationError
from ..core.vocab import Role
from ..toolchain.genie import validate_genie_config
from . import inspector


@inspector("bundle", is_bundle)
def read_bundle(path: Path) -> dict:
    b = open_bundle(path, verify=False)
    problems = b.problems()
    info = {"manifest": b.manifest.model_dump(mode="json", exclude_none=True),
            "integrity": {"ok": not problems, "problems": problems},
            "deployment": deployment(b.manifest).to_dict()}
    # a VLM's pipeline config is not a dialog config: what libGenie said when the compile built it
    pipelines = {g.pipeline.file: g.pipeline for g in (b.manifest.llm.genie.values() if b.manifest.llm else [])
                 if g.pipeline is not None}
    genie = {str(f.path): _pipeline_verdict(pipelines[f.path]) if f.path in pipelines else _genie_verdict(b.file(f.path))
             for f in b.manifest.files if f.role == Role.GENIE_CONFIG}
    if genie:
        info["genie_config_check"] = genie
    return info


def _genie_verdict(config: Path) -> dict:
    """What Genie's own config parser (libGenie.so, in a child) says of the file as it is now —
    a hand-edited config is judged by Genie, not by us."""
    try:
        return validate_genie_config(config)
    except VerificationError as e:
        return {"accepted": False, "message": e.problem}
    except ModelExportError as e:    # no libGenie here: say so, judge nothing
        return {"accepted": None, "message": e.problem}


def _pipeline_verdict(check) -> dict:
    """A pipeline config's record (manifest llm.genie[target].pipeline): built with libGenie at compile time."""
    image = "created" if check.image_encoder_created else f"refused ({check.image_encoder_note})"
    return {"pipeline": True, "accepted": check.text_path_created,
            "message": f"pipeline built by libGenie at compile time on the {check.checked_on or 'host'}: text path "
                       f"{'created' if check.text_path_created else 'refused'}, image-encoder node {image}"}
