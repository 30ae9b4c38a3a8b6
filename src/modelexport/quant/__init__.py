"""Precisions (what each name means on the HTP) and calibration data readers."""
from .calibration import CalibrationSet, load_calibration
from .precision import PRECISIONS, Precision, get_precision, precision_from_bitwidths

__all__ = ["CalibrationSet", "load_calibration", "PRECISIONS", "Precision", "get_precision", "precision_from_bitwidths"]
