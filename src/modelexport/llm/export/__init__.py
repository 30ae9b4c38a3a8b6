"""The LLM recipe both LLM formats share (`backends/llm_qnn`, `backends/llm_pte`), as typed stages:
plan → weights → calibrate → graphs (`graphs.QDQ_STAGES`, the order as data)."""
