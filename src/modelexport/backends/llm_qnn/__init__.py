"""LLM export to the NPU: static decoder variants → ONNX → 16a4w QDQ (real-text calibration) →
weight-shared QNN context binaries + unshared host twins + Genie config (`backend`)."""
