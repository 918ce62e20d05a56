"""What the balances view reads from ``events.bank_account``, folded per partition.

The library's ``BankAccount`` events arrive in Tributary's untyped envelope
(``io.tributary.Event``): ``event_type`` is the event class's qualified name
(``BankAccount.TransactionAppended``), ``stream_id`` the account id, ``version`` its aggregate
version + 1, and ``data`` the event's state as the library's JSON transcoder wrote it, where
a value of a registered transcoding is ``{"_type_": …, "_data_": …}`` (a ``Decimal`` is
``{"_type_": "decimal_str", "_data_": "10.00"}``). Three entity collections:

- ``accounts``: key = the account id, fields = holder's name and email (``Opened``);
- ``transactions``: key = ``<account id>:<version>``, fields = the account id and the amount
  (``TransactionAppended``); each is its own entry, so a redelivered one is stopped by its
  position guard and never counted twice;
- ``closed``: key = the account id (``Closed``).
"""

import json
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from connectors.avro import event_parts, registry_schemas
from connectors.schema_registry.errors import RegistryUnavailableError
from projections.folding import emit, folded_batch, records_table, rejections

ACCOUNTS, TRANSACTIONS, CLOSED = "accounts", "transactions", "closed"

OPENED = "BankAccount.Opened"
TRANSACTION_APPENDED = "BankAccount.TransactionAppended"
ACCOUNT_CLOSED = "BankAccount.Closed"

Entity = tuple[str, str, dict[str, Any], int]  # collection, key, fields, position (version)


def plain(value: Any) -> Any:
    """``value`` with the library's transcoded values (``{"_type_", "_data_"}``) replaced by
    their data: ``{"_type_": "decimal_str", "_data_": "1.50"}`` -> ``"1.50"``."""
    if isinstance(value, dict):
        if len(value) == 2 and "_type_" in value and "_data_" in value:
            return plain(value["_data_"])
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def bank_entity(record: Mapping[str, Any]) -> Entity | None:
    """The entity write of one decoded event record (None: an event the view ignores)."""
    parts = event_parts(record)
    account = str(parts.meta["stream_id"])
    version = int(parts.meta["version"])
    data = plain(parts.data)
    if parts.event_type == OPENED:
        fields = {
            "account_id": account,
            "full_name": str(data["full_name"]),
            "email_address": str(data["email_address"]),
        }
        return ACCOUNTS, account, fields, version
    if parts.event_type == TRANSACTION_APPENDED:
        amount = Decimal(str(data["amount"]))
        fields = {"account_id": account, "amount": str(amount)}
        return TRANSACTIONS, f"{account}:{version}", fields, version
    if parts.event_type == ACCOUNT_CLOSED:
        return CLOSED, account, {"account_id": account}, version
    return None


def fold_bank(
    batches: Iterable[pa.RecordBatch], options: Mapping[str, str]
) -> Iterator[pa.RecordBatch]:
    """One partition's records into entity writes (``options["registry"]``: the schema
    registry's URL). A record that is not a readable event is a dead letter."""
    table = records_table(batches)
    if table.num_rows == 0:
        return
    schemas = registry_schemas(options["registry"])
    values = table.column("value").to_pylist()
    offsets = table.column("offset").to_pylist()
    newest: dict[tuple[str, str], tuple[int, dict[str, Any], int]] = {}
    reasons: dict[int, str] = {}
    for row in sorted(range(len(values)), key=offsets.__getitem__):
        value = values[row]
        if value is None:
            continue  # events are never deleted: a tombstone means nothing here
        try:
            _, record = schemas.decode(value)
            entity = bank_entity(record)
        except RegistryUnavailableError:
            raise  # the batch fails and is retried
        except Exception as exc:  # anything undecodable is a dead letter, never a stop
            reasons[row] = f"not a readable bank event: {type(exc).__name__}: {exc}"
            continue
        if entity is None:
            continue
        collection, key, fields, version = entity
        current = newest.get((collection, key))
        if current is None or version > current[0]:
            newest[(collection, key)] = (version, fields, row)
    yield from emit([_writes(table, newest), rejections(table, reasons)])


def _writes(
    table: pa.Table, newest: dict[tuple[str, str], tuple[int, dict[str, Any], int]]
) -> pa.RecordBatch | None:
    if not newest:
        return None
    items = list(newest.items())
    rows = pa.array([row for _, (_, _, row) in items], pa.int64())
    return folded_batch(
        {
            "collection": [collection for (collection, _), _ in items],
            "key": [key for (_, key), _ in items],
            "position": [version for _, (version, _, _) in items],
            "deleted": [False] * len(items),
            "fields": [json.dumps(fields) for _, (_, fields, _) in items],
            "changes": [[version] for _, (version, _, _) in items],
            "fresh": [True] * len(items),
            "topic": table.column("topic").take(rows),
            "partition": table.column("partition").take(rows),
            "offset": table.column("offset").take(rows),
        },
        len(items),
    )
