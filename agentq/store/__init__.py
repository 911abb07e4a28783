"""DynamoDB persistence: task STATE items (the lock), events, query patterns."""

from agentq.store.events import EventStore, event_item
from agentq.store.tasks import Lease, TaskRecord, TaskStore

__all__ = ["EventStore", "Lease", "TaskRecord", "TaskStore", "event_item"]
