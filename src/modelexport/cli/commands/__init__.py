"""One module per verb; each registers itself on the shared Typer app when imported."""
