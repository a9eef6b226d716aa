"""Node registry shared by the orchestrator (registrations, heartbeats) and the gateway admin API.

`store.NodeStore` owns node tokens and the `nodes` table; `state` the node states and their
transitions; `keys` the Redis key and channel names every replica and the gateway agree on.
"""
