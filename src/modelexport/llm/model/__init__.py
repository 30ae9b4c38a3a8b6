"""The LLM as a model: the fixed-shape static decoder, its input modes, RoPE positions, residual scale, parts and vision part."""
