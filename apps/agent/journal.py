"""The agent's local journal of finished requests whose `done` is not yet acknowledged.

Format: an append-only file of JSON lines, each `{"op": "done", "frame": {...}}` or
`{"op": "ack", "request_id": "..."}`. A `done` line is fsynced before the frame is sent,
so a crash right after cannot lose usage. An `ack` line is not written on its own: it rides
along with the next `done` write (or the compaction, or `close`), so acknowledging never waits
for the disk; losing it in a crash only causes one more replay, and the ledger settle is
idempotent on `request_id`. Writes are group-committed: one fsync covers every line queued
while the previous write was in progress.

On open the file is replayed into the set of pending dones (a torn last line from a
crash is ignored). When the file holds more than `compact_lines` lines it is rewritten
with only the pending dones (write to a temp file, fsync, rename, fsync the directory).
File writes run in a worker thread so the event loop never blocks on the disk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from pydantic import ValidationError

from apps.core.protocol.node import Done, encode

log = logging.getLogger("llmfleet.agent.journal")


class Journal:
    def __init__(self, path: Path, compact_lines: int = 1000) -> None:
        self._path = path
        self._compact_lines = compact_lines
        self._pending: dict[str, Done] = {}
        self._lines = 0
        self._lock = asyncio.Lock()
        self._file: int | None = None
        self._buffer: list[str] = []  # done lines waiting for the next write
        self._acks: list[str] = []  # ack lines waiting for the next write (never fsynced alone)
        self._seq = 0  # lines handed to _append so far
        self._flushed = 0  # lines written and fsynced so far

    @property
    def path(self) -> Path:
        return self._path

    async def open(self) -> None:
        await asyncio.to_thread(self._open_sync)

    async def close(self) -> None:
        async with self._lock:
            if self._file is not None:
                if self._acks:
                    lines, self._acks = self._acks, []
                    await asyncio.to_thread(self._append_sync, lines)
                fd, self._file = self._file, None
                await asyncio.to_thread(os.close, fd)

    def pending(self) -> list[Done]:
        """Unacknowledged dones, oldest first."""
        return list(self._pending.values())

    def is_pending(self, request_id: str) -> bool:
        return request_id in self._pending

    async def record_done(self, done: Done) -> None:
        """Durably record a finished request (returns after the fsync)."""
        line = json.dumps({"op": "done", "frame": json.loads(encode(done))}, separators=(",", ":"))
        await self._append(line)
        self._pending[done.request_id] = done

    async def ack(self, request_id: str) -> bool:
        """Forget a done; returns False for an unknown id (a duplicate ack)."""
        if self._pending.pop(request_id, None) is None:
            return False
        self._acks.append(json.dumps({"op": "ack", "request_id": request_id}, separators=(",", ":")))
        lines = self._lines + len(self._acks)
        if lines > self._compact_lines and lines > 2 * len(self._pending):
            async with self._lock:
                covered = len(self._acks)  # acks arriving during the rewrite still get written
                await asyncio.to_thread(self._compact_sync, list(self._pending.values()))
                del self._acks[:covered]  # the rewritten file holds only what was still pending
        return True

    async def _append(self, line: str) -> None:
        """Group commit: lines queued while a write is in progress go out together, with
        one fsync, so many requests finishing at once cost one disk flush, not one each."""
        self._seq += 1
        mine = self._seq
        self._buffer.append(line)
        async with self._lock:
            if self._flushed >= mine:
                return  # written by the batch of an earlier caller
            lines, self._buffer, self._acks = self._acks + self._buffer, [], []
            upto = self._seq
            await asyncio.to_thread(self._append_sync, lines)
            self._flushed = upto
            self._lines += len(lines)

    # -- blocking parts, run in a thread ------------------------------------------------

    def _open_sync(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        pending: dict[str, Done] = {}
        lines = 0
        complete = 0  # bytes up to the end of the last whole line
        if self._path.exists():
            with self._path.open("rb") as f:
                for raw in f:
                    if not raw.endswith(b"\n"):
                        break  # torn tail of a crash mid-write: never fsynced, never sent
                    lines += 1
                    complete += len(raw)
                    self._apply_line(raw, pending)
            if self._path.stat().st_size > complete:
                # Cut the torn tail, or the next append would be glued to it.
                log.warning("journal: dropping a torn last line")
                os.truncate(self._path, complete)
        self._pending = pending
        self._lines = lines
        self._file = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if lines > self._compact_lines and lines > 2 * len(pending):
            self._compact_sync(list(pending.values()))
        log.info("journal opened", extra={"path": str(self._path), "pending": len(pending), "lines": lines})

    @staticmethod
    def _apply_line(raw: bytes, pending: dict[str, Done]) -> None:
        try:
            entry = json.loads(raw)
            if entry["op"] == "done":
                done = Done.model_validate(entry["frame"])
                pending[done.request_id] = done
            elif entry["op"] == "ack":
                pending.pop(str(entry["request_id"]), None)
        except (ValueError, KeyError, TypeError, ValidationError):
            # Written by something else or corrupted on disk: skip it rather than refuse to start.
            log.warning("journal: skipping an unreadable line")

    def _append_sync(self, lines: list[str]) -> None:
        if self._file is None:
            raise RuntimeError("journal is not open")
        os.write(self._file, "".join(line + "\n" for line in lines).encode())
        os.fsync(self._file)

    def _compact_sync(self, pending: list[Done]) -> None:
        tmp = self._path.with_name(self._path.name + ".tmp")
        body = "".join(
            json.dumps({"op": "done", "frame": json.loads(encode(d))}, separators=(",", ":")) + "\n"
            for d in pending
        )
        with tmp.open("w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        dir_fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        if self._file is not None:
            os.close(self._file)
        self._file = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lines = len(pending)
