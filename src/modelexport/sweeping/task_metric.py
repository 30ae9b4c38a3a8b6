"""`--max-drop D --eval-fn FILE.py:FUNCTION`: the user's task metric that a `--precision auto`
candidate must hold, measured on the simulator against its value on the float model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ..backends.ort_qnn.run import CompiledGraph, SimulatorSession
from ..core.errors import InputError
from ..frontends.user_code import call_user, user_function


@dataclass
class TaskMetric:
    """The user's metric(predict) and the most it may drop below float's value."""
    fn: Callable[[Callable], float]
    name: str
    max_drop: float
    float_value: float | None = None

    def value(self, predict: Callable) -> float:
        v = call_user(self.fn, self.name, Path(self.name.partition(":")[0]), predict)
        try:
            return float(v)
        except (TypeError, ValueError):
            raise InputError(f"{self.name} returned {type(v).__name__} {str(v)[:60]!r}, not a number",
                             "return one float from the metric (higher is better)") from None

    def score(self, c: Any, bundle) -> None:
        if self.float_value is None:
            import onnxruntime as ort
            pm = bundle.manifest.parts[0]
            ref = ort.InferenceSession(str(bundle.file(pm.files.float_model)), providers=["CPUExecutionProvider"])  # noqa: TID251 - the float reference
            names = [o.name for o in ref.get_outputs()]
            self.float_value = self.value(lambda feed: dict(zip(names, ref.run(names, feed))))
        g = bundle.manifest.graphs[0]
        sim = SimulatorSession(CompiledGraph(None, "", g.target, bundle.file(g.epcontext_model), None, ""))
        c.metric = self.value(lambda feed: sim.run(feed)[0])
        c.drop = self.float_value - c.metric
        c.passed = c.passed and c.drop <= self.max_drop


def task_metric(opts) -> TaskMetric | None:
    """--max-drop with --eval-fn (both or neither), as a TaskMetric."""
    if opts.max_drop is None and opts.eval_fn is None:
        return None
    if opts.max_drop is None or opts.eval_fn is None:
        raise InputError("--max-drop and --eval-fn go together: the drop is measured by the evaluation function",
                         "give both, e.g. --max-drop 0.01 --eval-fn eval.py:accuracy (accuracy(predict) -> float)")
    fn, name = opts.eval_fn, getattr(opts.eval_fn, "__name__", "the evaluation function")
    if isinstance(fn, (str, Path)):
        fn, path = user_function(str(fn), "eval.py:accuracy")
        name = f"{path}:{str(opts.eval_fn).rpartition(':')[2]}"
    elif not callable(fn):
        raise InputError(f"eval_fn is a {type(fn).__name__}, not a function", "pass metric(predict) -> float or 'FILE.py:FUNCTION'")
    return TaskMetric(fn, name, float(opts.max_drop))
