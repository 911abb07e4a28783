"""moto's DynamoDB Query reading the partition it asks for, not the whole table.

moto's `Table.query` walks `Table.all_items()`, every item of the table sorted, to keep
one partition. While a query runs, `all_items()` here gives only that partition's items:
a base-table query's from moto's own map (`Table.items`); an index query's from a map of
each index's key values to the items holding them, kept per table and filed anew for
every item a write names (put, update, delete, in a transaction or not, and the items
the index lag rule swaps in), in the order moto's last sort of that partition left
them. moto then checks, sorts, pages, filters and projects as before: the answer is its
own. What moto kept of an index partition, sorted, is kept until it changes: a page
then gets only its window of it, from its start key on (bisected), widened while moto
reads to its end. Targets are checked first (moto_guards.partition_queries, ...).
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

from agentq.local import moto_guards

Key = tuple[Any, Any]  # an item's place in moto's Table.items: (hash key, range key or None)
Ident = tuple[Any, Any]  # the same, in the hashable form of `_filed_value` (cheap to hash)
_ODD: Final = object()  # filed under no value: one with no hashable form (a set, list or map)
_query = threading.local()  # .fetch: what all_items() gives the running query; .learn


def checked_partition_patches() -> Callable[[], None]:
    """Check every target (`IncompatibleDependency` if one moved), and return what
    patches them (idempotent)."""
    table_type = moto_guards.partition_queries()
    targets = moto_guards.index_partitions()

    def patch() -> None:
        if not hasattr(table_type.query, "reads_one_partition"):
            _patch(targets)

    return patch


def item_replaced(table: Any, key: Key) -> None:
    """Say that `table.items` holds another item (or none) at `key`, put there without
    moto's writes (as the index lag rule does): the index partitions file it anew."""
    filed = _filed.get(table)
    if filed is not None:
        filed.touched[_ident(key)] = key


# -- one table's index partitions ------------------------------------------------------


class _Partitions:
    """One index's partitions: each key value -> the items holding it (by key), in the
    order moto last sorted them (new ones last), and the items with an odd value (always
    handed to moto, which compares them itself)."""

    def __init__(self, attr: str, items: Iterator[tuple[Ident, Any]]) -> None:
        self.attr = attr
        self.buckets: dict[Any, dict[Ident, Any]] = {}
        self.odd: dict[Ident, Any] = {}
        self.value_of: dict[Ident, Any] = {}
        self.sorted: dict[Any, _Sorted] = {}  # partition -> what moto kept, sorted
        for key, item in items:
            self.file(key, item)

    def file(self, key: Ident, item: Any) -> None:
        """File the item at `key` under its value now (nowhere if none, or no value)."""
        value = item.attrs.get(self.attr) if item is not None else None
        filed = _filed_value(value) if value is not None else None
        old = self.value_of.get(key)
        self._changed(old)
        self._changed(filed)
        if old is not None and filed is not None and (old is filed or old == filed):
            # The same partition: the item (maybe a new one) keeps its place in the order.
            (self.odd if filed is _ODD else self.buckets[filed])[key] = item
            return
        if old is _ODD:
            del self.odd[key]
        elif old is not None:
            bucket = self.buckets[old]
            del bucket[key]
            if not bucket:
                del self.buckets[old]
        if filed is None:
            self.value_of.pop(key, None)
            return
        self.value_of[key] = filed
        if filed is _ODD:
            self.odd[key] = item
        else:
            self.buckets.setdefault(filed, {})[key] = item

    def _changed(self, filed: Any) -> None:
        """A partition's sorted answer is out of date (an odd item: every one may be)."""
        if filed is _ODD:
            self.sorted.clear()
        elif filed is not None:
            self.sorted.pop(filed, None)

    def items(self, filed: Any) -> list[Any]:
        return [*self.buckets.get(filed, {}).values(), *self.odd.values()]

    def learn(self, filed: Any, items: list[Any], kept: _Sorted | None) -> None:
        """Keep what moto kept of the partition, sorted, until the partition changes; and
        the partition in the order moto sorted it, so its next sort finds it so."""
        if kept is not None:
            self.sorted[filed] = kept
        bucket = self.buckets.get(filed)
        if not bucket:
            return
        key_of = {id(item): key for key, item in bucket.items()}
        order = {key_of[id(item)]: item for item in items if id(item) in key_of}
        if len(order) < len(bucket):
            order.update(bucket)  # the ones moto left out (no range key): kept, last
        self.buckets[filed] = order


