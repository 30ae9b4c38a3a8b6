"""ONNX Runtime QNN EP: ONNX → QDQ → EPContext model + context binary per target; run, verify, profile and
inspect those bundles on the HTP simulator."""
