"""Precisions (what each name means on the HTP) and calibration data readers."""
from .calibration import CalibrationSet, load_calibration
from .precision import ONNX_PRECISIONS, PRECISIONS, Precision, get_precision, precision_from_bitwidths

__all__ = ["CalibrationSet", "load_calibration", "ONNX_PRECISIONS", "PRECISIONS", "Precision", "get_precision",
           "precision_from_bitwidths"]
