"""moto's update-expression checks, made to cost what the expression costs.

Every UpdateItem (and each Update of a transaction) parses its update expression, copies
the tree, and runs ten checks over the copy, each a walk of the whole tree; a new item
is checked twice. The lock's 18-action SET is a tree of about 150 nodes, so a lock held
the local DynamoDB (one request at a time) for about 12 ms, most of it here. What is done
instead, each giving exactly moto's answer:

- **Each clause counted once.** moto checks "one SET / ADD / REMOVE clause" at every
  node by walking that node's whole subtree again; the counts are summed once, bottom-up.
- **Each text parsed once.** A parsed update expression is kept by its text (each check
  works on its own copy of the tree), and a condition expression's tokens by its text.
- **A kept tree copied from a template.** moto deep-copies the tree for every check
  (1.2 ms for the lock's); a kept tree is pickled once and each copy unpickled (0.1 ms),
  which builds the same objects `copy.deepcopy` does (the guard checks no node class
  customises copying or pickling).
- **The walks decide by type once.** Each walk asked `isinstance` of an abstract class
  twice per node and rebuilt the check's table of node types per node; whether a type is
  a node, and whether a check handles it, is kept per type.
- **Overlapping paths checked once.** moto checks, at every node, that no two actions
  below it name overlapping or equal paths. Each node's actions are some of the tree's,
  and a set without an overlap has no subset with one: when the tree's actions pass
  together, no node can fail and the walk is skipped; when they do not, moto's walk runs
  and raises what it raises.

Each target is checked first (agentq.local.moto_expression_guards); the tests in
tests/local/test_moto_guards.py, test_moto_parses.py and test_moto_expressions.py show
moto answers the same with and without the patches.
"""

from __future__ import annotations

import functools
import pickle
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from agentq.local import moto_expression_guards

# Distinct expressions kept: agentq sends about twenty; a sender of more still gets
# every answer right, the oldest kept parse making room.
_KEPT_PARSES: Final = 256


def checked_expression_patches() -> Callable[[], None]:
    """Check every target (`IncompatibleDependency` if one moved); return what patches."""
    counts = moto_expression_guards.update_validators()
    parsers = moto_expression_guards.expression_parsers()
    walks = moto_expression_guards.validation_walks()

    def patch() -> None:
        if not hasattr(counts.traverser.nodes_to_be_processed, "built_once"):
            _count_clauses_once(counts)
        _remember_parses(*parsers, walks)
        if not hasattr(walks.traverser.traverse_node_recursively, "by_type"):
            _walk_by_type(walks)
        if not hasattr(walks.overlaps.traverse, "tree_at_once"):
            _check_overlaps_once(walks)

    return patch


# -- clause counts: each node's from its children's ------------------------------------


def _count_clauses_once(found: moto_expression_guards.UpdateValidators) -> None:
    """moto's `ActionCountValidator` runs at every `UpdateExpression` node bottom-up and
    counts the SET / ADD / REMOVE clauses below it with `Node.find_clauses`, which walks
    the node's subtree each time. Here each node's counts are its children's counts
    summed, by `find_clauses`' own rule (a child of a counted type counts one and is not
    descended; an `Expression` or `UpdateExpressionFunction` child is descended), so
    every node raises exactly what it raised before, in the same order."""
    kinds = found.clause_types  # in the order moto checks them: ADD, REMOVE, SET
    descend = found.descended_types
    traverse = found.action_count.traverse

    def counts(memo: dict[int, tuple[Any, list[int]]], node: Any) -> list[int]:
        hit = memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        totals = [0] * len(kinds)
        for child in node.children or []:
            below = counts(memo, child) if isinstance(child, descend) else None
            for i, kind in enumerate(kinds):
                if type(child) is kind:
                    totals[i] += 1
                elif below is not None:
                    totals[i] += below[i]
        memo[id(node)] = (node, totals)  # the node is kept, so its id is not reused
        return totals

    def verify_action_counts(self: Any, node: Any) -> Any:
        memo = self.__dict__.get("_agentq_counts")
        totals = counts({} if memo is None else memo, node)
        for name, count in zip(found.clause_names, totals, strict=True):
            if count > 1:
                raise found.too_many(name)
        return node

    @functools.wraps(traverse)
    def counting_traverse(self: Any, node: Any) -> Any:
        self._agentq_counts = {}  # one tree's counts: a reused validator starts afresh
        try:
            return traverse(self, node)
        finally:
            del self._agentq_counts

    def nodes_to_be_processed(self: Any) -> tuple[type, ...]:
        # moto rebuilds the processor's dict (bound methods and all) at every node; its
        # keys are the same for the processor's life.
        try:
            return self.__dict__["_agentq_types"]  # type: ignore[no-any-return]
        except KeyError:
            types = self.__dict__["_agentq_types"] = tuple(self._processing_map().keys())
            return types

    nodes_to_be_processed.built_once = True  # type: ignore[attr-defined]
    found.action_count.verify_action_counts = verify_action_counts
    found.action_count.traverse = counting_traverse
    found.traverser.nodes_to_be_processed = nodes_to_be_processed


# -- expressions: each text parsed once, each kept tree copied from a template ---------


