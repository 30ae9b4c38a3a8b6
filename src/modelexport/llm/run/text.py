"""The text an LLM is calibrated and evaluated on: a plain-text file (by default a real essay that
ships with the assets), its sha256, and its first tokens."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import CalibrationError, InputError, IntegrityError
from ...zoo.assets import asset_path

DEFAULT_TEXT_ASSET = "lee_background"


@dataclass
class TextSource:
    path: Path
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def read_text(path: str | Path | None) -> TextSource:
    if path is None:
        path = asset_path(DEFAULT_TEXT_ASSET)
    p = Path(path)
    if not p.is_file():
        raise InputError(f"text file {p} does not exist", "give the path of an existing plain-text file")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise InputError(f"cannot read {p}: {e}") from None
    if len(text.split()) < 20:
        raise CalibrationError(f"calibration text {p} is too short ({len(text.split())} words)",
                               "give a plain-text file of real prose, at least a few hundred words")
    return TextSource(p, text)


def tokenize(tokenizer, text: str, n: int) -> list[int]:
    ids = tokenizer.encode(text[: n * 12])
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids][:n]


def recorded_text(manifest, why: str):
    """The calibration text a bundle recorded, re-read by a later step: same path, same sha256."""
    cal = (manifest.calibration or {}).get("llm", {})
    text_path = cal.get("text")
    if not text_path or not Path(text_path).exists():
        raise InputError(f"the bundle's calibration text {text_path} is gone", "put it back, or recompile with --calibration TEXT")
    text = read_text(text_path)
    if cal.get("sha256") and text.sha256 != cal["sha256"]:
        raise IntegrityError(f"the bundle's calibration text {text_path} changed since it was compiled ({why} would "
                             "compare on other text)", "put back the text the bundle was calibrated on, or recompile with --calibration TEXT")
    return text


def dialog_start(tokenizer) -> list[int]:
    """The tokens every dialog begins with: [BOS] when the tokenizer puts one first (Gemma, Llama),
    none otherwise. Each window of text that compile calibrates or checks on, and that eval scores,
    begins with them: such a model makes its first token an attention sink, and a window that starts
    mid-text without BOS is an input no runtime feeds it (Gemma 3 270M at 16a8w: 7.9 dB against float
    without BOS first, 17.2 dB with it, on the same held-out tokens)."""
    bos = getattr(tokenizer, "bos_id", None)
    return [int(bos)] if getattr(tokenizer, "add_bos", False) and bos is not None else []


@dataclass(frozen=True)
class TextTokens:
    """A text's token ids and the tokens each window cut from them begins with (dialog_start)."""
    ids: list[int]
    lead: tuple[int, ...] = ()


def text_windows(ids: list[int], window: int, lead: list[int]) -> list[list[int]]:
    """`ids` in windows of `window` tokens, each `lead` + the next window - len(lead) text tokens
    (a BOS the ids already start with is not read twice); windows shorter than two tokens are dropped."""
    body = ids[len(lead):] if lead and ids[:len(lead)] == lead else ids
    step = window - len(lead)
    cut = [lead + body[i:i + step] for i in range(0, len(body), step)]
    return [w for w in cut if len(w) >= 2]
