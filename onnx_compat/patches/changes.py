"""A record of attribute changes that can be undone exactly.

Like pytest's ``monkeypatch``: every ``setattr`` is recorded with what was
there before (including "nothing, it was inherited"), and ``undo`` restores in
reverse order, so that two changes to one attribute unwind correctly. The
restore target is what was there when the change was made, not when the
record was created.
"""
from __future__ import annotations

from typing import Any, List, Tuple

_MISSING = object()


class Changes:
    def __init__(self) -> None:
        self._log: List[Tuple[Any, str, Any]] = []

    def setattr(self, owner: Any, name: str, value: Any) -> None:
        # Only what lives in the owner's own __dict__ is restored by setattr;
        # an inherited attribute is restored by deleting the override.
        own = vars(owner) if hasattr(owner, "__dict__") else {}
        old = own[name] if name in own else _MISSING
        if old is _MISSING and not hasattr(owner, name):
            raise AttributeError(f"{owner!r} has no attribute {name!r}")
        setattr(owner, name, value)
        self._log.append((owner, name, old))

    def undo(self) -> None:
        """Restore every change, newest first. Errors are raised after all are tried."""
        errors = []
        while self._log:
            owner, name, old = self._log.pop()
            try:
                if old is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, old)
            except Exception as exc:  # keep restoring the rest
                errors.append(f"{owner!r}.{name}: {exc}")
        if errors:
            raise RuntimeError("could not restore: " + "; ".join(errors))

    def __len__(self) -> int:
        return len(self._log)
