"""A second probe after round three (issue #47): first contact with sequence models from eleven libraries that no
sweep round and no test uses (``sweep.py --round 5``): spectral long convolutions (Mega's damped EMA, GSS's
diagonal state-space kernel), gated linear recurrences (GateLoop), hierarchical, agent, Taylor-series and
Sinkhorn attention, byte patches (MEGABYTE) and models that carry memories across segments.

Same rules as ``sweep_models.py``; each configuration is small and random-initialised.
"""
from __future__ import annotations

import torch

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, entry, feats, out


def _r5(library, kind):
    return entry(library, kind, round=5)


def _tokens(n, example=37, min=8, max=None, multiple=1):
    time = Dim("tokens", min=min, example=example, max=max, multiple=multiple)
    return [TensorSpec("data", [B, time], dtype=torch.int64, values=(0, n))]


@_r5("mega-pytorch", "encoder")
def mega_layer():
    """A Mega layer: a multi-headed damped EMA as an FFT convolution over the sequence, then gated attention."""
    _manual()
    from mega_pytorch import MegaLayer
    model = MegaLayer(dim=32, ema_heads=4, attn_dim_qk=16, attn_dim_value=32, laplacian_attn_fn=True, causal=False)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r5("mega-pytorch", "language-model")
def mega_lm():
    _manual()
    from mega_pytorch import Mega
    model = Mega(num_tokens=30, dim=32, depth=2, ema_heads=4, attn_dim_qk=16, attn_dim_value=32)
    return _job(model, _tokens(30), out("tokens", 30))


@_r5("gated-state-spaces-pytorch", "encoder")
def gss_layer():
    """Gated State Spaces: a diagonal state-space kernel as long as the sequence, applied by FFT."""
    _manual()
    from gated_state_spaces_pytorch import GSS
    model = GSS(dim=32, dim_expansion_factor=2, dss_kernel_N=16, dss_kernel_H=32)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r5("gateloop-transformer", "language-model")
def gateloop_lm():
    """GateLoop: a gated linear recurrence with complex transitions, computed by an associative scan."""
    _manual()
    from gateloop_transformer import Transformer
    model = Transformer(dim=32, num_tokens=30, depth=1, dim_head=8, heads=4, checkpoint_gate_looped_attn=False)
    return _job(model, _tokens(30), out("tokens", 30))


@_r5("gateloop-transformer", "recurrence")
def gateloop_simple():
    _manual()
    from gateloop_transformer import SimpleGateLoopLayer
    return _job(SimpleGateLoopLayer(32), feats(32, example=37, min=8), out("time", 32))


@_r5("taylor-series-linear-attention", "attention")
def taylor_linear_attention():
    """Linear attention whose feature map is the second-order Taylor expansion of exp."""
    _manual()
    from taylor_series_linear_attention import TaylorSeriesLinearAttn
    model = TaylorSeriesLinearAttn(dim=32, dim_head=8, heads=4)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r5("agent-attention-pytorch", "attention")
def agent_attention():
    """Agent attention: a few learned agent tokens attend to the sequence, the sequence to them."""
    _manual()
    from agent_attention_pytorch import AgentSelfAttention
    model = AgentSelfAttention(dim=32, num_agent_tokens=8, dim_head=8, heads=4)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r5("simple-hierarchical-transformer", "language-model")
def hierarchical_lm():
    """Two hierarchies: the tokens and a sequence compressed by 2, local attention windows on the fine one."""
    _manual()
    from simple_hierarchical_transformer import HierarchicalTransformer
    model = HierarchicalTransformer(num_tokens=30, dim=32, depth=2, seq_len=256, dim_head=8, heads=4,
                                    hierarchies=(1, 2), window_sizes=(16, None), predict_hierarchy=None)
    return _job(model, _tokens(30, example=38, min=8, max=256), out("tokens", 30))


@_r5("MEGABYTE-pytorch", "language-model")
def megabyte():
    """MEGABYTE: a global model over patches of 4 bytes and a local model within each patch."""
    _manual()
    from MEGABYTE_pytorch import MEGABYTE
    model = MEGABYTE(num_tokens=30, dim=(32, 16), depth=(1, 1), max_seq_len=(64, 4), dim_head=8, heads=2)
    return _job(model, _tokens(30, example=37, min=8, max=256), out("tokens", 30))


@_r5("sinkhorn-transformer", "language-model")
def sinkhorn_lm():
    """Sinkhorn attention: buckets sorted by a learned, Sinkhorn-normalised permutation."""
    _manual()
    from sinkhorn_transformer import SinkhornTransformerLM
    model = SinkhornTransformerLM(num_tokens=30, dim=32, max_seq_len=256, depth=1, heads=4, bucket_size=8)
    return _job(model, _tokens(30, example=40, min=8, max=256, multiple=8), out("tokens", 30))


@_r5("recurrent-memory-transformer-pytorch", "language-model")
def recurrent_memory_lm():
    """A segment with read memories in and write memories out (the caller loops over segments)."""
    _manual()
    from recurrent_memory_transformer_pytorch import RecurrentMemoryTransformer
    model = RecurrentMemoryTransformer(32, num_tokens=30, depth=1, num_memory_tokens=4, seq_len=64, dim_head=8,
                                       heads=2, use_xl_memories=False, num_residual_streams=1)
    return _job(Seeded(model, lambda m, x: m(x)[0]), _tokens(30, example=37, min=8, max=64), out("tokens", 30))


@_r5("compressive-transformer-pytorch", "language-model")
def compressive_lm():
    """A segment of the Compressive Transformer, with empty memories."""
    _manual()
    from compressive_transformer_pytorch import CompressiveTransformer
    model = CompressiveTransformer(num_tokens=30, dim=32, seq_len=64, depth=2, heads=2, mem_len=64, cmem_len=16,
                                   cmem_ratio=4)
    return _job(Seeded(model, lambda m, x: m(x)[0]), _tokens(30, example=37, min=8, max=64), out("tokens", 30))


@_r5("h-transformer-1d", "language-model")
def h_transformer():
    """Hierarchical attention (H-Transformer-1D): the sequence padded to a power of two times the block."""
    _manual()
    from h_transformer_1d import HTransformer1D
    model = HTransformer1D(num_tokens=30, dim=32, depth=1, max_seq_len=256, heads=2, dim_head=8, block_size=8)
    return _job(model, _tokens(30, example=37, min=8, max=256), out("tokens", 30))
