"""Service B of the notification example: keeps a copy of A's accounts, over HTTP only.

Owns: its own SQLite copy (`copies(id, balance, version)`), a consumer instance of the
group `service-b` on logkit's REST proxy (Confluent's v2 consumer API), and a web API
showing the copy (`GET /copies/{id}`, `GET /copies`; `GET /stats` counts the
notifications fetched and handled and shows the offsets committed). B never opens the
broker directory: it hears of updates from the proxy and reads A's record from A's
`GET /accounts/{id}`, so B could be written in any language.

The loop: `GET .../records` (binary embedded format: keys and values base64), for each
notification read A's current record and keep it when its version is newer than the
copy's, then `POST .../offsets` with the last record handled per partition (Confluent's
rule: the proxy stores offset + 1 as the group's committed offset).

Invariant (at-least-once, idempotent): an offset is committed only after every record
up to it is applied to the copy and committed in SQLite; applying a notification twice
changes nothing (the copy keeps the highest version). So a B killed at any point and
restarted resumes from the group's committed offsets and loses no update. For the same
reason a failed call (A down, the proxy down) is retried on the batch B holds, never by
fetching the next one, and an instance the proxy lost (40403) is created again.

On start B deletes a consumer instance left under its name by a previous run (a killed B
cannot delete its own), then creates it: its partitions come back at once rather than
after the proxy's idle timeout.

Run: python service_b.py REST_URL A_URL B.sqlite [--port 0]; it prints one JSON line
`{"service": "b", "url": ...}` once it is serving.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import json
import signal
import sqlite3
import sys
from typing import Any

import aiohttp
from aiohttp import web

TOPIC = "account-updated"
GROUP = "service-b"
V2 = "application/vnd.kafka.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
POLL_TIMEOUT_MS = 500
RETRY_S = 0.2                        # back-off after a failed call to the proxy or to A


class Copies:
    """B's own database. Every call runs on one worker thread, off the event loop."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="service-b-sqlite")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        self._db = sqlite3.connect(self._path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS copies("
                         "id TEXT PRIMARY KEY, balance INTEGER NOT NULL, "
                         "version INTEGER NOT NULL)")
        self._db.commit()

    async def version(self, account: str) -> int:
        return await self._call(self._version, account)

    def _version(self, account: str) -> int:
        assert self._db is not None
        row = self._db.execute("SELECT version FROM copies WHERE id = ?",
                               (account,)).fetchone()
        return 0 if row is None else int(row[0])

    async def keep(self, record: dict[str, Any]) -> None:
        """Store A's record unless the copy already has this version or a newer one."""
        await self._call(self._keep, record)

    def _keep(self, record: dict[str, Any]) -> None:
        assert self._db is not None
        with self._db:
            self._db.execute(
                "INSERT INTO copies(id, balance, version) VALUES (:id, :balance, :version) "
                "ON CONFLICT(id) DO UPDATE SET balance = excluded.balance, "
                "version = excluded.version WHERE excluded.version > copies.version",
                record)

    async def all(self) -> dict[str, dict[str, Any]]:
        return await self._call(self._all)

    def _all(self) -> dict[str, dict[str, Any]]:
        assert self._db is not None
        rows = self._db.execute("SELECT id, balance, version FROM copies ORDER BY id")
        return {i: {"id": i, "balance": b, "version": v} for i, b, v in rows}

    async def close(self) -> None:
        if self._db is not None:
            await self._call(self._db.close)
        self._thread.shutdown(wait=True)


