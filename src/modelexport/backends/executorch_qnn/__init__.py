"""ExecuTorch with the QNN delegate: nn.Module / .pt2 → .pte; lower, partition, run, profile and inspect it."""
