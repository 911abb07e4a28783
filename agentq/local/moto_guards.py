"""Start-up checks for the local moto launcher's patches (agentq/local/moto_server.py).

Each patch reaches into one of moto's internals. An upgrade of moto (or jsonpath_ng)
that renames, reshapes or stops using that internal would make the patch a silent
no-op or, worse, wrong; so before patching, each guard checks that what it patches is
still there with the shape the patch was written for, and refuses with
`IncompatibleDependency` naming the version otherwise. Each returns the things it
checked, so the patch uses exactly what was verified.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Final

from agentq.errors import IncompatibleDependency

SERVER: Final = "agentq/local/moto_server.py"
DYNAMODB: Final = "agentq/local/moto_dynamodb.py"
PARTITIONS: Final = "agentq/local/moto_partitions.py"


def refuse(package: str, problem: str, patcher: str = SERVER) -> IncompatibleDependency:
    hint = f"{patcher} patches it; update the patch or pin the version"
    return IncompatibleDependency(package, metadata.version(package), f"{problem} ({hint})")


def parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


# Cached: a function's source never changes in a process, and reading it (the whole file,
# parsed) is most of a guard's cost, which the property tests pay for every example.
@functools.cache
def source_of(function: Callable[..., Any] | ModuleType) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


@functools.cache
def code(function: Callable[..., Any]) -> str:
    """A function's source without its docstring, comments and whitespace."""
    lines = [line.split("#", 1)[0] for line in source_of(function).splitlines()]
    text = "".join("".join(line.split()) for line in lines)
    return text.replace('"""', "\x00").split("\x00")[-1] if '"""' in text else text


def dispatcher() -> type:
    """moto's DomainDispatcherApplication, whose `get_backend_for_host(host)` we memoize."""
    from moto.moto_server import werkzeug_app

    found = getattr(werkzeug_app, "DomainDispatcherApplication", None)
    lookup = getattr(found, "get_backend_for_host", None)
    if not isinstance(found, type) or lookup is None:
        raise refuse("moto", "moto.moto_server.werkzeug_app has no DomainDispatcherApplication")
    if parameters(lookup) != ["self", "host"]:
        raise refuse("moto", "DomainDispatcherApplication.get_backend_for_host(self, host) changed")
    if parameters(found)[:1] != ["create_app"]:
        raise refuse("moto", "DomainDispatcherApplication(create_app) changed")
    return found


def jsonpath_parse() -> tuple[ModuleType, Callable[..., Any]]:
    """jsonpath_ng.ext and its `parse(path)`, which moto's EventBridge calls per path."""
    import jsonpath_ng.ext

    parse = getattr(jsonpath_ng.ext, "parse", None)
    if not callable(parse) or parameters(parse)[:1] != ["path"]:
        raise refuse("jsonpath-ng", "jsonpath_ng.ext.parse(path) is gone or changed")
    return jsonpath_ng.ext, parse


def sqs_clocks() -> tuple[ModuleType, dict[str, Callable[..., float]]]:
    """moto.sqs.models and its `unix_time(dt=None)` / `unix_time_millis(dt=None)`."""
    import moto.sqs.models as sqs_models

    clocks: dict[str, Callable[..., float]] = {}
    for name in ("unix_time", "unix_time_millis"):
        clock = getattr(sqs_models, name, None)
        if not callable(clock):
            raise refuse("moto", f"moto.sqs.models no longer uses {name}")
        # Ours is a functools.partial over moto's; a second start-up finds it in place.
        original = getattr(clock, "keywords", {}).get("original", clock)
        if parameters(original) != ["dt"]:
            raise refuse("moto", f"moto.sqs.models.{name}(dt=None) changed")
        clocks[name] = clock
    return sqs_models, clocks


def response_method_names() -> ModuleType:
    """moto.core.responses, whose `method_names_from_class(clazz)` (inspect.getmembers
    over the class) `BaseResponse.call_action` calls for every request we remember."""
    from moto.core import responses

    names = getattr(responses, "method_names_from_class", None)
    call_action = getattr(getattr(responses, "BaseResponse", None), "call_action", None)
    if not callable(names) or call_action is None:
        raise refuse("moto", "moto.core.responses.method_names_from_class is gone")
    if parameters(getattr(names, "__wrapped__", names)) != ["clazz"]:
        raise refuse("moto", "method_names_from_class(clazz) changed")
    if "method_names_from_class(self.__class__)" not in source_of(call_action):
        raise refuse("moto", "BaseResponse.call_action no longer lists its class's methods")
    return responses


