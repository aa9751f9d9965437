"""The only file of this package that imports onnx_compat's internal modules (renamed while merging)."""
from onnx_compat.pipeline.files import check_writable, content_hash, write_atomically  # noqa: F401
from onnx_compat.pipeline.report import Report  # noqa: F401
from onnx_compat.pipeline.verification import Case, reference_cases, session, valid_mask  # noqa: F401


def load_factory(spec: str):
    """The CLI's ``MODULE:FACTORY`` loader: ``(model, inputs, outputs, examples)``."""
    from onnx_compat.cli import load_factory as load
    return load(spec)


def load_examples(path):
    """The CLI's ``--examples`` loader (``.npz`` or ``.pt``)."""
    from onnx_compat.cli import load_examples as load
    return load(path)
