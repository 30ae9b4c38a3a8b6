"""Read the CSV the ONNX Runtime QNN EP writes with `profiling_file_path`.

Header (QAIRT 2.51 / onnxruntime-qnn 2.7.0):
    Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier
ROOT rows carry per-run totals ("QNN (execute) time" US, "Accelerator (execute) time" US, at
`detailed` "Accelerator (execute) time (cycles)"); SUB-EVENT rows (detailed only) carry one QNN node
each in CYCLES, identified as `<node name>[_token_N]:OpId_M (cycles)`. The EP writes all ROOT rows
first and then all SUB-EVENT rows, one block of the same length per execute.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

EXECUTE_US = "QNN (execute) time"
ACCEL_US = "Accelerator (execute) time"
ACCEL_CYCLES = "Accelerator (execute) time (cycles)"
_OP = re.compile(r"^(?P<name>.*?)(?:_token_\d+)?:OpId_(?P<op>\d+) \(cycles\)$")
_IO = re.compile(r"^(?P<name>Input|Output) OpId_(?P<op>\d+) \(cycles\)$")


@dataclass
class QnnNodeEvent:
    name: str            # the ONNX node name the QNN node came from (or a QNN-made one: Transpose, Input)
    op_id: int
    cycles: int
    raw: str


@dataclass
class QnnRun:
    execute_us: float | None = None
    accel_us: float | None = None
    accel_cycles: int | None = None
    nodes: list[QnnNodeEvent] = field(default_factory=list)
    other: dict[str, float] = field(default_factory=dict)


@dataclass
class QnnProfile:
    columns: list[str]
    load: dict[str, float]
    runs: list[QnnRun]
    rows: int


def parse_node_identifier(ident: str) -> tuple[str, int] | None:
    m = _OP.match(ident) or _IO.match(ident)
    if not m:
        return None
    return m.group("name"), int(m.group("op"))


def read_qnn_csv(path: str | Path) -> QnnProfile:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        rows = [r for r in reader if len(r) >= 7]
    col = {c.strip(): i for i, c in enumerate(header)}
    ti, ui, li, ii, mi = (col.get("Time", 2), col.get("Unit of Measurement", 3), col.get("Event Level", 5),
                          col.get("Event Identifier", 6), col.get("Message", 1))
    load: dict[str, float] = {}
    runs: list[QnnRun] = []
    subs: list[QnnNodeEvent] = []
    cur: QnnRun | None = None
    for r in rows:
        ident, unit, level = r[ii].strip(), r[ui].strip(), r[li].strip()
        try:
            value = float(r[ti])
        except ValueError:
            continue
        if level == "SUB-EVENT":
            parsed = parse_node_identifier(ident)
            if parsed:
                subs.append(QnnNodeEvent(parsed[0], parsed[1], int(value), ident))
            continue
        if "load binary" in ident or r[mi].strip() == "INIT":
            load[f"{ident} ({unit})"] = value
            continue
        if cur is None:
            cur = QnnRun()
        if ident == ACCEL_CYCLES:
            cur.accel_cycles = int(value)
        elif ident == ACCEL_US:
            cur.accel_us = value
        elif ident == EXECUTE_US:
            cur.execute_us = value
            runs.append(cur)          # the EXECUTE row closes one run's block
            cur = None
        else:
            cur.other[f"{ident} ({unit})"] = value
    # SUB-EVENTs: one block per run, each starting with the graph's "Input" node
    starts = [i for i, e in enumerate(subs) if e.name == "Input"]
    if runs and subs:
        if len(starts) == len(runs):
            bounds = starts + [len(subs)]
            for k, run in enumerate(runs):
                run.nodes = subs[bounds[k]:bounds[k + 1]]
        elif len(subs) % len(runs) == 0:
            n = len(subs) // len(runs)
            for k, run in enumerate(runs):
                run.nodes = subs[k * n:(k + 1) * n]
        else:
            runs[-1].nodes = subs
    return QnnProfile([c.strip() for c in header], load, runs, len(rows))
