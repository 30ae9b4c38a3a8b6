"""Real speech for audio models of the corpus: sentences spoken by espeak-ng (a Debian package `make`
installs; offline), read as mono float at the model's rate, and the log-mel features speech models
take (librosa's Slaney mel filterbank, computed here in numpy: librosa is not a dependency)."""
from __future__ import annotations

import shutil
import subprocess
import wave
from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np

from ..core.errors import InputError

SENTENCES = ("The quick brown fox jumps over the lazy dog.",
             "Please call Stella and ask her to bring these things with her from the store.",
             "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother.",
             "We also need a small plastic snake and a big toy frog for the kids.")


@dataclass(frozen=True)
class LogMel:
    """A log-mel front end: power spectrogram of a windowed STFT (no centre padding) through a mel
    filterbank, then log10(x + floor); `frames` frames from the start of the utterance."""
    rate: int = 16000
    n_fft: int = 512
    win_length: int = 400
    hop: int = 160
    n_mels: int = 40
    frames: int = 80
    floor: float = 1e-10


def spoken(text: str, dest: Path) -> Path:
    """`text` spoken by espeak-ng into the .wav `dest`."""
    if not shutil.which("espeak-ng"):
        raise InputError("espeak-ng is not installed, and the corpus's speech inputs are spoken by it",
                         "install it (`apt-get install espeak-ng`; `make setup` does as root)")
    subprocess.run(["espeak-ng", "-w", str(dest), text], check=True, capture_output=True)
    return dest


def read_wav(path: Path, rate: int) -> np.ndarray:
    """16-bit PCM .wav → mono float32 in [-1, 1] at `rate` (resampled by a polyphase filter)."""
    from scipy.signal import resample_poly   # deferred: scipy.signal costs ~0.75 s, for speech rows alone
    with wave.open(str(path)) as f:
        have, channels = f.getframerate(), f.getnchannels()
        pcm = np.frombuffer(f.readframes(f.getnframes()), np.int16).astype(np.float32) / 32768.0
    mono = pcm.reshape(-1, channels).mean(axis=1)
    g = gcd(rate, have)
    return resample_poly(mono, rate // g, have // g).astype(np.float32)


def log_mel(y: np.ndarray, fe: LogMel) -> np.ndarray:
    """[frames, n_mels] log10 mel power of `y` (padded with silence to `frames` frames)."""
    need = fe.n_fft + fe.hop * (fe.frames - 1)
    y = np.pad(y, (0, max(0, need - y.size)))[:need]
    window = np.zeros(fe.n_fft, np.float32)
    left = (fe.n_fft - fe.win_length) // 2
    window[left:left + fe.win_length] = np.hamming(fe.win_length + 1)[:-1]     # periodic, as scipy's get_window
    frames = np.lib.stride_tricks.sliding_window_view(y, fe.n_fft)[::fe.hop][:fe.frames]
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    return np.log10(power @ mel_filters(fe.rate, fe.n_fft, fe.n_mels).T + fe.floor).astype(np.float32)


def mel_filters(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """[n_mels, n_fft // 2 + 1] Slaney-scale triangular filters with Slaney area normalisation."""
    def to_mel(f):
        f = np.asarray(f, np.float64)
        return np.where(f < 1000.0, 3.0 * f / 200.0, 15.0 + 27.0 * np.log(np.maximum(f, 1e-9) / 1000.0) / np.log(6.4))

    def to_hz(m):
        m = np.asarray(m, np.float64)
        return np.where(m < 15.0, 200.0 * m / 3.0, 1000.0 * np.exp(np.log(6.4) * (m - 15.0) / 27.0))
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(rate / 2), n_mels + 2))
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    tri = np.maximum(0.0, np.minimum(lower, upper))
    return (tri * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


def speech_features(fe: LogMel, work: Path, count: int = len(SENTENCES)) -> list[np.ndarray]:
    """[1, frames, n_mels] log-mel windows of `count` spoken sentences (the wavs written under `work`)."""
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for i, text in enumerate(SENTENCES[:count]):
        wav = spoken(text, work / f"sentence_{i}.wav")
        out.append(log_mel(read_wav(wav, fe.rate), fe)[None])
    return out
