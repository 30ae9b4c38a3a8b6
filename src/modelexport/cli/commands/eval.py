"""`modelexport eval`: perplexity of an LLM at its stages (float, fake-quant, HTP simulator, CPU runtime) + SQNR."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ...core.arguments import at_least, one_of
from ...llm.cpu import QUANT_MODES
from ..app import app, console, emit_json, err_console


@app.command("eval")
def eval_cmd(
    model: Path = typer.Argument(..., help="An LLM bundle (float, fake-quant, htp-sim), a .gguf / Hugging Face folder (float, cpu) or an ExecuTorch LLM .pte (cpu)."),
    perplexity: Path | None = typer.Option(None, "--perplexity", help="Plain-text file to score (default: lee_background.cor)."),
    window: int = typer.Option(512, "--window", help="Tokens per window for float and fake-quant (at most the bundle's max_seq_len)."),
    max_tokens: int = typer.Option(2048, "--tokens", help="Score N tokens of the text (float, fake-quant): of the bundle's calibration text, those after what compile calibrated on."),
    sim_window: int = typer.Option(64, "--sim-window", help="Tokens per window on the HTP simulator (slow: keep it short)."),
    sim_tokens: int = typer.Option(64, "--sim-tokens", help="Tokens scored on the simulator (also the span the SQNR compares)."),
    stages: str | None = typer.Option(None, "--stages", help="Comma list of float, fake-quant, htp-sim, cpu (the CPU runtime's program that `generate` runs; default: float, fake-quant, htp-sim for a bundle, float for a model)."),
    quant: str = typer.Option("8da4w", "--quant", help="The cpu stage's program weights: 8da4w, 8da8w or fp32 (built once and cached, as by generate)."),
    max_seq_len: int | None = typer.Option(None, "--max-seq-len", help="GGUF / HF input: the context of the float decoder (default: --window)."),
    from_token: int | None = typer.Option(None, "--from-token", help="Score from this token of the text (default: of the bundle's calibration text, after the tokens compile read; of another text, 0)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Perplexity on a text at the float, fake-quant (QDQ on the CPU) and compiled (HTP simulator)
    stages, and the SQNR of the quantized logits against float on the span all stages ran. `--stages
    float,cpu` on a GGUF scores the CPU runtime's program (what `generate` runs) against float."""
    from ...runtime.evaluate import evaluate
    st = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    for flag, value in (("--window", window), ("--sim-window", sim_window), ("--tokens", max_tokens),
                        ("--sim-tokens", sim_tokens), ("--max-seq-len", max_seq_len)):
        at_least(flag, value, 2, "64")
    at_least("--from-token", from_token, 0, "0")
    one_of("--quant", quant, QUANT_MODES)

    def say(msg: str) -> None:
        if not json_out:
            err_console.print(f"[dim]{msg}[/]", highlight=False)
    res = evaluate(model, perplexity, stages=st, window=window, max_tokens=max_tokens, sim_window=sim_window,
                   sim_tokens=sim_tokens, max_seq_len=max_seq_len, cpu_quant=quant, progress=say, from_token=from_token)
    if json_out:
        emit_json(res)
        return
    t = Table("stage", "tokens", "window", "perplexity", f"perplexity (first {res['short']['tokens']})", "seconds", header_style="bold")
    for k, r in res["stages"].items():
        t.add_row(k, str(r["tokens"]), str(r["window"]), f"{r['perplexity']:.3f}",
                  f"{res['short']['perplexity'].get(k, float('nan')):.3f}", f"{r['seconds']:.1f}")
    console.print(t)
    span = res["text_span"]
    console.print(f"  text: tokens {span['first_token']:,}-{span['last_token']:,} of {Path(res['text']).name} "
                  f"({span['note']})")
    for pair, c in res["sqnr"].items():
        console.print(f"  logits {pair}: SQNR {c['sqnr_db']:.2f} dB, cosine {'n/a' if c['cosine'] is None else format(c['cosine'], '.5f')}, top-1 agreement {c['top1_agreement']:.2%}")
