"""Child process of `audit`: open a session on the real QNN EP with verbose logging.

Run as `python -m modelexport.backends.ort_qnn.audit_probe MODEL OPTIONS_JSON`. ONNX Runtime's C++ logger
writes to this process's stderr, which the parent captures to a file; stdout carries one JSON
object: the node placement the session reports (or the error). A crash in the native library
ends only this process. With `"locate": LOG_FILE` in the options it instead bisects the model for
the node that makes QNN refuse the graph (audit_locate.bisect), reading its own log as it goes.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from ...toolchain.ort_qnn import SessionPlan, create_session, node_assignment
from .audit_locate import bisect


def main(argv: list[str]) -> int:
    model, opts = argv[0], json.loads(argv[1])
    plan = SessionPlan(provider_options=opts.get("provider_options", {}), config_entries=opts.get("config_entries", {}),
                       log_severity=0)
    if opts.get("locate"):
        def refuses(path: str) -> bool:
            try:
                create_session(path, plan)
                return False
            except Exception as e:  # only a refusal by the EP counts; a malformed prefix is not the culprit
                return "EP_FAIL" in str(e) or "EPFail" in type(e).__name__
        try:
            found = bisect(model, refuses, opts["locate"])
            result = {"ok": True, "blocker": asdict(found) if found else None}
        except Exception as e:
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    else:
        try:
            sess = create_session(model, plan)
            placement = node_assignment(sess)
            result = {"ok": True, "placement": {ep: [list(x) for x in nodes] for ep, nodes in placement.items()}}
        except Exception as e:  # reported to the parent, which turns it into a clear error
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