class _TableFiling:
    """A table's items filed by each queried index's hash key, and the keys written
    since they were last filed."""

    def __init__(self, table: Any) -> None:
        self.items = table.items
        self.indexes: dict[str, _Partitions] = {}
        self.touched: dict[Ident, Key] = {}
        self.everything = False  # a write whose key is unknown: file every item anew

    def _forget(self, table: Any) -> None:
        self.items, self.indexes, self.everything = table.items, {}, False
        self.touched.clear()

    def partition(self, table: Any, index: str, attr: str, filed: Any) -> list[Any]:
        """The items of the table whose `attr` may hold `filed`, moto's last order first."""
        if self.everything or table.items is not self.items:
            self._forget(table)  # moto replaced the table's items (a restore): all anew
        for ident, key in self.touched.items():
            item = _item(table, key)
            for filing in self.indexes.values():
                filing.file(ident, item)
        self.touched.clear()
        partitions = self.indexes.get(index)
        if partitions is None or partitions.attr != attr:
            partitions = self.indexes[index] = _Partitions(attr, _every_item(table))
        return partitions.items(filed)


_filed: weakref.WeakKeyDictionary[Any, _TableFiling] = weakref.WeakKeyDictionary()


def _filed_value(value: Any) -> Any:
    """A key value's hashable form, equal exactly when moto's DynamoType are equal
    (type and cast value), or _ODD."""
    try:
        filed = (value.type, value.cast_value)
        hash(filed)
    except Exception:  # unhashable or unreadable: moto compares it itself
        return _ODD
    return filed


def _item(table: Any, key: Key) -> Any:
    """The item at `key` now, or None."""
    hash_key, range_key = key
    found = table.items.get(hash_key)  # .get: a defaultdict must not grow here
    if isinstance(found, dict):  # a table with a range key: range key -> item
        return found.get(range_key) if range_key is not None else None
    return found if range_key is None else None


def _every_item(table: Any) -> Iterator[tuple[Ident, Any]]:
    for hash_key, found in list(table.items.items()):
        if isinstance(found, dict):
            for range_key, item in list(found.items()):
                yield _ident((hash_key, range_key)), item
        else:
            yield _ident((hash_key, None)), found


def _ident(key: Key) -> Ident:
    hash_key, range_key = key
    return _filed_value(hash_key), None if range_key is None else _filed_value(range_key)


def _touched(table: Any, key: Callable[[], Key]) -> None:
    filed = _filed.get(table)
    if filed is None:
        return
    try:
        found = key()
        filed.touched[_ident(found)] = found
    except Exception:  # moto refused the write's key: file every item anew
        filed.everything = True


# -- the patch -------------------------------------------------------------------------


