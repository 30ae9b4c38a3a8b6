"""`make demo`: the main job on the bundled real model.

Stage 1 (foundation): check the toolchain and list the targets. Later stages compile the
bundled real models; see README.
"""
from __future__ import annotations

import sys

from modelexport.cli.main import main


def step(*argv: str) -> None:
    print(f"\n$ modelexport {' '.join(argv)}", flush=True)
    rc = main(list(argv))
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    step("doctor")
    step("targets")
