"""The release of onnx_compat (read by the package, setup.py and the metadata it writes)."""
__version__ = "0.1.0"
