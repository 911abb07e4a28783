"""The worker's receive layer: from `ReceiveMessage` to a slot, or back to SQS.

`receivers` runs the receive loop and the watched tiers' long polls (`tiers` picks the
tier, worker.scheduler is its policy); `consumer` places each message; `placement`
holds the slots and the buffer in front of them; `tenant_gate` and `parking` hold a
limited tenant's messages until a seat is free; `send_back` is the one way a message
that will not run here goes back to SQS.
"""