class ProxyError(Exception):
    """The REST proxy answered with an error body ({"error_code", "message"})."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"REST proxy answered {status}: {body}")
        self.status = status


class Syncer:
    """The consumer side: one v2 consumer instance, the records loop, the commits."""

    def __init__(self, http: aiohttp.ClientSession, rest_url: str, a_url: str,
                 copies: Copies, instance: str) -> None:
        self.http, self.a_url, self.copies = http, a_url.rstrip("/"), copies
        self.group_url = f"{rest_url.rstrip('/')}/consumers/{GROUP}"
        self.instance = instance
        self.instance_url = f"{self.group_url}/instances/{instance}"
        self.fetched = 0                                    # notifications received
        self.processed = 0                                  # notifications handled
        self.committed: dict[int, int] = {}                 # partition -> last handled
        self._pending: list[dict[str, Any]] = []            # fetched, not yet applied
        self._handled: dict[int, int] = {}                  # applied, not yet committed

    async def _call(self, method: str, url: str, body: Any = None,
                    accept: str = V2) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Accept": accept, "Content-Type": V2}
        async with self.http.request(method, url, data=data, headers=headers) as reply:
            text = await reply.text()
            if reply.status >= 300:
                raise ProxyError(reply.status, text)
            return json.loads(text) if text else None

    async def join(self) -> None:
        """Replace any instance a killed B left under this name, then subscribe."""
        try:
            await self._call("DELETE", self.instance_url)
        except ProxyError as e:
            if e.status != 404:                             # 40403: none was left
                raise
        await self._call("POST", self.group_url, {
            "name": self.instance, "format": "binary",
            "auto.offset.reset": "earliest", "auto.commit.enable": "false"})
        await self._call("POST", f"{self.instance_url}/subscription", {"topics": [TOPIC]})

    async def leave(self) -> None:
        await self._call("DELETE", self.instance_url)

    async def run(self) -> None:
        """Fetch, apply, commit, forever. A failed call is retried after a pause, on the
        same batch: fetching again would move past records not yet applied, and the next
        commit would skip them. An instance the proxy no longer knows (40403: deleted, or
        expired after consumer.instance.timeout.ms) is created again, and its records
        come again from the group's committed offsets."""
        while True:
            try:
                if not self._pending and not self._handled:
                    self._pending = await self._call(
                        "GET", f"{self.instance_url}/records?timeout={POLL_TIMEOUT_MS}",
                        accept=BINARY_V2)
                    self.fetched += len(self._pending)
                await self._apply()
            except ProxyError as e:
                if e.status != 404:
                    await self._pause(e)
                    continue
                print(f"service b: {e}; joining the group again", file=sys.stderr,
                      flush=True)
                self._pending, self._handled = [], {}
                await self._retry(self.join)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                await self._pause(e)

    async def _apply(self) -> None:
        """Apply the pending records in order, then commit the last one per partition."""
        while self._pending:
            record = self._pending[0]
            note = json.loads(base64.b64decode(record["value"]))
            if await self.copies.version(note["id"]) < note["version"]:
                await self.copies.keep(await self._read_a(note["id"]))
            self._pending.pop(0)
            self._handled[record["partition"]] = record["offset"]
            self.processed += 1
        if self._handled:
            await self._call("POST", f"{self.instance_url}/offsets", {"offsets": [
                {"topic": TOPIC, "partition": p, "offset": o}
                for p, o in self._handled.items()]})
            self.committed.update(self._handled)
            self._handled = {}

    async def _pause(self, error: Exception) -> None:
        print(f"service b: {error!r}; retrying", file=sys.stderr, flush=True)
        await asyncio.sleep(RETRY_S)                 # a back-off, then the same call again

    async def _retry(self, call: Any) -> None:
        while True:
            try:
                return await call()
            except (aiohttp.ClientError, asyncio.TimeoutError, ProxyError) as e:
                await self._pause(e)

    async def _read_a(self, account: str) -> dict[str, Any]:
        async with self.http.get(f"{self.a_url}/accounts/{account}") as reply:
            reply.raise_for_status()
            return await reply.json()


async def get_copy(request: web.Request) -> web.Response:
    copies = await request.app["copies"].all()
    if request.match_info["id"] not in copies:
        raise web.HTTPNotFound(text="no copy of that account")
    return web.json_response(copies[request.match_info["id"]])


async def get_copies(request: web.Request) -> web.Response:
    return web.json_response(await request.app["copies"].all())


async def get_stats(request: web.Request) -> web.Response:
    syncer = request.app["syncer"]
    return web.json_response({"fetched": syncer.fetched, "processed": syncer.processed,
                              "committed": {str(p): o for p, o in syncer.committed.items()}})


async def until_signalled() -> None:
    """Wait for SIGTERM or SIGINT: the services stop cleanly on either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(rest_url: str, a_url: str, db_path: str, host: str, port: int,
                instance: str) -> None:
    copies = Copies(db_path)
    await copies.open()
    app = web.Application()
    app["copies"] = copies
    app.add_routes([web.get("/copies/{id}", get_copy), web.get("/copies", get_copies),
                    web.get("/stats", get_stats)])
    runner = web.AppRunner(app)
    async with aiohttp.ClientSession() as http:
        syncer = app["syncer"] = Syncer(http, rest_url, a_url, copies, instance)
        await syncer.join()
        loop_task = asyncio.create_task(syncer.run())
        try:
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1]
            print(json.dumps({"service": "b", "url": f"http://{host}:{bound}"}), flush=True)
            await until_signalled()
        finally:
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
            await runner.cleanup()
            await syncer.leave()
            await copies.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rest_url", help="logkit's REST proxy, e.g. http://127.0.0.1:8082")
    parser.add_argument("a_url", help="service A, e.g. http://127.0.0.1:8080")
    parser.add_argument("db", help="B's SQLite file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--instance", default="service-b-1",
                        help="the consumer instance's name in the group service-b")
    args = parser.parse_args()
    asyncio.run(serve(args.rest_url, args.a_url, args.db, args.host, args.port,
                      args.instance))


if __name__ == "__main__":
    main()
