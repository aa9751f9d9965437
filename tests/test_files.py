"""What the pipeline writes has the mode any file written there would have (``pipeline/files.py``).

A model made by a temporary file renamed into place was 0600 whatever the
umask, so a runtime or a RASR job running as another user could not read it.
"""
import os
import stat

import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.cli import main

B, T = Dim("batch"), Dim("time")
SPECS = ([TensorSpec("data", [B, T, 8])], [TensorSpec("output", [B, T, 4])])


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=["umask-022", "umask-077", "umask-002"])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_model_data_file_and_report_follow_the_umask(umask, tmp_path):
    torch.manual_seed(0)
    path, report_path = tmp_path / "m.onnx", tmp_path / "r.json"
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))  # weights past the 1 KiB kept inline
    report = onnx_compat.export(model, str(path), *SPECS, exporter="torchscript", external_data=True)
    report.to_json(str(report_path))
    want = 0o666 & ~umask
    written = {p: _mode(p) for p in (path, tmp_path / "m.onnx.data", report_path)}
    assert all(mode == want for mode in written.values()), {str(p): oct(m) for p, m in written.items()}


def test_the_cli_writes_a_model_others_can_read(tmp_path):
    before = os.umask(0o022)
    try:
        assert main(["export", "onnx_compat.models.conv_demo:build", "--out", str(tmp_path / "m.onnx"),
                     "--exporter", "torchscript", "--quiet"]) == 0
    finally:
        os.umask(before)
    assert _mode(tmp_path / "m.onnx") == 0o644


def test_text_beside_a_model_follows_the_umask_and_a_failed_write_leaves_nothing(umask, tmp_path, monkeypatch):
    """Consumer files (tokens.txt) and the label scorers' report are written by one helper: mkstemp's 0600
    must not reach them, and a rename that fails leaves neither the file nor its temporary."""
    from onnx_compat.pipeline import files
    files.write_text_atomically(str(tmp_path / "tokens.txt"), "a 0\n<blk> 1\n")
    assert (tmp_path / "tokens.txt").read_text() == "a 0\n<blk> 1\n"
    assert _mode(tmp_path / "tokens.txt") == 0o666 & ~umask

    def no_room(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "replace", no_room)
    with pytest.raises(OSError):
        files.write_text_atomically(str(tmp_path / "config.txt"), "x")
    assert sorted(os.listdir(tmp_path)) == ["tokens.txt"]


def test_a_family_writers_report_is_written_whole(tmp_path, monkeypatch):
    """The sherpa-onnx family writers' reports (Whisper, FunASR, TTS) share ``FolderReport.to_json``: the JSON is
    the report's ``to_dict``, and a write that fails leaves neither the file nor a temporary beside it (they each
    opened the path with a plain ``open`` before)."""
    import json
    from dataclasses import dataclass
    from types import SimpleNamespace

    from onnx_compat.parts.folder_report import FolderReport

    @dataclass
    class Written(FolderReport):
        parts: object

        def to_dict(self):
            return {"files": self.files}

    report = Written(SimpleNamespace(files={"encoder": "/f/encoder.onnx", "decoder": "/f/decoder.onnx"}))
    path = tmp_path / "report.json"
    assert json.loads(report.to_json(str(path))) == json.loads(path.read_text()) == \
        {"files": ["/f/decoder.onnx", "/f/encoder.onnx"]}

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        report.to_json(str(tmp_path / "other.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
