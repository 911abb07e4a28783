"""Start-up checks for the update-expression patches (agentq/local/moto_expressions.py).

Like agentq.local.moto_guards: each guard checks that the moto internal a patch reaches
into still has the shape the patch was written for, refuses with
`IncompatibleDependency` naming moto's version otherwise, and returns what it checked.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from agentq.errors import IncompatibleDependency
from agentq.local.moto_guards import code, parameters, refuse, source_of

EXPRESSIONS: Final = "agentq/local/moto_expressions.py"


def _refuse_expressions(problem: str) -> IncompatibleDependency:
    return refuse("moto", problem, EXPRESSIONS)


@dataclass(frozen=True)
class UpdateValidators:
    """What the clause-count patch replaces, and the rule it must count by."""

    traverser: Any  # DepthFirstTraverser: its nodes_to_be_processed
    action_count: Any  # ActionCountValidator: its verify_action_counts and traverse
    clause_types: tuple[type, ...]  # ADD, REMOVE, SET clauses, in the order moto checks
    clause_names: tuple[str, ...]
    descended_types: tuple[type, ...]  # what find_clauses descends into
    too_many: Callable[[str], Exception]


def update_validators() -> UpdateValidators:
    """moto's update-expression validators, as the patch found them."""
    from moto.dynamodb.parsing import ast_nodes as untyped_nodes
    from moto.dynamodb.parsing import validators

    ast_nodes: Any = untyped_nodes  # moto's AST module is untyped (`# type: ignore`)
    traverser: Any = getattr(ast_nodes, "DepthFirstTraverser", None)
    action_count: Any = getattr(validators, "ActionCountValidator", None)
    node = getattr(ast_nodes, "Node", None)
    if not (isinstance(traverser, type) and isinstance(action_count, type) and node):
        raise _refuse_expressions("DepthFirstTraverser, ActionCountValidator or Node is gone")
    found = UpdateValidators(
        traverser=traverser,
        action_count=action_count,
        clause_types=(
            ast_nodes.UpdateExpressionAddClause,
            ast_nodes.UpdateExpressionRemoveClause,
            ast_nodes.UpdateExpressionSetClause,
        ),
        clause_names=("ADD", "REMOVE", "SET"),
        descended_types=(ast_nodes.Expression, ast_nodes.UpdateExpressionFunction),
        too_many=validators.TooManyClauses,
    )
    if hasattr(found.traverser.nodes_to_be_processed, "built_once"):
        return found
    if "self._processing_map().keys()" not in source_of(found.traverser.nodes_to_be_processed):
        raise _refuse_expressions("DepthFirstTraverser.nodes_to_be_processed changed")
    counting = source_of(found.action_count.verify_action_counts).replace(" ", "")
    checks = [counting.find(f'raiseTooManyClauses("{name}")') for name in found.clause_names]
    if (-1 in checks or checks != sorted(checks)
            or any(f"find_clauses([{kind.__name__}])" not in counting
                   for kind in found.clause_types)):  # fmt: skip
        raise _refuse_expressions("ActionCountValidator no longer counts ADD, REMOVE, SET")
    rule = source_of(node.find_clauses)
    if not all(part in rule for part in ("type(child) in clause_types",
                                         "isinstance(child, Expression)",
                                         "isinstance(child, UpdateExpressionFunction)")):  # fmt: skip
        raise _refuse_expressions("Node.find_clauses counts by another rule")
    return found


def expression_parsers() -> tuple[Any, Any]:
    """moto's `UpdateExpressionParser` (its `make(expression_str)`, a pure parse) and
    `ConditionExpressionParser` (its `_lex_condition_expression(self)`, a pure lex of
    `self.condition_expression` into immutable nodes), whose results the patch keeps."""
    from moto.dynamodb import comparisons
    from moto.dynamodb.parsing import expressions, validators

    update: Any = getattr(expressions, "UpdateExpressionParser", None)
    condition: Any = getattr(comparisons, "ConditionExpressionParser", None)
    if update is None or condition is None:
        raise _refuse_expressions("UpdateExpressionParser or ConditionExpressionParser is gone")
    make, lex = getattr(update, "make", None), getattr(condition, "_lex_condition_expression", None)
    if make is None or lex is None:
        raise _refuse_expressions("UpdateExpressionParser.make or the condition lexer is gone")
    if not hasattr(make, "remembered"):
        if parameters(make) != ["expression_str"] or "cls(token_list).parse()" not in source_of(
            make
        ):
            raise _refuse_expressions("UpdateExpressionParser.make(expression_str) changed")
        # A kept tree is shared: only safe while every validator works on its own copy.
        if "self.node_to_validate = deepcopy(expression)" not in source_of(
            validators.Validator.__init__
        ):
            raise _refuse_expressions("Validator no longer copies the tree it validates")
    if not hasattr(lex, "remembered"):
        module = source_of(comparisons)
        if (parameters(lex) != ["self"] or "self.condition_expression" not in source_of(lex)
                or "children=[]" not in module or ".children.append(" in module):  # fmt: skip
            raise _refuse_expressions("the condition lexer no longer makes plain, unshared nodes")
    return update, condition


