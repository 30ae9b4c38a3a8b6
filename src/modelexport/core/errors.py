"""The few exception classes a user can see.

Every failure that is the user's to fix (a wrong target, a corrupt file, a missing toolchain)
is a `ModelExportError` carrying what is wrong and how to fix it. The CLI prints those two
lines and exits non-zero without a traceback; anything else is a bug and keeps its traceback.

Exit codes: 2 a mistake in the input (and the default), 3 `--strict` found a CPU fallback,
4 an artifact's files do not match its manifest, 5 verify's numbers are below the threshold,
6 not supported (yet), 7 `compile --strict-numerics` found its own numerics check below the pass
mark, 130 interrupted (143 by SIGTERM).

Raised in a worker process, one comes back whole: toolchain/worker_pool.py.

A fix that is "set this option to this value" carries it as a `Setting`, and `fix` holds
`{setting}` where it goes: each caller has it written in its own words (`in_words_of`, with the
spellings of core/spellings.py): the CLI's `--input-shape x=1,3,224,224`, the Python API's
`input_shapes={"x": [1, 3, 224, 224]}`, a sweep matrix's `input_shapes: {x: [1, 3, 224, 224]}`.
Until a caller asks, it reads as the CLI's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .spellings import spell


@dataclass(frozen=True)
class Setting:
    """An option and the value a fix gives it: `option` by its Python name (compile's keyword),
    `value` as the Python API takes it; a str inside it (e.g. "N") stands for a number the user picks."""
    option: str
    value: Any


class ModelExportError(Exception):
    """A problem the user can fix: `problem` says what is wrong, `fix` what to do."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None, setting: Setting | None = None):
        super().__init__(problem)
        self.problem = problem
        self.setting = setting
        self._fix_words = fix if setting is not None else None
        self.fix = fix
        if setting is not None:
            self.in_words_of("cli")

    def reworded(self, problem: str) -> ModelExportError:
        """The same kind of error and fix (its setting too) with another problem text."""
        return type(self)(problem, self._fix_words if self.setting is not None else self.fix, self.setting)

    def in_words_of(self, caller: str) -> ModelExportError:
        """The fix written as `caller` (cli | api | sweep) writes its setting; returns self."""
        if self.setting is not None and self._fix_words is not None:
            self.fix = self._fix_words.replace("{setting}", spell(caller, self.setting))
        return self

    def __str__(self) -> str:
        return self.problem if not self.fix else f"{self.problem}\n  fix: {self.fix}"


class InputError(ModelExportError):
    """A path, file or argument the user gave is missing, unreadable or malformed."""


class TargetError(ModelExportError):
    """An unknown SoC name, or a feature the chosen SoC cannot run."""


class OutputExistsError(ModelExportError):
    """The output already exists and --force was not given."""


class ToolchainError(ModelExportError):
    """QAIRT, ONNX Runtime's QNN EP, ExecuTorch or gcc is missing or does not fit."""


class CalibrationError(InputError):
    """Calibration data is missing or does not match the model's inputs."""


class StrictFallbackError(ModelExportError):
    """`--strict` and some nodes fall back to the CPU."""

    exit_code = 3


class UnsupportedError(ModelExportError):
    """Something modelexport does not do (yet): an op, an architecture, a format, a feature of this host."""

    exit_code = 6


class IntegrityError(ModelExportError):
    """An artifact's files do not match its manifest (tampered, truncated or missing)."""

    exit_code = 4


class VerificationError(ModelExportError):
    """Compiled outputs differ from the float model by more than the threshold."""

    exit_code = 5


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM, raised by the CLI's handler (cli/interrupts.py) and by a worker's. A
    BaseException, like KeyboardInterrupt, so no `except Exception` turns it into a user error; not a
    KeyboardInterrupt, which typer swallows into a silent exit 130. Exit 128 + the signal's number,
    as a shell reports it: 130 for Ctrl-C, 143 for SIGTERM."""

    exit_code = 130

    def __init__(self, signum: int = 2):
        super().__init__(signum)
        self.exit_code = 128 + signum


class StrictNumericsError(ModelExportError):
    """`compile --strict-numerics` and compile's own numerics check is below the pass mark."""

    exit_code = 7


def clip(text: str, limit: int = 800) -> str:
    """`text` whole when it fits, else cut after the last full sentence within `limit` (at a word,
    marked with …, when no sentence ends in its second half): a message never stops mid-word."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[:limit]
    end = max(head.rfind(p) for p in (". ", "! ", "? ", "; ", " | "))
    if end >= limit // 2:
        return head[:end + 1] + " …"
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head) + " …"


class ResourceError(ModelExportError):
    """The machine has too little memory or disk for the job (refused before the work starts)."""
