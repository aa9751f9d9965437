"""Argument handling shared by patches that wrap both ``torch.f(x, ...)`` and ``x.f(...)``."""
from __future__ import annotations

from typing import Optional, Sequence


def tensor_call(instance, args, kwargs, params: Sequence[str], defaults: Optional[dict] = None) -> Optional[dict]:
    """Bind a call made as ``torch.f(x, ...)`` or ``x.f(...)`` to ``params`` (the first is the tensor).

    ``params`` lists every parameter in positional order; those in ``defaults``
    are optional. Returns None when the call does not fit (unknown or doubled
    keyword, too many or too few arguments): the patch then calls the original,
    which raises PyTorch's own error.
    """
    if instance is not None:
        args = (instance,) + tuple(args)
    if len(args) > len(params) or any(k not in params or params.index(k) < len(args) for k in kwargs):
        return None
    bound = dict(defaults or {})
    bound.update(zip(params, args))
    bound.update(kwargs)
    if any(p not in bound for p in params):
        return None
    return bound
