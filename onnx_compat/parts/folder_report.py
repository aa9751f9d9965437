"""What every sherpa-onnx family writer's report shares (Whisper, SenseVoice / Paraformer, VITS / Matcha): the
files of the folder it wrote, and its JSON written whole.

Each family's report is a dataclass of its own fields (the language, the proof's texts, ...); this mixin reads
only ``parts`` (the ``PartsReport`` of the graphs written), and ``to_dict`` of the family's class. The JSON goes
through ``write_text_atomically`` like every other report, so a failed write leaves no half file beside the
graphs.
"""
from __future__ import annotations

import json
from typing import List, Optional

from ..pipeline.files import write_text_atomically


class FolderReport:
    """``files`` and ``to_json`` of a family writer's report; the class gives ``parts`` and ``to_dict``."""

    parts: object

    @property
    def files(self) -> List[str]:
        return sorted(self.parts.files.values())

    def to_json(self, path: Optional[str] = None) -> str:
        """The report as JSON text (``Report.to_json``'s form), also written whole to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            write_text_atomically(path, text + "\n")
        return text
