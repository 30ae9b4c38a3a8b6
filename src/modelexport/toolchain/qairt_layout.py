"""How a QAIRT SDK lays out its host libraries: shared by the discovery (`qairt`) and by the
ExecuTorch adapter (`executorch_env`), which must not import each other."""

HOST_LIB_SUBDIR = "lib/x86_64-linux-clang"
# The libraries we look for, by role. Only libQnnHtp.so is required.
LIBRARY_NAMES = {
    "htp": "libQnnHtp.so",
    "htp_prepare": "libHtpPrepare.so",
    "system": "libQnnSystem.so",
    "ir": "libQnnIr.so",
    "saver": "libQnnSaver.so",
    "gpu": "libQnnGpu.so",
    "genie": "libGenie.so",
    "ort_qnn_ep": "libonnxruntime_providers_qnn.so",
}
