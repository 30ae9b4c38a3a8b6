"""The CPU runtime of `generate`: an ExecuTorch XNNPACK program built from a GGUF / HF folder, with our own
kernels (attention, 4-bit linear)."""

# here, not in export.py, so that the CLI checks --quant without importing the exporter (torch and all)
QUANT_MODES = ("8da4w", "8da8w", "fp32")
