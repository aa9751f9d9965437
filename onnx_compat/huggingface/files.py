"""The files a runtime reads beside the model: config, preprocessor, tokenizer and vocabulary.

With them the output folder loads as a checkpoint folder does
(``AutoConfig``/``AutoFeatureExtractor``/``AutoTokenizer.from_pretrained``),
minus the weights, which are in the ONNX file. A folder holding another
model's runtime files is refused before anything is written (``foreign_files``):
two models' files never mix in one folder. They are staged as hidden
temporary files before the export and renamed into place only once it has
succeeded, so a failed export writes none of them.
"""
from __future__ import annotations

import filecmp
import fnmatch
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator, List

from onnx_compat.errors import OutputPathError

RUNTIME_FILES = (
    "config.json", "generation_config.json", "preprocessor_config.json", "processor_config.json",
    "feature_extractor_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "normalizer.json", "chat_template.json",
    "*.model",  # sentencepiece (Speech2Text's sentencepiece.bpe.model, spm_char.model)
)


def runtime_files(folder: str) -> List[str]:
    """The runtime files present in ``folder``, in a stable order."""
    names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
    return [os.path.join(folder, n) for n in names if any(fnmatch.fnmatch(n, p) for p in RUNTIME_FILES)]


def foreign_files(ours: List[str], destination: str) -> List[str]:
    """Runtime files in ``destination`` that are not the ones we would write there: a name we do not copy (it
    would stay beside ours), or one we do with other content (another model's, which ours would replace while
    its companions stay). The checkpoint folder itself and a repeat of the same export have none."""
    mine = {os.path.basename(p): p for p in ours}
    found = []
    for path in runtime_files(destination):
        source = mine.get(os.path.basename(path))
        if source is None or not (os.path.samefile(source, path) or filecmp.cmp(source, path, shallow=False)):
            found.append(os.path.basename(path))
    return found


@contextmanager
def staged_copies(files: List[str], destination: str) -> Iterator[List[str]]:
    """Copy ``files`` into ``destination`` under temporary names; the caller's ``commit`` renames them.

    Yields a list that ``commit(staged)`` fills in; leaving the block without
    committing removes the temporary copies. Files already in ``destination``
    (exporting into the checkpoint folder) are left alone.
    """
    staged: List[tuple] = []
    try:
        for path in files:
            target = os.path.join(destination, os.path.basename(path))
            if os.path.exists(target) and os.path.samefile(path, target):
                continue
            try:
                fd, temp = tempfile.mkstemp(prefix=".onnx_compat_", dir=destination)
                os.close(fd)
                staged.append((temp, target))
                shutil.copyfile(path, temp)
            except OSError as exc:  # named as the file the user asked for, not our temporary name
                raise OutputPathError(f"cannot write {target!r}: {exc.strerror or exc}", path=target) from None
        yield staged
    finally:
        for temp, _ in staged:
            if os.path.exists(temp):
                os.remove(temp)


def commit(staged) -> List[str]:
    """Rename the staged copies into place; their final paths."""
    done = []
    for temp, target in staged:
        os.replace(temp, target)
        done.append(target)
    return done
