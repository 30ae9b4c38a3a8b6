"""The corpus's speech front end (zoo/speech.py): log-mel frames as speech models take them."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from modelexport.zoo.speech import LogMel, log_mel, mel_filters, speech_features


def test_a_tone_lands_in_the_mel_band_of_its_frequency():
    fe = LogMel()
    t = np.arange(fe.rate) / fe.rate
    frames = log_mel(np.sin(2 * np.pi * 1000.0 * t).astype(np.float32), fe)
    filters = mel_filters(fe.rate, fe.n_fft, fe.n_mels)
    centre_hz = filters.argmax(axis=1) * fe.rate / fe.n_fft
    band = int(np.median(frames.argmax(axis=1)))
    assert frames.shape == (fe.frames, fe.n_mels) and abs(centre_hz[band] - 1000.0) < 120.0
    assert np.all(np.diff(centre_hz) >= 0)            # filters in ascending frequency


def test_spoken_sentences_give_log_mel_windows():
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng not installed (make test installs it)")
    import tempfile
    from pathlib import Path
    feats = speech_features(LogMel(), Path(tempfile.mkdtemp()), count=2)
    assert [f.shape for f in feats] == [(1, 80, 40)] * 2
    assert all(f.min() > -10.5 and f.max() < 3.0 and f.std() > 0.5 for f in feats)


@pytest.mark.parametrize("name, shape", [("basic_pitch", (1, 43844, 1)), ("voicefilter_embedder", (1, 80, 40))])
def test_corpus_rows_with_speech_get_one_sample_per_sentence(tmp_path, name, shape):
    """Audio rows of the corpus calibrate and verify on spoken sentences: a waveform at the model's
    rate, cut or padded to its window, or log-mel frames."""
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng not installed (make test installs it)")
    from modelexport.zoo.real_onnx import get, input_label, real_inputs
    from modelexport.zoo.speech import SENTENCES
    m = get(name)
    samples = real_inputs(m, "x", tmp_path)
    assert len(samples) == len(SENTENCES) and all(s["x"].shape == shape and s["x"].dtype == np.float32 for s in samples)
    assert all(np.abs(s["x"]).max() > 0.05 for s in samples) and "espeak-ng" in input_label(m)
    if name == "basic_pitch":
        assert all(np.abs(s["x"]).max() <= 1.0 for s in samples)
