"""The patching layer: the registry (``registry.py``), what a patch acts on
(``when.py``), and one module per family of PyTorch pieces that export badly
(``families.py`` lists the default set).
"""
