"""Sizing: KV-cache, GPU, replica, cost and queue arithmetic as pure functions (docs/architecture.md D8).

`kv` owns memory arithmetic (an embedding encoder's: `embed`), `fleet` replica/cost/queue
arithmetic, `plan` turns a stack spec into the capacity plan shared by the planner CLI and the
Pulumi program.
"""
