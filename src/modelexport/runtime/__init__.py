"""Run a bundle's compiled graphs on this host (the HTP simulator) and verify them against the float model."""
