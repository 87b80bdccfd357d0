"""INC's op names mapped back to the exported graph (pure; tested without INC)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, node) -> "Node":
        return cls(node.name, node.op_type, tuple(node.input), tuple(node.output))


def map_names(inc_ops: Sequence[str], inc_nodes: Sequence[Node], exported: Sequence[Node],
              initializers: set[str], wanted: Sequence[str] | None = None) -> tuple[dict[str, tuple[str, str]], dict]:
    """Map INC's op names back to the exported graph.

    ``inc_ops``: names INC scored; ``inc_nodes``: INC's (pre-optimized) graph; ``exported``: the
    exported graph's nodes; ``initializers``: the exported graph's initializer names; ``wanted``:
    the exported nodes that may be targets (default: all). Returns ``(mapping, unmapped)`` with
    ``mapping[inc_name] = (exported_name, how)``, ``how`` in ``name | weight | output | prefix``,
    and ``unmapped[inc_name] = reason``. Two INC ops never map to the same exported node.
    """
    by_name = {n.name: n for n in inc_nodes}
    targets = [n for n in exported if wanted is None or n.name in set(wanted)]
    target_names = {n.name for n in targets}
    weight_owner: dict[str, list[str]] = {}
    output_owner: dict[str, str] = {}
    for n in targets:
        for i in n.inputs[1:]:
            if i in initializers:
                weight_owner.setdefault(i, []).append(n.name)
        for o in n.outputs:
            output_owner[o] = n.name

    def candidates(name: str) -> tuple[str | None, str]:
        if name in target_names:
            return name, "name"
        node = by_name.get(name)
        if node is None:
            return None, "not in INC's graph"
        owners = {o for i in node.inputs if i in weight_owner for o in weight_owner[i]}
        if len(owners) == 1:
            return owners.pop(), "weight"
        if len(owners) > 1:
            return None, f"weight shared by {sorted(owners)}"
        for o in node.outputs:
            for cand in (o, o.rsplit("_", 1)[0]):  # INC's Gemm split renames the output "<out>_MatMul"
                if cand in output_owner:
                    return output_owner[cand], "output"
        pref = [t for t in target_names if name.startswith(t + "_")]
        if pref:  # the longest one: ".../MatMul_1_x" is MatMul_1's, not MatMul's
            return max(pref, key=len), "prefix"
        return None, "no exported node with its name, weight or output"

    mapping: dict[str, tuple[str, str]] = {}
    unmapped: dict[str, str] = {}
    claimed: dict[str, str] = {}
    for name in inc_ops:
        target, how = candidates(name)
        if target is None:
            unmapped[name] = how
        elif target in claimed:
            unmapped[name] = f"{target} already mapped from {claimed[target]}"
        else:
            claimed[target] = name
            mapping[name] = (target, how)
    return mapping, unmapped
