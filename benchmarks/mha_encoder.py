"""A speech encoder built the way users build one from torch's own blocks (issue #29's attention model).

``nn.MultiheadAttention`` with a key padding mask from the lengths, a same-padded
depthwise conv and a feed-forward layer per block, ``blocks`` of them at width
``C``. Unlike the bundled Conformer (its own attention), the attention here is
torch's, so its export is what most users' models give.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat.spec import Dim, TensorSpec


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": None}


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: int):
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.conv = nn.Conv1d(dim, dim, kernel, padding="same", groups=dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))

    def forward(self, x, pad_mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=pad_mask, need_weights=False)[0]
        x = x + self.conv(self.norm2(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ff(self.norm3(x))


class MhaEncoder(nn.Module):
    def __init__(self, features: int = 80, dim: int = 256, blocks: int = 12, heads: int = 4, kernel: int = 15):
        super().__init__()
        self.inp = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kernel) for _ in range(blocks))

    def forward(self, data, lengths):
        pad_mask = torch.arange(data.shape[1], device=data.device)[None, :] >= lengths[:, None]
        x = self.inp(data)
        for block in self.blocks:
            x = block(x, pad_mask)
        return x, lengths


def job(blocks: int = 12, dim: int = 256, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time"), 80], lengths=[1])]
    outputs = [TensorSpec("output", [batch, Dim("time"), dim], lengths=[1])]
    return {"model": MhaEncoder(dim=dim, blocks=blocks).eval(), "inputs": inputs, "outputs": outputs}


def main(argv=None):
    """ONNX Runtime latency of this encoder's verified exports, side by side in one run (1 thread, CPU time):
    TorchScript with and without ``mha_compact``, and dynamo. ``--tiny`` for a smoke run."""
    import argparse
    import os
    import sys
    import tempfile

    import onnx

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from latency_timing import clock_for, interleaved_medians, ort_call

    import onnx_compat
    from onnx_compat.pipeline.capture import HAS_DYNAMO
    from onnx_compat.spec import make_inputs

    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    spec = job(blocks=2, dim=32) if args.tiny else job()
    variants = {"torchscript": ("torchscript", None),
                "torchscript without mha_compact": ("torchscript", {"exclude": ["mha_compact"]})}
    if HAS_DYNAMO:
        variants["dynamo"] = ("dynamo", None)
    graphs, nodes = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (exporter, patches) in variants.items():
            path = os.path.join(tmp, f"{len(graphs)}.onnx")
            onnx_compat.export(spec["model"], path, spec["inputs"], spec["outputs"], exporter=exporter, patches=patches)
            graphs[name] = onnx.load(path)
            nodes[name] = len(graphs[name].graph.node)
    feeds = {k: v.numpy() for k, v in make_inputs(spec["inputs"], {"batch": 4, "time": 300}, seed=3).items()}
    seconds = interleaved_medians({k: ort_call(g, feeds, 1) for k, g in graphs.items()}, args.rounds,
                                  clock=clock_for(1))
    base = seconds["torchscript"]
    lines = ["| graph | nodes | ONNX Runtime, 1 thread, B=4, T=300 |", "|---|---|---|"]
    lines += [f"| {k} | {nodes[k]} | {seconds[k] / base:.2f}x ({seconds[k] * 1e3:.1f} ms) |" for k in graphs]
    if "dynamo" in graphs:  # what choosing costs: choose.faster on the verification inputs (deployed sessions)
        from onnx_compat.pipeline.choose import faster, verification_feeds
        from onnx_compat.pipeline.subject import Subject
        subject = Subject.build(spec["model"], spec["inputs"], spec["outputs"], seed=0)
        choice = faster({"dynamo": graphs["dynamo"], "torchscript": graphs["torchscript"]}, verification_feeds(subject))
        lines += ["", f"choose.faster: {choice.name}; {choice.why()}; cost {choice.cost:.2f} s (process CPU "
                      "would be higher under load: wall clock)"]
    print("\n".join(lines))
    return seconds, nodes


if __name__ == "__main__":
    main()
