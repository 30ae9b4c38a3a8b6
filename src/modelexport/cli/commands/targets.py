from __future__ import annotations

import typer
from rich.table import Table

from ...core.targets import FEATURE_FLOORS, all_targets, get_target
from ..app import app, console, emit_json


@app.command()
def targets(
    name: str = typer.Argument(None, help="Show one target (SM8650, sm8650, 8gen3, snapdragon-8-gen-3 ...)."),
    json_out: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """List the Snapdragon SoCs modelexport can compile for, with HTP arch, soc_model id, VTCM,
    DRAM bandwidth and feature floors (fp16, block-wise 4-bit, weight sharing)."""
    socs = [get_target(name)] if name else list(all_targets())
    if json_out:
        emit_json({"feature_floors": {k: f"V{v}" for k, v in FEATURE_FLOORS.items()},
                   "targets": [s.to_dict() for s in socs]})
        return
    table = Table(header_style="bold")
    for col in ("target", "name", "HTP", "soc_model", "VTCM", "DRAM GB/s", *FEATURE_FLOORS):
        table.add_column(col)
    for s in socs:
        table.add_row(s.name, s.marketing_name, f"V{s.htp_arch}", str(s.soc_model), f"{s.vtcm_mb} MB",
                      f"{s.dram_gbps:g}" if s.dram_gbps else "?",
                      *("[green]yes[/]" if s.supports(f) else "[red]no[/]" for f in FEATURE_FLOORS))
    console.print(table)
    console.print("Feature floors: " + ", ".join(f"{k} from V{v}" for k, v in FEATURE_FLOORS.items()))