def _patch(targets: moto_guards.PartitionTargets) -> None:
    _filed.clear()  # what an earlier patch filed may be out of date
    table_type, backend, dynamo_type = targets.table, targets.backend, targets.dynamo_type
    query, all_items, sorted_items = table_type.query, table_type.all_items, table_type.sorted_items
    put_item, delete_item, update_item = (
        table_type.put_item, table_type.delete_item, backend.update_item
    )  # fmt: skip

    @functools.wraps(all_items)
    def partition_items(table: Any) -> Any:
        fetch = getattr(_query, "fetch", None)  # never None while a query runs
        if fetch is None:
            return all_items(table)
        _query.fetch = None  # the query's one call; anything after it sees the table
        return fetch(table)

    @functools.wraps(sorted_items)
    def learning_sort(table: Any, hash_attrs: Any, range_attrs: Any, items: Any) -> Any:
        result = sorted_items(table, hash_attrs, range_attrs, items)
        learn = getattr(_query, "learn", None)
        if learn is not None:
            _query.learn = None
            learn(result, hash_attrs, range_attrs)
        return result

    @functools.wraps(query)
    def partition_query(table: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = _argument(args, kwargs, "index_name")
        if index_name:
            read = _index_query(table, index_name, _argument(args, kwargs, "hash_key_conditions"),
                                _argument(args, kwargs, "range_key_conditions"))  # fmt: skip
            if read is None:
                return query(table, hash_key, *args, **kwargs)
            return read.answer(functools.partial(query, table, hash_key, *args, **kwargs),
                               start=_argument(args, kwargs, "exclusive_start_key"),
                               forward=_argument(args, kwargs, "scan_index_forward") is not False,
                               limit=_argument(args, kwargs, "limit"))  # fmt: skip
        if hash_key is None:
            return query(table, hash_key, *args, **kwargs)
        _query.fetch = functools.partial(_base_partition, key=hash_key)
        try:
            return query(table, hash_key, *args, **kwargs)
        finally:
            _query.fetch = _query.learn = None

    @functools.wraps(put_item)
    def filed_put(table: Any, item_attrs: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return put_item(table, item_attrs, *args, **kwargs)
        finally:
            _touched(table, lambda: _attrs_key(table, item_attrs, dynamo_type))

    @functools.wraps(delete_item)
    def filed_delete(table: Any, hash_key: Any, range_key: Any, *args: Any, **kw: Any) -> Any:
        try:
            return delete_item(table, hash_key, range_key, *args, **kw)
        finally:
            _touched(table, lambda: (hash_key, range_key if table.range_key_attr else None))

    @functools.wraps(update_item)
    def filed_update(db: Any, table_name: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return update_item(db, table_name, key, *args, **kwargs)
        finally:
            # moto updates the item in place: its index values may have changed.
            table = db.tables.get(table_name) if isinstance(table_name, str) else None
            if table is not None:
                _touched(table, lambda: db.get_keys_value(table, key))

    targets.table_module.copy = _PageCopies()  # type: ignore[attr-defined]
    targets.item.size = _kept_sizes(targets.item.size)
    partition_query.reads_one_partition = True  # type: ignore[attr-defined]
    table_type.all_items = partition_items
    table_type.sorted_items = learning_sort
    table_type.query = partition_query
    table_type.put_item = filed_put
    table_type.delete_item = filed_delete
    backend.update_item = filed_update


def _kept_sizes(item_size: Callable[[Any], int]) -> Callable[[Any], int]:
    """moto's Item.size, remembered while an index query runs (`_query.sizes`)."""

    @functools.wraps(item_size)
    def kept_size(item: Any) -> int:
        sizes: dict[int, int] | None = getattr(_query, "sizes", None)  # while one runs
        if sizes is None:
            return item_size(item)
        found = sizes.get(id(item))
        if found is None:
            found = sizes[id(item)] = item_size(item)
        return found

    return kept_size


def _base_partition(table: Any, key: Any) -> list[Any]:
    """moto's base-table query is `[i for i in self.all_items() if i.hash_key == key]`,
    then sorted by range key: the partition, sorted as all_items() sorts the table."""
    found = table.items.get(key)  # .get: a defaultdict must not grow here
    if found is None:
        return []
    items = list(found.values()) if table.range_key_attr else [found]
    return sorted(items, key=lambda x: (x.hash_key, x.range_key) if x.range_key else x.hash_key)


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """An argument of moto's Table.query (after `hash_key`), passed by place or name."""
    place = moto_guards.QUERY_PARAMETERS.index(name) - 2
    return args[place] if len(args) > place else kwargs.get(name)


def _index_query(
    table: Any, index_name: str, conditions: Any, range_conditions: Any
) -> _IndexRead | None:
    """How an index query reads its partition; None when moto is left to answer as it
    does (an unknown index, no hash key condition)."""
    index = {i.name: i for i in table.all_indexes()}.get(index_name)
    hashes = [k["AttributeName"] for k in getattr(index, "schema", None) or []
              if k.get("KeyType") == "HASH"]  # fmt: skip
    if not hashes or not isinstance(conditions, list):
        return None
    # moto keeps the last condition of each name (a dict built from the list).
    values = [value for name, value in conditions if name == hashes[0]]
    filed = _filed_value(values[-1]) if values else _ODD
    if filed is _ODD:
        return None
    filing = _filed.get(table)
    if filing is None:
        filing = _filed[table] = _TableFiling(table)
    # What moto keeps of the partition is then the same for every query of it: items
    # with this one hash key value and the index's range key (no other equalities).
    plain = len(hashes) == 1 and {name for name, _ in conditions} == {hashes[0]} and (
        not range_conditions or len(range_conditions) == 1)  # fmt: skip
    return _IndexRead(filing, index_name, hashes[0], filed, plain=plain)


class _Sorted:
    """What moto kept of one index partition, in its sort order (ascending), and the key
    attributes it sorted by."""

    def __init__(self, items: list[Any], hash_attrs: Any, range_attrs: Any) -> None:
        self.items, self.hash_attrs, self.range_attrs = items, hash_attrs, range_attrs
        # Each item's size, by id: the items are held here and unchanged while this is.
        self.sizes: dict[int, int] = {}

    def window(
        self, table: Any, start: Any, forward: bool, width: int
    ) -> tuple[list[Any], bool] | None:
        """The `width` items a page reads first, ascending (moto reverses them for a
        backward read), and whether more follow; None if moto must see them all.

        moto skips every item that comes before `start` in the read's direction (its
        `_item_comes_before_dct`, which compares the sort's own keys): in the sorted
        partition those lead, so a bisection with the same test finds where they end."""
        items, n = self.items, len(self.items)
        first = 0
        if start is not None:
            low, high = 0, n
            try:
                while low < high:
                    middle = (low + high) // 2
                    item = items[middle] if forward else items[n - 1 - middle]
                    if table._item_comes_before_dct(
                        item, start, self.hash_attrs, self.range_attrs, forward
                    ):
                        low = middle + 1
                    else:
                        high = middle
            except Exception:  # a start key moto refuses: moto says so itself
                return None
            first = low
        last = min(n, first + width)
        found = items[first:last] if forward else items[n - last : n - first]
        return found, last < n


class _IndexRead:
    """One index query's read of its partition. The first read of a partition hands
    moto all of it and keeps what moto kept, sorted; until the partition changes, a read
    then hands moto only the window its page can reach (from its start key on), and
    widens it while moto's page reads to the window's end."""

    def __init__(self, filing: _TableFiling, index: str, attr: str, filed: Any, *, plain: bool):
        self.filing, self.index, self.attr, self.filed, self.plain = (
            filing, index, attr, filed, plain
        )  # fmt: skip
        self.start: Any = None
        self.forward = True
        self.width = 0  # 0: the whole partition
        self.windowed = self.cut = False

    def answer(self, query: Callable[[], Any], *, start: Any, forward: bool, limit: Any) -> Any:
        """moto's answer to the query. moto reads a page's items in order and stops at
        the first it cannot take (its Limit or 1 MB): when it stops inside the window,
        the items past it could not have changed the page."""
        self.start, self.forward = start, forward
        self.width = min(limit + 1, _WIDTH) if isinstance(limit, int) and limit > 0 else _WIDTH
        while True:
            _query.fetch, _query.learn, _query.page = self.fetch, self.learn, True
            try:
                found = query()
            finally:
                _query.fetch = _query.learn = _query.sizes = None
                _query.page = False
            if not (self.windowed and self.cut) or found[2] is not None:
                return found
            self.width *= 4

    def fetch(self, table: Any) -> list[Any]:
        """What all_items() gives the query: the partition, or the window of it."""
        items = self.filing.partition(table, self.index, self.attr, self.filed)
        self.windowed = self.cut = False
        partitions = self.filing.indexes[self.index]
        order = partitions.sorted.get(self.filed) if self.plain else None
        window = order.window(table, self.start, self.forward, self.width) if order else None
        # moto sizes each item it reads twice: once a query, or once while the partition
        # stays as it is (the items it reads are the query's, alive until it ends).
        _query.sizes = {} if window is None or order is None else order.sizes
        if window is None:
            return items
        self.windowed = True
        found, self.cut = window
        return found

    def learn(self, items: list[Any], hash_attrs: Any, range_attrs: Any) -> None:
        partitions = self.filing.indexes.get(self.index)
        if partitions is None or self.windowed:
            return
        # A copy: moto reverses its list in place for a backward read.
        order = _Sorted(list(items), hash_attrs, range_attrs) if self.plain else None
        partitions.learn(self.filed, items, order)


class _PageCopies:
    """The `copy` module as moto's table module sees it: an index query's page of items
    is read, never changed, after moto's deep copy of it (moto_guards._PAGE_TAIL), and
    the server writes its answer before the next DynamoDB request runs: the page's own
    list stands in for the copy."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        if getattr(_query, "page", False) and isinstance(value, list):
            _query.page = False
            return list(value)
        return copy.deepcopy(value, memo)


_WIDTH: Final = 4_096  # a first window: a 1 MB page of items of 250 bytes or more


def _attrs_key(table: Any, attrs: Any, dynamo_type: type) -> Key:
    hash_key = dynamo_type(attrs[table.hash_key_attr])
    range_attr = table.range_key_attr
    return hash_key, dynamo_type(attrs[range_attr]) if range_attr else None
