"""What ONNX Runtime's QNN EP says in its verbose log (`log_severity_level=0`), read back.

Two questions: why the EP left a node to the CPU (`parse_ep_log`: its `Validation FAILED ...
Node name: X ... REASON : ...` blocks and `backendValidateOpConfig() failed for node X` lines), and
which node it blames when QNN refuses a whole graph (`blockers_from_log`: `Failed to create
tensor for node: X ... error code: 7004`, or the node it was adding when the first error came).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_FAILED = re.compile(r"Validation FAILED for \d+ nodes in \w+ \(([^)]*)\)")
_NODE = re.compile(r"Operator type: (\S+) Node name: (.*?) Node index: (\d+)")
_REASON = re.compile(r"REASON\s*:\s*(.*)")
_VALIDATE = re.compile(r"backendValidateOpConfig\(\) failed for node `([^`]*)` of type `([^`]*)` with error code (\d+)")


def parse_ep_log(text: str) -> dict[str, list[str]]:
    """{node name: [reasons]} from the EP's verbose log."""
    reasons: dict[str, list[str]] = {}

    def add(name: str, why: str) -> None:
        why = re.sub(r"\.(?=\S)", ". ", why.strip())
        if why and why not in reasons.setdefault(name, []):
            reasons[name].append(why)

    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if _FAILED.search(lines[i]):
            names, j = [], i + 1
            while j < len(lines) and (lines[j].startswith(("\t", " ")) or not lines[j].strip()):
                if m := _NODE.search(lines[j]):
                    names.append(m.group(2))
                elif m := _REASON.search(lines[j]):
                    for n in names:
                        add(n, m.group(1))
                if not lines[j].strip() and names:
                    break
                j += 1
            i = j
            continue
        if m := _VALIDATE.search(lines[i]):
            add(m.group(1), f"the HTP validator rejected it: backendValidateOpConfig() error {m.group(3)}"
                            + (" (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE)" if m.group(3) == "3110" else ""))
        i += 1
    return reasons


# The EP's words for a graph QNN refused as a whole (not a node left to the CPU).
GRAPH_REFUSED = re.compile(r"Failed to (compose|finalize) Qnn graph|QNN (graph )?(compose|finalize)|graphFinalize", re.I)
_CREATE_TENSOR = re.compile(r"Failed to create tensor for node: (\S+) tensor_name: (\S+) error code: (\d+)")
_ADD_NODE = re.compile(r"Failed to add node (\S+)|graphAddNode.* node[: ]+`?([\w./:-]+)", re.I)
_BUILDING = re.compile(r"Onnx node name: \[([^\]]+)\] onnx node type: \[([^\]]+)\]")
_ERROR = re.compile(r"\[E:onnxruntime")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# QnnTensor.h: QNN_MIN_ERROR_TENSOR is 7000.
QNN_ERRORS = {7001: "invalid graph handle", 7002: "tensor not registered", 7004: "invalid tensor parameter",
              7005: "unsupported tensor parameter", 6000: "graph error", 6001: "unsupported graph feature"}


@dataclass
class Blocker:
    """One node QNN refused while building the graph, with what the log and the graph say about it."""
    node: str
    how: str                          # "log" (the EP named it) or "bisect" (shortest refused prefix)
    error: str = ""                   # the EP's error line(s)
    tensor: str | None = None
    code: int | None = None
    details: dict = field(default_factory=dict)


def error_lines(text: str) -> list[str]:
    """The EP's error lines (`[E:onnxruntime ...] message`), as messages."""
    return [_ANSI.sub("", l).split("] ", 1)[-1].strip() for l in text.splitlines() if _ERROR.search(l)]


# The EP took a node before ONNX Runtime moved it to NHWC and refused it after: the session fails as a
# whole ("...was inserted using the NHWC format as requested by QNNExecutionProvider, but was not
# selected by that EP"). The layout pass appends `_token_N` to the node's own name.
_LAYOUT_REFUSED = re.compile(r"Node '(.+?)(?:_token_\d+)?' OpType:(\w+) with domain:com\.ms\.internal\.nhwc "
                             r"was inserted using the NHWC format")


def layout_refusal(error: str) -> tuple[str, str] | None:
    """(node name, op type) when the EP refused a node after the NHWC layout pass, else None."""
    m = _LAYOUT_REFUSED.search(error or "")
    return (m[1], m[2]) if m else None


def layout_refusal_fix(error: str) -> str | None:
    """The fix for a node the EP refused after the NHWC layout pass: keep that node in float."""
    if (hit := layout_refusal(error)) is None:
        return None
    node, op = hit
    return (f"the QNN EP refuses {op} node {node!r} at this precision once it is moved to NHWC: keep it in "
            f"float inside the quantized graph with --override '^{re.escape(node)}$=fp16', "
            "or compile at --precision fp16")


def is_graph_refusal(error: str) -> bool:
    return bool(GRAPH_REFUSED.search(error or ""))


def blockers_from_log(text: str) -> list[Blocker]:
    """The nodes the EP's log blames for a refused graph (empty when it names none)."""
    lines = [_ANSI.sub("", l) for l in text.splitlines()]
    found: dict[str, Blocker] = {}
    first_error = None
    for i, line in enumerate(lines):
        if not _ERROR.search(line):
            continue
        first_error = i if first_error is None else first_error
        if m := _CREATE_TENSOR.search(line):
            found.setdefault(m[1], Blocker(m[1], "log", line.split("] ", 1)[-1].strip(), m[2], int(m[3])))
        elif m := _ADD_NODE.search(line):
            name = m[1] or m[2]
            found.setdefault(name, Blocker(name, "log", line.split("] ", 1)[-1].strip()))
    if not found and first_error is not None:
        # No name in the error: the node the builder was adding when the first error came.
        for line in reversed(lines[:first_error]):
            if m := _BUILDING.search(line):
                err = lines[first_error].split("] ", 1)[-1].strip()
                found[m[1]] = Blocker(m[1], "log", err)
                break
    return list(found.values())
