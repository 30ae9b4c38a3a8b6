"""The LLM recipe `backends/llm_qnn` lowers and writes, as typed stages:
plan → weights → calibrate → graphs (`graphs.QDQ_STAGES`, the order as data)."""
