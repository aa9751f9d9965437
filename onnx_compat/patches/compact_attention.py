"""``nn.MultiheadAttention`` under the TorchScript exporter without shape chains.

Why: ``F.multi_head_attention_forward`` splits heads with views whose sizes it
reads from the input (``q.view(tgt_len, bsz * num_heads, head_dim)``), merges
the key padding mask by ``view``/``expand``/``reshape`` to ``[B * H, 1, S]`` and
SDPA computes its scale from the query's shape. Traced, each of those sizes
becomes a Shape -> Gather -> Unsqueeze -> Concat chain: a 12-block encoder of
``nn.MultiheadAttention`` exports to 2,500 nodes, about 60 % of them shape
arithmetic, and cleaning them is most of the pipeline's cost there (#29).

The patch computes the same attention in a layout that needs no sizes at all:
heads are split and merged by a ``Reshape`` whose target keeps the leading dims
with ONNX's ``0`` ("copy this dim") and ``-1``; queries, keys and values are
permuted to ``[B, H, T, d]`` so the masks broadcast (``[B, 1, 1, S]``,
``[T, S]``) instead of being expanded to ``B * H`` rows; the scale is the
head width's constant. Eager semantics are kept: a bool mask's True is
``-inf``, a float mask is added, the weights are returned averaged over heads
or per head as asked. Anything else (bias_k/bias_v, add_zero_attn, static
keys, 3-D attn_mask, unbatched input, dropout in training) takes torch's own
function unchanged.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from onnx_compat.patches._static import static_ints
from onnx_compat.patches.registry import Patch, register

_PARAMS = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
           "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training",
           "key_padding_mask", "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight",
           "k_proj_weight", "v_proj_weight", "static_k", "static_v", "average_attn_weights", "is_causal")
_DEFAULTS = {"training": True, "key_padding_mask": None, "need_weights": True, "attn_mask": None,
             "use_separate_proj_weight": False, "q_proj_weight": None, "k_proj_weight": None, "v_proj_weight": None,
             "static_k": None, "static_v": None, "average_attn_weights": True, "is_causal": False}


class KeepLeadingReshape(torch.autograd.Function):
    """``x.reshape(shape)`` where 0 copies the input's dim there: one ONNX ``Reshape`` with a constant target,
    where a traced ``reshape`` of sizes read from ``x`` writes a chain of shape ops per size."""

    @staticmethod
    def forward(ctx, x, *shape: int):
        return x.reshape([x.shape[i] if s == 0 else s for i, s in enumerate(shape)])

    @staticmethod
    def symbolic(g, x, *shape):
        return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor(list(shape), dtype=torch.int64)))


def keep_leading_reshape(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    return KeepLeadingReshape.apply(x, *shape)


def _bind(args, kwargs) -> Optional[dict]:
    if len(args) > len(_PARAMS) or any(k not in _PARAMS for k in kwargs):
        return None
    bound = dict(_DEFAULTS)
    bound.update(zip(_PARAMS, args))
    bound.update(kwargs)
    return bound if all(p in bound for p in _PARAMS) else None


def _supported(b: dict) -> bool:
    """The common case this layout covers; the rest goes to torch's own function."""
    mask, padding = b["attn_mask"], b["key_padding_mask"]
    return (b["query"].dim() == 3 and b["bias_k"] is None and b["bias_v"] is None and not b["add_zero_attn"]
            and b["static_k"] is None and b["static_v"] is None and (not b["training"] or b["dropout_p"] == 0.0)
            and (mask is None or mask.dim() == 2) and (padding is None or padding.dim() == 2)
            and not (b["is_causal"] and mask is None)
            and (b["use_separate_proj_weight"] or b["in_proj_weight"] is not None))


def _projections(b: dict, embed: int):
    """q, k, v as ``[T, B, E]``. Packed weights are split at the width (a ``Split`` of constant sizes):
    ``chunk`` computes the thirds' bounds from the weight's shape, 30 nodes a layer to fold."""
    q, k, v, bias = b["query"], b["key"], b["value"], b["in_proj_bias"]
    if b["use_separate_proj_weight"]:
        weights = (b["q_proj_weight"], b["k_proj_weight"], b["v_proj_weight"])
    elif q is k and k is v:  # self-attention: one product with the whole weight, its output split
        return F.linear(q, b["in_proj_weight"], bias).split(embed, dim=-1)
    else:
        weights = b["in_proj_weight"].split(embed)
    biases = (None, None, None) if bias is None else bias.split(embed)
    return tuple(F.linear(x, w, bb) for x, w, bb in zip((q, k, v), weights, biases))


def _masked(scores: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """A bool mask's True is not attended (-inf), a float mask is added; ``mask`` broadcasts to scores."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(mask, float("-inf"))
    return scores + mask


def compact_attention(b: dict):
    """``F.multi_head_attention_forward`` (batched, seq-first ``[T, B, E]``) in the ``[B, H, T, d]`` layout."""
    # widths are the weights' (model constants); traced, a shape entry would be a tensor
    heads, embed = static_ints((b["num_heads"], b["out_proj_weight"].shape[0]))
    head = embed // heads
    q, k, v = _projections(b, embed)
    q = keep_leading_reshape(q, (0, -1, heads, head)).permute(1, 2, 0, 3) * (1.0 / math.sqrt(head))
    k = keep_leading_reshape(k, (0, -1, heads, head)).permute(1, 2, 3, 0)
    v = keep_leading_reshape(v, (0, -1, heads, head)).permute(1, 2, 0, 3)
    scores = torch.matmul(q, k)  # [B, H, T, S]
    scores = _masked(scores, b["attn_mask"])
    padding = b["key_padding_mask"]
    scores = _masked(scores, None if padding is None else padding[:, None, None, :])
    weights = torch.softmax(scores, dim=-1)
    if b["training"] and b["dropout_p"] > 0.0:
        weights = F.dropout(weights, b["dropout_p"])
    context = keep_leading_reshape(torch.matmul(weights, v).permute(2, 0, 1, 3), (0, 0, -1))  # [T, B, E]
    out = F.linear(context, b["out_proj_weight"], b["out_proj_bias"])
    if not b["need_weights"]:
        return out, None
    return out, weights.mean(dim=1) if b["average_attn_weights"] else weights


def mha_forward(wrapped, instance, args, kwargs):
    b = _bind(args, kwargs)
    if b is None or not _supported(b):
        return wrapped(*args, **kwargs)
    return compact_attention(b)


register(Patch(
    name="mha_compact",
    description="nn.MultiheadAttention under the TorchScript exporter without shape arithmetic: heads split by "
                "a Reshape keeping the leading dims, masks broadcast instead of expanded to B*H rows",
    targets=("torch.nn.functional:multi_head_attention_forward",),
    wrapper=mha_forward,
    when="torchscript",
))
