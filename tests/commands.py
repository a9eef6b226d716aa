"""`llmfleet ...` as a platform engineer types it, from an async test: the command runs its own event
loop, so it runs in a thread; its exit code, stdout and stderr come back."""

from __future__ import annotations

import asyncio
import contextlib
import io

from apps.cli.main import main


async def llmfleet(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(args))

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()
