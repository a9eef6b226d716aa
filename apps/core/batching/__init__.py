"""Continuous batching as vLLM V1 does it, in simulated time: one code for enginesim and `llmfleet simulate`.

`profile` owns an engine's KV-block budget, batch limits and step-time model (sized by
`apps.core.sizing`); `scheduler` plans engine steps over that budget. Both are pure: the caller
owns time (enginesim's asyncio loop scales it to the wall clock, the simulator's event queue
advances it directly).
"""
