"""Real models and data that ship inside installed packages (nothing is downloaded)."""
