"""enginesim: a simulated vLLM OpenAI-compatible server with a real continuous-batching scheduler.

Entry points: `apps.enginesim.server.start_enginesim(settings) -> RunningEngine` (in-process) and
`llmfleet enginesim` (process). See `server.py`.
"""
