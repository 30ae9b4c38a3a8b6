"""LLM → one ExecuTorch `.pte` per SoC: decode (ar1) and prefill (arN) methods sharing one copy of the weights."""
