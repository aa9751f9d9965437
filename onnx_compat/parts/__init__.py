"""Several graphs that hand states to each other, exported from callables and checked together.

``export_parts(parts, folder, states)``: each ``Part`` (an encoder, a state
initializer, a state updater, a scorer, a joiner) is exported and verified at
new shapes by ``export()``; the ``StateSpec``s are shared, so each state has
one dtype and one shape in every graph, checked on the written graphs.
Consumers' contracts (RASR's label scorers, sherpa-onnx's transducers:
``transducer.export_transducer``, loaded on use) build their graphs on it.
"""
from .errors import GraphContractError
from .export import PartsReport, export_parts
from .part import Part

__all__ = ["Part", "export_parts", "PartsReport", "GraphContractError"]
