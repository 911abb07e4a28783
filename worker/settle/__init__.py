"""Running one received task and settling its attempt.

`handler` takes a message from receipt to settlement; `prepare` and `refusals` decide
whether it runs; `outcome` reads what the child left; `settler` decides what that means
for the task and its message; `artifacts` and `scrub` store its outputs, scrubbed;
`outbox` publishes the terminal event before the message is deleted.
"""
