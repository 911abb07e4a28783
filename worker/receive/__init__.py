"""The worker's receive layer: from `ReceiveMessage` to a slot, or back to SQS.

`receivers` runs the receive loop and the watched tiers' long polls (`tiers` picks the
tier, worker.scheduler is its policy); `consumer` places each message; `placement`
holds the slots, the buffer in front of them, the gate and parking (the seat waits of
worker.parking, which the lock's preparation parks through, under its lock);
`tenant_gate` is the gate's pool; `send_back` is the one way a message that will not
run here goes back to SQS.
"""
