"""The CPU runtime of `generate`: an ExecuTorch XNNPACK program built from a GGUF / HF folder, with our own
kernels (attention, 4-bit linear)."""
