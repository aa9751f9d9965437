"""The core verbs of ``onnx-compat``, one module each: ``add_parser(subparsers)`` and ``run(args) -> exit code``.

``onnx_compat/cli.py``'s verb table names them (and the verbs other layers define the same way:
``streaming/cli.py``, ``quantization/cli.py``); each is imported only when its verb runs.
"""