@dataclass(frozen=True)
class ValidationWalks:
    """What the walk, copy and overlap patches replace (agentq/local/moto_expressions.py)."""

    validators: Any  # moto.dynamodb.parsing.validators: its `deepcopy`
    deepcopy: Callable[..., Any]  # copy.deepcopy, for whatever is not a kept tree
    traverser: Any  # DepthFirstTraverser: its traverse_node_recursively and process
    node: type  # Node: what the walk descends
    overlaps: Any  # OverlappingPathsValidator: its traverse
    action_types: tuple[type, ...]  # the actions check_for_overlapping_paths compares
    holder: type  # UpdateExpression: the stand-in node holding a whole tree's actions


_COPY_HOOKS: Final = ("__deepcopy__", "__copy__", "__reduce__", "__reduce_ex__",
                      "__getstate__", "__setstate__", "__class__", "__instancecheck__")  # fmt: skip
_WALK_STEPS: Final = ("ifisinstance(node,Node):", "parent_node=node.parent",
                      "self.pre_processing_of_child(node,i)",
                      "self.traverse_node_recursively(child_node,i)",
                      "ifisinstance(node,self.nodes_to_be_processed()):",
                      "node=self.process(node)", "node.parent=parent_node",
                      "ifparent_node:", "parent_node.children[child_id]=node", "returnnode")  # fmt: skip


def validation_walks() -> ValidationWalks:
    """moto's update-expression walks, copies and overlap check, as the patches found
    them: the walk's steps, a copy made by `deepcopy` of plain node objects, and an
    overlap check that reads nothing of its node but the actions `find_clauses` gives."""
    import copy

    from moto.dynamodb.parsing import ast_nodes as untyped_nodes
    from moto.dynamodb.parsing import validators

    ast_nodes: Any = untyped_nodes  # moto's AST module is untyped (`# type: ignore`)
    node: Any = getattr(ast_nodes, "Node", None)
    traverser: Any = getattr(ast_nodes, "DepthFirstTraverser", None)
    overlaps: Any = getattr(validators, "OverlappingPathsValidator", None)
    if not (isinstance(node, type) and isinstance(traverser, type) and isinstance(overlaps, type)):
        raise _refuse_expressions("Node, DepthFirstTraverser or OverlappingPathsValidator is gone")
    found = ValidationWalks(
        validators=validators, deepcopy=copy.deepcopy, traverser=traverser, node=node,
        overlaps=overlaps, holder=ast_nodes.UpdateExpression,
        action_types=(ast_nodes.UpdateExpressionSetAction, ast_nodes.UpdateExpressionAddAction,
                      ast_nodes.UpdateExpressionRemoveAction,
                      ast_nodes.UpdateExpressionDeleteAction),
    )  # fmt: skip
    current = getattr(validators, "deepcopy", None)
    if current is not copy.deepcopy and not getattr(current, "copies_kept_trees", False):
        raise _refuse_expressions("moto's validators no longer copy with copy.deepcopy")
    nodes = [kind for kind in vars(ast_nodes).values()
             if isinstance(kind, type) and issubclass(kind, node)]  # fmt: skip
    # isinstance then depends on the class alone, and deepcopy and pickle build the same.
    if any(type(kind) not in (abc.ABCMeta, type) or any(hook in vars(kind) for hook in _COPY_HOOKS)
           for kind in nodes):  # fmt: skip
        raise _refuse_expressions("a node class customises its copies or isinstance")
    checks = [kind for kind in vars(validators).values()
              if isinstance(kind, type) and issubclass(kind, traverser) and kind is not traverser]  # fmt: skip
    if any(name in vars(kind) for kind in checks
           for name in ("traverse_node_recursively", "process", "nodes_to_be_processed")):  # fmt: skip
        raise _refuse_expressions("a check walks the tree its own way")
    walk = found.traverser.traverse_node_recursively
    if not hasattr(walk, "by_type"):
        steps = code(walk)
        if parameters(walk) != ["self", "node", "child_id"] or not all(
            step in steps for step in _WALK_STEPS
        ):
            raise _refuse_expressions("DepthFirstTraverser.traverse_node_recursively changed")
        process = code(found.traverser.process)
        if (
            "self._processing_map().items()" not in process
            or "isinstance(node,class_key)" not in process
        ):
            raise _refuse_expressions("DepthFirstTraverser.process changed")
    if not hasattr(found.overlaps.traverse, "tree_at_once"):
        check = code(found.overlaps.check_for_overlapping_paths)
        names = [kind.__name__ for kind in found.action_types]
        if (check.count("node.") != check.count("node.find_clauses(") or "returnnode" not in check
                or not all(name in check for name in names) or found.overlaps.traverse is not found.traverser.traverse):  # fmt: skip
            raise _refuse_expressions("OverlappingPathsValidator checks more than the actions")
    return found
