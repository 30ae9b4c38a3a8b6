"""Library chatter the CLI quiets: only the messages named, and only their own loggers."""
from __future__ import annotations

import io
import logging

from modelexport.toolchain.library_loggers import quiet_library_loggers

ROPE_LOGGER = "transformers.modeling_rope_utils"


def _rope_warnings(rope_parameters: dict) -> str:
    from transformers import AutoConfig
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger(ROPE_LOGGER)
    logger.addHandler(handler)
    try:
        AutoConfig.for_model("qwen2", rope_parameters=rope_parameters)
    finally:
        logger.removeHandler(handler)
    return buf.getvalue()


def test_the_mrope_section_note_is_dropped_and_other_rope_warnings_are_not(monkeypatch):
    monkeypatch.delenv("MODELEXPORT_DEBUG", raising=False)
    mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    logger = logging.getLogger(ROPE_LOGGER)
    saved = list(logger.filters)
    for f in saved:
        logger.removeFilter(f)
    try:
        assert "mrope_section" in _rope_warnings(mrope)      # transformers says it unless quieted
        quiet_library_loggers()
        quiet_library_loggers()                               # twice: one filter, not two
        assert len(logger.filters) == 1
        assert _rope_warnings(mrope) == ""
        # a different warning of the same logger still reaches the user
        assert "partial_rotary_factor" in _rope_warnings({"rope_type": "proportional", "rope_theta": 10000.0})
    finally:
        for f in list(logger.filters):
            logger.removeFilter(f)
        for f in saved:
            logger.addFilter(f)
