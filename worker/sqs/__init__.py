"""SQS batching: the worker's deletes, visibility changes and sends in batches of ten.

`batcher` gathers calls into batches, `batchloop` flushes them, `eventbatch` batches
EventBridge puts the same way, and `copies` marks a requeued copy of a message.
"""
