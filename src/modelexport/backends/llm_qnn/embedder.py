"""The embedder part's check on the simulator (the part itself is built by llm/export/embedder.py)."""
from __future__ import annotations

import numpy as np

from ...core.numerics import compare
from ...toolchain.htp_options import run_provider_options
from ...toolchain.ort_qnn import SessionPlan, create_session


def embedder_check(job: dict) -> dict:
    """Worker (a child: it loads the simulator): the compiled embedder twin vs the float lookup (the
    float decoder's, saved at export) on real tokens → SQNR (dB), max abs error."""
    data = np.load(job["check"])
    ids, ref = data["ids"], data["ref"]
    twin = create_session(job["epcontext"], SessionPlan(provider_options=run_provider_options(job["soc_model"], None)))
    got = twin.run(None, {"input_ids": ids})[0]
    c = compare(ref, got)
    return {"sqnr_db": round(float(c["sqnr_db"]), 2), "max_abs_error": float(np.abs(ref - got).max()),
            "tokens": int(ids.size)}