def sqs_retention() -> type:
    """moto's SQSBackend, whose `is_message_valid_based_on_retention_period(self,
    queue_name, message)` we replace: it must still read only the queue's retention."""
    import moto.sqs.models as sqs_models

    backend = getattr(sqs_models, "SQSBackend", None)
    check = getattr(backend, "is_message_valid_based_on_retention_period", None)
    if not isinstance(backend, type) or check is None:
        raise refuse("moto", "SQSBackend.is_message_valid_based_on_retention_period is gone")
    if hasattr(check, "reads_retention_only"):
        return backend  # ours, from an earlier start-up in this process
    if parameters(check) != ["self", "queue_name", "message"]:
        raise refuse("moto", "is_message_valid_based_on_retention_period(...) changed")
    source = source_of(check)
    if '"MessageRetentionPeriod"' not in source or "message.sent_timestamp" not in source:
        raise refuse("moto", "the retention check no longer reads MessageRetentionPeriod")
    return backend


def transaction_copies() -> tuple[ModuleType, Any, type, tuple[type[Exception], ...]]:
    """moto's DynamoDB models module (whose `copy` we replace), its backend, Table, and
    the errors after which its transaction restores its rollback copies."""
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.exceptions import (
        MockValidationException,
        MultipleTransactionsException,
        TransactionCanceledException,
    )
    from moto.dynamodb.models.table import Table

    backend = getattr(dynamodb_models, "DynamoDBBackend", None)
    write = getattr(backend, "transact_write_items", None)
    if not isinstance(backend, type) or write is None:
        raise _refuse_dynamodb("DynamoDBBackend.transact_write_items is gone")
    if parameters(write) != ["self", "transact_items"]:
        raise _refuse_dynamodb("DynamoDBBackend.transact_write_items(self, transact_items) changed")
    if not hasattr(write, "rolls_back_items"):
        # The rollback copy must still be `copy.deepcopy` looked up in that module.
        if "copy.deepcopy(" not in source_of(write):
            raise _refuse_dynamodb("transact_write_items no longer calls copy.deepcopy")
        if getattr(dynamodb_models, "copy", None) is not __import__("copy"):
            raise _refuse_dynamodb("moto.dynamodb.models no longer imports the copy module")
        # Ours puts the saved items back after exactly the errors moto rolls back for.
        source = source_of(write)
        if ("except (MultipleTransactionsException, MockValidationException)" not in source
                or "raise TransactionCanceledException(errors)" not in source):  # fmt: skip
            raise _refuse_dynamodb("transact_write_items rolls back after other errors")
    rollback_errors = (
        TransactionCanceledException,
        MultipleTransactionsException,
        MockValidationException,
    )
    return dynamodb_models, backend, Table, rollback_errors


def _refuse_dynamodb(problem: str) -> IncompatibleDependency:
    return refuse("moto", problem, DYNAMODB)


# moto's Table.query(self, hash_key, range_comparison, range_objs, limit,
# exclusive_start_key, ...): the patch reads its arguments by place or name.
QUERY_PARAMETERS: Final = ["self", "hash_key", "range_comparison", "range_objs", "limit",
                           "exclusive_start_key", "scan_index_forward", "projection_expressions",
                           "index_name", "consistent_read", "filter_expression",
                           "hash_key_conditions", "range_key_conditions"]  # fmt: skip


def partition_queries() -> Any:
    """moto's DynamoDB Table, whose base-table `query` keeps the items of
    `self.all_items()` with the queried hash key, and whose `items` maps a hash key to
    its partition."""
    from moto.dynamodb.models.table import Table

    query, all_items = getattr(Table, "query", None), getattr(Table, "all_items", None)
    if query is None or all_items is None:
        raise _refuse_partitions("Table.query or Table.all_items is gone")
    if not hasattr(query, "reads_one_partition"):
        if parameters(query)[: len(QUERY_PARAMETERS)] != QUERY_PARAMETERS:
            raise _refuse_partitions("Table.query(self, hash_key, ..., index_name) changed")
        if parameters(all_items) != ["self"] or "self.items.values()" not in source_of(all_items):
            raise _refuse_partitions("Table.all_items(self) no longer lists self.items")
        if _ALL_ITEMS_ORDER not in code(all_items):
            raise _refuse_partitions("Table.all_items sorts the table another way")
        source = source_of(query)
        if ("for item in self.all_items()" not in source
                or "item.hash_key == hash_key" not in source):  # fmt: skip
            raise _refuse_partitions("Table.query no longer filters all_items() by hash key")
    return Table