class _Templates:
    """The kept trees' pickles, by tree: it stands in for `deepcopy` in moto's validators
    module, and copies a kept tree by unpickling its template. Anything else
    (a tree being checked, a value) is deep-copied as before: only a kept tree is known
    never to change."""

    copies_kept_trees: Final = True  # what moto_expression_guards knows it by

    def __init__(self, deepcopy: Callable[..., Any]) -> None:
        self._deepcopy = deepcopy
        self._pickles: dict[int, tuple[Any, bytes]] = {}

    def keep(self, tree: Any) -> None:
        try:
            pickled = pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a tree pickle cannot take is copied by deepcopy, as before
            return
        if len(self._pickles) >= _KEPT_PARSES:
            self._pickles.pop(next(iter(self._pickles)))
        self._pickles[id(tree)] = (tree, pickled)  # the tree is held: its id stays its own

    def __call__(self, value: Any, memo: Any = None) -> Any:
        found = self._pickles.get(id(value)) if memo is None else None
        if found is not None and found[0] is value:
            return pickle.loads(found[1])
        return self._deepcopy(value, memo)


def _remember_parses(update_parser: Any, condition_parser: Any,
                     walks: moto_expression_guards.ValidationWalks) -> None:  # fmt: skip
    """Keep `UpdateExpressionParser.make`'s tree and the condition lexer's tokens by
    their text (moto_expression_guards.expression_parsers checks why sharing them is
    safe), and each kept tree's template. A text that fails to parse is not kept: it fails the same way
    each time. Idempotent."""
    if not hasattr(update_parser.make, "remembered"):
        make = update_parser.make
        templates = _Templates(walks.deepcopy)

        @functools.lru_cache(maxsize=_KEPT_PARSES)
        def kept(expression_str: str) -> Any:
            tree = make(expression_str)
            templates.keep(tree)
            return tree

        def make_once(cls: Any, expression_str: Any) -> Any:
            if cls is not update_parser or not isinstance(expression_str, str):
                return make.__func__(cls, expression_str)
            return kept(expression_str)

        make_once.remembered = True  # type: ignore[attr-defined]
        update_parser.make = classmethod(make_once)
        walks.validators.deepcopy = templates
    if not hasattr(condition_parser._lex_condition_expression, "remembered"):
        lex = condition_parser._lex_condition_expression
        tokens: dict[str, tuple[Any, ...]] = {}

        @functools.wraps(lex)
        def lex_once(parser: Any) -> deque[Any]:
            text = parser.condition_expression
            found = tokens.get(text)
            if found is None:
                found = tuple(lex(parser))
                if len(tokens) >= _KEPT_PARSES:
                    tokens.pop(next(iter(tokens)))
                tokens[text] = found
            return deque(found)  # the parse consumes the deque, never the nodes

        lex_once.remembered = True  # type: ignore[attr-defined]
        condition_parser._lex_condition_expression = lex_once


# -- the checks' walks: type questions answered once per type --------------------------


def _walk_by_type(walks: moto_expression_guards.ValidationWalks) -> None:
    """moto's `DepthFirstTraverser.traverse_node_recursively`, step for step (children
    first, the pre-child hook before each, the node processed if the check handles its
    type, then put in its parent's place), with `isinstance(node, Node)` and
    `isinstance(node, self.nodes_to_be_processed())` kept per type: neither depends on
    anything but the node's class (the guard checks nothing overrides `__class__` or
    `__instancecheck__`), and `process` reads the check's table built once."""
    node_type = walks.node
    is_node: dict[type, bool] = {}

    def traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
        kind = type(node)
        node_like = is_node.get(kind)
        if node_like is None:
            node_like = is_node[kind] = isinstance(node, node_type)
        if node_like:
            parent_node = node.parent
            if node.children is not None:
                for i, child_node in enumerate(node.children):
                    self.pre_processing_of_child(node, i)
                    self.traverse_node_recursively(child_node, i)
            handled = self.__dict__.get("_agentq_handled")
            if handled is None:
                handled = self.__dict__["_agentq_handled"] = {}
            processed = handled.get(kind)
            if processed is None:
                processed = handled[kind] = isinstance(node, self.nodes_to_be_processed())
            if processed:
                node = self.process(node)
                node.parent = parent_node
                if parent_node:
                    parent_node.children[child_id] = node
        return node

    def process(self: Any, node: Any) -> Any:
        table = self.__dict__.get("_agentq_table")
        if table is None:
            table = self.__dict__["_agentq_table"] = tuple(self._processing_map().items())
        for class_key, processor in table:
            if isinstance(node, class_key):
                return processor(node)
        return None

    traverse_node_recursively.by_type = True  # type: ignore[attr-defined]
    walks.traverser.traverse_node_recursively = traverse_node_recursively
    walks.traverser.process = process


# -- overlapping paths: the tree's actions checked together first ----------------------


def _check_overlaps_once(walks: moto_expression_guards.ValidationWalks) -> None:
    """`OverlappingPathsValidator.traverse` checks the whole tree's actions as one set
    first (a stand-in node holding every action anywhere in the tree, as often as it
    appears); only if that check raises does moto's walk run, so a failing expression
    fails at the node and with the paths moto names."""
    traverse = walks.overlaps.traverse
    actions, node_type = walks.action_types, walks.node
    holder_type: Any = walks.holder

    def every_action(node: Any, found: list[Any]) -> list[Any]:
        if type(node) in actions:
            found.append(node)
        if isinstance(node, node_type):
            for child in getattr(node, "children", None) or []:
                every_action(child, found)
        return found

    @functools.wraps(traverse)
    def traverse_tree_at_once(self: Any, node: Any) -> Any:
        holder: Any = holder_type.__new__(holder_type)  # no __init__: it must not adopt them
        holder.children = every_action(node, [])
        try:
            self.check_for_overlapping_paths(holder)
        except Exception:
            return traverse(self, node)
        return node

    traverse_tree_at_once.tree_at_once = True  # type: ignore[attr-defined]
    walks.overlaps.traverse = traverse_tree_at_once
