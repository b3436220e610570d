"""Service A of the notification example: the accounts service that owns the records.

Owns: its SQLite store (one table, `accounts(id, balance, version)`) and the web API
over it — `PUT /accounts/{id}` with `{"balance": N}` writes the record and publishes
"record updated" (`{"id": ..., "version": ...}`, keyed by the id) to the topic
`account-updated` through `logkit.aio.AIOProducer`; `GET /accounts/{id}` reads it.

Invariant: a PUT answers 200 only after its row is committed in SQLite AND its
notification is in the log (written first, then published: a crash between the two
leaves a record B has not heard of yet, never a notification of a record that does not
exist). The event loop never waits on SQLite: every store call runs on the store's one
thread (SQLite connections belong to the thread that made them), and the producer's
appends wake the loop through `logkit.aio`.

Run: python service_a.py DATA_DIR A.sqlite [--port 0]; it prints one JSON line
`{"service": "a", "url": ...}` once it is serving.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import signal
import sqlite3
from typing import Any

from aiohttp import web

import logkit
from logkit.aio import AIOProducer

TOPIC = "account-updated"
PARTITIONS = 2


class Store:
    """A's own database. Every call runs on one worker thread, off the event loop."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="service-a-sqlite")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        self._db = sqlite3.connect(self._path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS accounts("
                         "id TEXT PRIMARY KEY, balance INTEGER NOT NULL, "
                         "version INTEGER NOT NULL)")
        self._db.commit()

    async def update(self, account: str, balance: int) -> int:
        """Write `balance`; returns the record's new version (1 for a new record)."""
        return await self._call(self._update, account, balance)

    def _update(self, account: str, balance: int) -> int:
        assert self._db is not None
        with self._db:                              # one transaction: commit or roll back
            (version,) = self._db.execute(
                "INSERT INTO accounts(id, balance, version) VALUES (?, ?, 1) "
                "ON CONFLICT(id) DO UPDATE SET balance = excluded.balance, "
                "version = accounts.version + 1 RETURNING version",
                (account, balance)).fetchone()
        return int(version)

    async def get(self, account: str) -> dict[str, Any] | None:
        return await self._call(self._get, account)

    def _get(self, account: str) -> dict[str, Any] | None:
        assert self._db is not None
        row = self._db.execute("SELECT balance, version FROM accounts WHERE id = ?",
                               (account,)).fetchone()
        return None if row is None else {"id": account, "balance": row[0], "version": row[1]}

    async def close(self) -> None:
        if self._db is not None:
            await self._call(self._db.close)
        self._thread.shutdown(wait=True)


async def put_account(request: web.Request) -> web.Response:
    account = request.match_info["id"]
    try:
        body = await request.json()
        balance = int(body["balance"])
    except (ValueError, KeyError, TypeError):
        raise web.HTTPBadRequest(text='expected a JSON body {"balance": <integer>}') from None
    version = await request.app["store"].update(account, balance)
    note = json.dumps({"id": account, "version": version}).encode()
    await request.app["producer"].send_and_wait(TOPIC, note, key=account.encode())
    return web.json_response({"id": account, "balance": balance, "version": version})


async def get_account(request: web.Request) -> web.Response:
    record = await request.app["store"].get(request.match_info["id"])
    if record is None:
        raise web.HTTPNotFound(text="no such account")
    return web.json_response(record)


async def until_signalled() -> None:
    """Wait for SIGTERM or SIGINT: the services stop cleanly on either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(data_dir: str, db_path: str, host: str, port: int) -> None:
    # Opening the broker and creating the topic touch files: both run off the loop too.
    broker = await asyncio.to_thread(logkit.Broker, data_dir)
    await asyncio.to_thread(broker.create_topic, TOPIC, PARTITIONS, exist_ok=True)
    store = Store(db_path)
    await store.open()
    app = web.Application()
    app["store"] = store
    app.add_routes([web.put("/accounts/{id}", put_account),
                    web.get("/accounts/{id}", get_account)])
    runner = web.AppRunner(app)
    try:
        async with AIOProducer(broker, acks="all") as producer:
            app["producer"] = producer
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1]
            print(json.dumps({"service": "a", "url": f"http://{host}:{bound}"}), flush=True)
            await until_signalled()
    finally:
        await runner.cleanup()
        await store.close()
        await asyncio.to_thread(broker.close)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="the logkit broker directory")
    parser.add_argument("db", help="A's SQLite file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args()
    asyncio.run(serve(args.data_dir, args.db, args.host, args.port))


if __name__ == "__main__":
    main()