def _refuse_partitions(problem: str) -> IncompatibleDependency:
    return refuse("moto", problem, PARTITIONS)


_ALL_ITEMS_ORDER: Final = "key=lambdax:(x.hash_key,x.range_key)ifx.range_keyelsex.hash_key"
# What an index query does with the items of `self.all_items()`: keeps those whose
# attributes equal every hash key condition (the last of each name), sorts them in place
# by keys ending with the table's own, then pages them. The patch hands it a superset of
# one index partition in another order: the same items kept, sorted the same way.
_INDEX_QUERY_STEPS: Final = (
    'index_hash_keys=[keyforkeyinindex.schemaifkey["KeyType"]=="HASH"]',
    "forattr_name,valueinhash_key_conditions:all_hash_conditions[attr_name]=value",
    "foriteminself.all_items():",
    "forattr_name,expected_valueinall_hash_conditions.items():",
    "item_value=item.attrs.get(attr_name)",
    "ifnotitem_valueoritem_value!=expected_value:",
    "possible_results=self.sorted_items(hash_attrs,range_attrs,possible_results)",
)
_SORT_STEPS: Final = (
    "attrs_to_sort_by=self._generate_attr_to_sort_by(hash_key_attrs,range_key_attrs)",
    "items.sort(key=lambdax:tuple([x.attrs[key]forkeyinattrs_to_sort_by]),)",
    "returnitems",
)
# How an index query pages the sorted items: skips those that come before the start key
# (the sort's own keys, compared in the read's direction), then reads in order and stops
# at the first item past its Limit or 1 MB; nothing after the loop reads the items again.
# So a window of the sorted items starting where the skip ends gives moto's own page
# whenever moto stops inside it (moto_partitions._IndexRead).
_PAGE_STEPS: Final = (
    "ifscan_index_forwardisFalse:possible_results.reverse()",
    "processing_previous_page=exclusive_start_keyisnotNoneforresultinpossible_results:"
    "ifprocessing_previous_page:ifself._item_comes_before_dct(result,exclusive_start_key,"
    "hash_attrs,range_attrs,scan_index_forward,):continueelse:processing_previous_page=False",
    "ifreached_length_limitorreached_size_limit:last_evaluated_key="
    "self._get_last_evaluated_key(results[-1],index_name)break",
)
_COMES_BEFORE: Final = (
    "attrs_to_sort_by=self._generate_attr_to_sort_by(hash_key_attrs,range_key_attrs)"
    "forattrinattrs_to_sort_by:ifattrinitem.attrsanditem.attrs[attr]!=DynamoType(dct.get(attr)):"
    "return((item.attrs[attr]<DynamoType(dct.get(attr)))==scan_index_forward)returnTrue"
)
# What follows the page's deep copy: the items are only read (projections build new
# items from a copy of their values), so the page's own list stands in for the copy.
_PAGE_TAIL: Final = (
    "results=copy.deepcopy(results)ifindex_name:index=self.get_index(index_name)"
    "results=[index.project(r)forrinresults]iffilter_expressionisnotNone:"
    "results=[itemforiteminresultsiffilter_expression.expr(item)]"
    "ifprojection_expressions:results=[r.project(projection_expressions)forrinresults]"
    "returnresults,scanned_count,last_evaluated_key"
)
_INDEX_PROJECTS: Final = ("item=item.project([[attr]forattrinkey_attributes])",
                          "item=item.project([[attr]forattrinallowed_attributes])returnitem")  # fmt: skip
_ITEM_PROJECTS: Final = ("x=find_nested_key(expr,self.to_regular_json())",
                         "returnItem(hash_key=self.hash_key,range_key=self.range_key,"
                         'attrs=serializer.serialize(result)["M"],)')  # fmt: skip
