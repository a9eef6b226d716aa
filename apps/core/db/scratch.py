"""A throwaway database on a PostgreSQL server: created empty, dropped (forced) afterwards.
For tests and benchmarks, which must never touch a database they did not create."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` on the same server."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@contextmanager
def scratch_database(admin_url: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
