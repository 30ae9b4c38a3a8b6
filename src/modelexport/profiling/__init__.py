"""Per-op profiling of a compiled bundle on the HTP simulator (`modelexport profile`): the report types and
the readers of what the libraries write. `ort_profile` and `pte_profile` profile the two
formats; `modelexport.runtime.runners.profile_bundle` picks one by the bundle's format.

What the libraries really report (QAIRT 2.51 through onnxruntime-qnn 2.7.0):
- the QNN EP's own profiler (`profiling_level` basic|detailed, `profiling_file_path` → a CSV the EP
  writes when the session ends; columns `Msg Timestamp, Message, Time, Unit of Measurement,
  Timing Source, Event Level, Event Identifier`): per run ROOT events ("QNN (execute) time" and
  "Accelerator (execute) time" in US, at `detailed` also "Accelerator (execute) time (cycles)",
  VTCM acquire and HVX/HMX power-on times) and, at `detailed` only, one SUB-EVENT per QNN node
  in CYCLES, named `<ONNX node name>[_token_N]:OpId_M (cycles)`;
- ONNX Runtime's session profiler (`enable_profiling`, a Chrome-trace JSON): wall time per ORT
  node, which is how nodes the session left on the CPU EP (fallbacks and graph-IO (de)quantize)
  are timed.
On x86 `libQnnHtp.so` is a simulator: its times and cycles rank ops within one model and say
nothing about a phone's latency.
"""
from .report import NOTE as SIMULATOR_NOTE
from .report import ProfileReport, ProfileRow

__all__ = ["ProfileReport", "ProfileRow", "SIMULATOR_NOTE"]