_ITEM_SIZE: Final = (
    "defsize(self)->int:returnsum(bytesize(key)+value.size()forkey,valueinself.attrs.items())"
)
# The table's key attributes end moto's sort keys, so no two items tie.
_SORT_KEY_STEPS: Final = ("attrs_to_sort_by.append(table_hash_key)",
                          "attrs_to_sort_by.append(table_range_key)")  # fmt: skip


@dataclass(frozen=True)
class PartitionTargets:
    """What the index-partition patch wraps (agentq/local/moto_partitions.py)."""

    table: Any  # moto's Table: query, all_items, sorted_items, put_item, delete_item
    backend: Any  # moto's DynamoDBBackend: update_item (in place), get_keys_value
    dynamo_type: type  # moto's DynamoType, an item's key value
    table_module: ModuleType  # moto.dynamodb.models.table, whose `copy` a query's page uses
    item: Any  # moto's Item, whose `size()` a page asks of each item it reads


def index_partitions() -> PartitionTargets:
    """moto's Table and backend, checked to change an item's attributes only through
    `Table.put_item`, `Table.delete_item` and `DynamoDBBackend.update_item` (in place),
    and to answer an index query from `all_items()` as `_INDEX_QUERY_STEPS` says."""
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.models import table as table_module
    from moto.dynamodb.models.dynamo_type import DynamoType, Item
    from moto.dynamodb.models.table import SecondaryIndex, Table

    backend = getattr(dynamodb_models, "DynamoDBBackend", None)
    if not isinstance(backend, type):
        raise _refuse_partitions("moto.dynamodb.models.DynamoDBBackend is gone")
    found = PartitionTargets(table=Table, backend=backend, dynamo_type=DynamoType,
                             table_module=table_module, item=Item)  # fmt: skip
    if hasattr(Table.query, "reads_one_partition"):
        return found  # ours, from an earlier start-up in this process
    for owner, name, leading in (
        (Table, "sorted_items", ["self", "hash_key_attrs", "range_key_attrs", "items"]),
        (Table, "put_item", ["self", "item_attrs"]),
        (Table, "delete_item", ["self", "hash_key", "range_key"]),
        (backend, "update_item", ["self", "table_name", "key"]),
        (backend, "get_keys_value", ["self", "table", "keys"]),
    ):
        method = getattr(owner, name, None)
        if method is None or parameters(method)[: len(leading)] != leading:
            raise _refuse_partitions(f"{name}({', '.join(leading)}, ...) is gone or changed")
    query, update = code(Table.query), code(found.backend.update_item)
    if not all(step in query for step in _INDEX_QUERY_STEPS):
        raise _refuse_partitions("Table.query answers an index query another way")
    if (not all(step in query for step in _PAGE_STEPS)
            or query.count("last_evaluated_key=") != 2
            or code(Table._item_comes_before_dct) != _COMES_BEFORE):  # fmt: skip
        raise _refuse_partitions("Table.query pages an index query another way")
    if (not query.endswith(_PAGE_TAIL) or query.count("copy.") != 1
            or getattr(table_module, "copy", None) is not __import__("copy")
            or not all(step in code(SecondaryIndex.project) for step in _INDEX_PROJECTS)
            or not all(step in code(Item.project) for step in _ITEM_PROJECTS)):  # fmt: skip
        raise _refuse_partitions("Table.query copies or reads its page's items another way")
    # An item's size is its attributes' (changed in place only by update_item, above);
    # the query sizes only the items it reads (`result`).
    if (code(Item.size) != _ITEM_SIZE
            or query.count(".size()") != query.count("result.size()")):  # fmt: skip
        raise _refuse_partitions("Table.query sizes its page's items another way")
    if (not all(step in code(Table.sorted_items) for step in _SORT_STEPS)
            or not all(step in code(Table._generate_attr_to_sort_by)
                       for step in _SORT_KEY_STEPS)):  # fmt: skip
        raise _refuse_partitions("Table.sorted_items sorts another way")
    # Items change in place only in update_item; Table.items only in put/delete_item.
    from moto.dynamodb.models import table as table_module

    models = "".join((source_of(dynamodb_models) + source_of(table_module)).split())
    for change in ("UpdateExpressionExecutor(", ".update_with_attribute_updates("):
        if models.count(change) != update.count(change) or not update.count(change):
            raise _refuse_partitions(f"moto changes items in place outside update_item ({change})")
    writers = code(Table.put_item) + code(Table.delete_item) + code(Table.__init__)
    for line in source_of(Table).splitlines():
        step = "".join(line.split("#", 1)[0].split())
        if "self.items" in step and _WRITES.search(step) and step not in writers:
            raise _refuse_partitions(f"Table changes its items outside put/delete_item: {step}")
    return found


