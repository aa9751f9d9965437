"""onnxscript's matching of a pattern with several output nodes, in time that grows with the graph, not its square.

torch.onnx's dynamo exporter optimises the graph it writes with onnxscript's rewriter. One of its default rules,
``SlicesSplit`` (``Slice(x, 0, h)`` and ``Slice(x, h, 2h)`` on the last axis -> one ``Split``), has two output
nodes, and for such a pattern ``SimplePatternMatcher.match`` (onnxscript 0.7.2) lists every node of the graph by
op type at each node it tries, then tries every node of the partner's op type as the partner: nodes x nodes per
pass, for every model, whether or not it has a Slice. Measured on torch 2.13 (one core): 1.3 s of the 2.5 s
optimisation of a 12-block attention encoder (1,651 nodes; its whole bare dynamo export ~14-19 s), and 385 s of
a 511 s export of mambapy's Mamba with a declared maximum length (ten levels of a parallel scan, functionalised
into thousands of Slices).

While patched, a partner whose pattern shares a variable with the first output node (``SlicesSplit``'s ``x``)
is looked for only among the consumers of the value the tried node binds to that variable, at the same input
position: no other node can bind one variable to the same value. They are tried in graph order, as onnxscript
tries them, because the first pair that matches the pattern is the one the rule's check then accepts or refuses
(``SlicesSplit`` fires only where the second half's Slice comes first): the same rewrites as the full search.
Graph positions are listed once per rewrite pass (a rewrite inserts nodes where it replaces them and moves none)
and again when a partner is newer than the list. A pattern with a partner that shares no variable with the first
output node is matched by onnxscript as before.
"""
from __future__ import annotations

import inspect
import itertools
import threading

from onnx_compat.patches.registry import Patch, register

_NAME = "multi_output_matches"
_TARGET = "onnxscript.rewriter._matcher:SimplePatternMatcher.match"
_PASS = "onnxscript.rewriter._rewrite_rule:RewriteRuleSet.apply_to_model"
_INTERNALS = ("_init_match", "_multi_match")  # what the search below calls, as onnxscript's own search does


def _shared_input(first, partner):
    """``(i, j)``: input ``i`` of pattern node ``first`` is input ``j`` of ``partner``, a named pattern variable
    (bound to one value per match), or None."""
    from onnxscript.rewriter._pattern_ir import Var
    for i, value in enumerate(first.inputs):
        if type(value) is Var and value.name is not None:
            for j, other in enumerate(partner.inputs):
                if other is value:
                    return i, j
    return None


def partner_candidates(pattern, graph, node):
    """For each pattern output node after the first, the graph nodes that can match it when ``node`` matches
    the first: consumers, in ``graph``, of the value ``node`` has at a shared variable, with the partner's op.
    None where a partner shares no variable or ``node`` has no value there (onnxscript's full search then)."""
    first, *partners = pattern.output_nodes
    found = []
    for partner in partners:
        shared = _shared_input(first, partner)
        if shared is None or shared[0] >= len(node.inputs) or node.inputs[shared[0]] is None:
            return None
        wanted, (i, j) = partner.op_identifier(), shared
        found.append(in_graph_order(graph, [
            user for user, index in node.inputs[i].uses()
            if index == j and user.graph is graph and (wanted is None or user.op_identifier() == wanted)]))
    return found


_POSITIONS = threading.local()  # this thread's rewrite pass: id(graph) -> (graph, {node: position})


def in_graph_order(graph, nodes: list) -> list:
    """``nodes`` of ``graph`` in the order the graph holds them."""
    if len(nodes) < 2:
        return nodes
    listed = getattr(_POSITIONS, "graphs", None)
    if listed is None:
        listed = _POSITIONS.graphs = {}
    known = listed.get(id(graph))
    if known is None or known[0] is not graph or any(n not in known[1] for n in nodes):
        known = listed[id(graph)] = (graph, {n: k for k, n in enumerate(graph)})
    return sorted(nodes, key=known[1].__getitem__)


def _bound(wrapped, args, kwargs):
    """The call's arguments by name, or None if this onnxscript's ``match`` takes others."""
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    names = ("graph_or_function", "node", "verbose", "remove_nodes", "tracer")
    return bound.arguments if all(n in bound.arguments for n in names) else None


def _matched_among_partners(wrapped, instance, args, kwargs):
    if wrapped.__name__ == "apply_to_model":  # a rewrite pass: the positions listed in the last one are forgotten
        _POSITIONS.graphs = {}
        try:
            return wrapped(*args, **kwargs)
        finally:
            _POSITIONS.graphs = {}
    pattern = instance.pattern
    if pattern.has_single_output_node or not all(hasattr(instance, name) for name in _INTERNALS):
        return wrapped(*args, **kwargs)
    from onnxscript.rewriter._basics import MatchResult
    call = _bound(wrapped, args, kwargs)
    if call is None:
        return wrapped(*args, **kwargs)
    if not pattern.output_nodes[0].matches(call["node"], MatchResult()):  # the op (onnxscript's first check of
        return MatchResult().fail("No match found.")                       # every pair it would try)
    import onnx_ir
    owner = call["graph_or_function"]
    graph = owner if isinstance(owner, onnx_ir.Graph) else owner.graph  # a function's nodes are in its graph
    candidates = partner_candidates(pattern, graph, call["node"])
    if candidates is None:
        return wrapped(*args, **kwargs)
    instance._tracer, instance._graph = call["tracer"], graph
    match = None
    for combination in itertools.product([call["node"]], *candidates):
        instance._init_match(call["verbose"])
        match = instance._multi_match(combination, check_removable=call["remove_nodes"])
        if match:
            return match
    return match if match is not None else MatchResult().fail("No match found.")


register(Patch(
    name=_NAME,
    description="onnxscript's rewriter matches its two-output rule (two Slices -> Split) among the tried node's "
                "consumers instead of the whole graph at every node: a cost of every dynamo export that grows with "
                "the square of the graph (1.3 s of a 12-block encoder's export, 385 s of a Mamba's)",
    targets=(_TARGET, _PASS),
    on_import=(_TARGET, _PASS),  # onnxscript's rewriter is loaded by the dynamo export
    wrapper=_matched_among_partners,
    when="always",  # the optimiser runs after the capture, still inside torch.onnx.export; installed only while patched
    aliases=False,
    library="onnxscript",
))
