"""`run_agent(settings, deps)`: the agent's one wiring point, with signal handling.

SIGTERM or SIGINT starts a drain (no new work, in-flight finishes within
`drain_timeout_s`, `drained`, exit 0); a second signal aborts what is left at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from apps.agent.agent import Agent
from apps.agent.deps import AgentDeps, AgentState
from apps.agent.settings import AgentSettings

log = logging.getLogger("llmfleet.agent")


async def run_agent(settings: AgentSettings, deps: AgentDeps | None = None) -> int:
    """Run the agent until it has drained; SIGTERM/SIGINT start the drain (a second one aborts)."""
    agent = Agent(settings, deps)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(sig: signal.Signals) -> None:
        if agent.state is AgentState.DRAINING:
            log.warning("second signal: aborting in-flight requests", extra={"signal": sig.name})
            agent.drain(0.0, reason=sig.name.lower())
        else:
            log.info("signal: draining", extra={"signal": sig.name})
            agent.drain(None, reason=sig.name.lower())

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await agent.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