# A statement that changes `self.items` (not one that reads it).
_WRITES: Final = re.compile(r"self\.items(\[[^\]]*\])*(=[^=]|\.(pop|popitem|clear|update|setdefault)\()"
                            r"|^delself\.items")  # fmt: skip


@dataclass(frozen=True)
class AttributeValueShape:
    """What the response patch replaces (agentq/local/moto_dynamodb.py), and the names
    moto's attribute picker looks a DynamoDB value's members up by."""

    serializer: Any  # the serializer class of DynamoDB's JSON responses
    picker: Any  # the attribute picker class moto serializes responses with
    providers: Any  # its default alias providers (the list object)
    members: frozenset[str]  # AttributeValue's member names: S, N, B, ..., BOOL


_STRUCTURE_STEPS: Final = ("ifvalueisNone:return", "ifkey:wrapper:Any=self.MAP_TYPE()",
                           "formember_key,member_shapeinshape.members.items():",
                           "member_shape.parent=shape",
                           "self._serialize_structure_member(wrapper,value,member_shape,member_key)",
                           "ifkey:self._default_serialize(serialized,wrapper,shape,key)")  # fmt: skip


def attribute_value_serializer() -> AttributeValueShape:
    """moto's JSON serializer, whose structure serializer looks each of the ten members
    of every DynamoDB `AttributeValue` up through six alias providers. The patch looks up
    only the members a value holds, by their own names: checked here to be the only
    member names the picker would try for a member of a plain dict."""
    from moto.core import serialize
    from moto.core.utils import get_service_model

    serializer: Any = serialize.get_serializer_class("dynamodb", "json")
    picker: Any = getattr(serialize, "XFormedAttributePicker", None)
    providers = getattr(serialize, "DEFAULT_ALIAS_PROVIDERS", None)
    if not (isinstance(serializer, type) and isinstance(picker, type) and providers):
        raise _refuse_dynamodb("moto's JSON serializer or attribute picker is gone")
    shape: Any = get_service_model("dynamodb").shape_for("AttributeValue")
    found = AttributeValueShape(serializer=serializer, picker=picker, providers=providers,
                                members=frozenset(shape.members))  # fmt: skip
    serializer = found.serializer  # Any again (isinstance narrowed it to `type`)
    if hasattr(serializer._serialize_type_structure, "plain_values"):
        return found
    member = code(serialize.ResponseSerializer._serialize_structure_member)
    structure = code(serialize.ResponseSerializer._serialize_type_structure)
    json_structure = code(serialize.BaseJSONSerializer._serialize_type_structure)
    if ("ifshape.is_document_type:" not in json_structure
            or "super()._serialize_type_structure(serialized,value,shape,key)" not in json_structure
            or serializer._serialize_type_structure
            is not serialize.BaseJSONSerializer._serialize_type_structure
            or not all(step in structure for step in _STRUCTURE_STEPS)):  # fmt: skip
        raise _refuse_dynamodb("moto serializes a structure another way")
    if (serializer.get_value is not serialize.ResponseSerializer.get_value
            or serializer._serialize_structure_member
            is not serialize.ResponseSerializer._serialize_structure_member
            or "member_value=self.get_value(value,key,shape)" not in member
            or "ifmember_valueisnotNone:self._serialize(serialized,member_value,shape,key)"
            not in member or shape.is_document_type):  # fmt: skip
        raise _refuse_dynamodb("moto serializes a structure's members another way")
    for name, member_shape in shape.members.items():
        context = serialize.AttributePickerContext(
            obj={}, key=name, shape=member_shape, operation_model=None, service_model=None,
            key_path="",
        )  # fmt: skip
        member_shape.parent = shape  # as moto's structure serializer sets it
        names = [key for key in picker().get_possible_keys(context) if key in found.members]
        if set(names) != {name}:
            raise _refuse_dynamodb(f"moto looks AttributeValue.{name} up by {names}")
    return found
