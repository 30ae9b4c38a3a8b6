"""A recipe's stages as data: each a name, a function and the earlier stages whose hand-offs it
takes (ExecuTorch's qnn_pass_manager keeps its pass order as a list the same way). The order is
read, checked and printed from the list; nothing else decides it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[..., Any]            # run(job, *the hand-offs of `needs`, in that order)
    needs: tuple[str, ...] = ()


def check_order(stages: tuple[Stage, ...]) -> None:
    """Each stage takes only what a stage before it handed over."""
    seen: set[str] = set()
    for s in stages:
        missing = [n for n in s.needs if n not in seen]
        if missing or s.name in seen:
            raise ValueError(f"stage {s.name!r}: {'needs ' + ', '.join(missing) if missing else 'named twice'}")
        seen.add(s.name)


def run_stages(stages: tuple[Stage, ...], job: Any) -> dict[str, Any]:
    """{stage name: its hand-off}, the stages run in their order."""
    out: dict[str, Any] = {}
    for s in stages:
        out[s.name] = s.run(job, *(out[n] for n in s.needs))
    return out
