"""Running an LLM: the generation loop, sampling, tokenizers, text, the runtimes' openers."""
