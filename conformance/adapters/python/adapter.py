"""The Python client's conformance adapter: commands as JSON lines on stdin,
answers as JSON lines on stdout (conformance/README.md), each command run
as its own asyncio task over one AsyncClient, so a waiting acquire never
holds up the next command. Imports the client from this repository's
source tree. Connects to LEASEHOLD_ENDPOINT as LEASEHOLD_HOLDER."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from typing import Any, Dict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "clients", "python", "src"))

import leasehold  # noqa: E402
from leasehold import errors  # noqa: E402


def now_ms() -> int:
    return int(time.time() * 1000)


def coded(e: BaseException) -> Dict[str, Any]:
    if isinstance(e, errors.LeaseholdError):
        return {"code": e.code, "message": str(e), "details": dict(e.details)}
    return {"code": "other", "message": f"{type(e).__name__}: {e}", "details": {}}


class Adapter:
    def __init__(self, client: leasehold.AsyncClient) -> None:
        self.client = client
        self.leases: Dict[str, Any] = {}
        self.leaderships: Dict[str, Any] = {}
        self.waits: Dict[str, asyncio.Task] = {}
        self.streams: Dict[str, asyncio.Queue] = {}

    async def command(self, op: str, args: Dict[str, Any], handle: str) -> Any:
        c = self.client
        if op == "acquire":
            return await self.acquire(args, handle)
        if op == "cancel":
            task = self.waits.get(args["handle"])
            if task is not None:
                task.cancel()
            return {}
        if op == "token":
            lease = self.leases[args["handle"]]
            at = now_ms()
            try:
                return {"live": True, "fence": lease.token(), "at_ms": at}
            except errors.LeaseLost as e:
                return {"live": False, "reason": str(e), "at_ms": at}
        if op == "wait_lost":
            lease = self.leases[args["handle"]]
            try:
                await asyncio.wait_for(lease.lost.wait(), args.get("within_ms", 10000) / 1000)
                return {"lost": True, "reason": lease.lost_reason}
            except asyncio.TimeoutError:
                return {"lost": False}
        if op == "release":
            await self.leases[args["handle"]].release()
            return {}
        if op == "save_checkpoint":
            await self.leases[args["handle"]].save_checkpoint(args["data"])
            return {}
        if op == "release_by_fence":
            await c.release_by_fence(args["key"], args["fence"])
            return {}
        if op == "campaign":
            lead = await c.election(args["election"]).campaign(args["value"], args.get("ttl_ms", 15000) / 1000)
            self.leaderships[handle] = lead
            return {"fence": lead.token()}
        if op == "proclaim":
            await self.leaderships[args["handle"]].proclaim(args["value"])
            return {}
        if op == "resign":
            await self.leaderships[args["handle"]].resign()
            return {}
        if op == "observe":
            queue: asyncio.Queue = asyncio.Queue()
            self.streams[handle] = queue

            async def observing() -> None:
                try:
                    async for leader in c.election(args["election"]).observe():
                        shown = None if leader is None else {"value": leader.value, "fence": leader.fence, "holder": leader.holder}
                        await queue.put(("ok", shown))
                except Exception as e:  # the stream's end, told to whoever reads it
                    await queue.put(("error", coded(e)))

            asyncio.get_running_loop().create_task(observing())
            return {}
        if op == "next_leader":
            return {"leader": await self.next(args["handle"], args)}
        if op == "watch":
            queue = asyncio.Queue()
            self.streams[handle] = queue

            async def watching() -> None:
                try:
                    async for e in c.watch(args["prefix"]):
                        await queue.put(("ok", {"kind": e.kind, "key": e.key, "fence": e.fence, "index": e.index, "seq": e.seq}))
                except Exception as e:  # the stream's end, told to whoever reads it
                    await queue.put(("error", coded(e)))

            asyncio.get_running_loop().create_task(watching())
            return {}
        if op == "next_events":
            events = [await self.next(args["handle"], args) for _ in range(args.get("count", 1))]
            return {"events": events}
        if op == "churn":
            for i in range(args.get("count", 1)):
                lease = await c.try_lock(f"{args['prefix']}{i}", args.get("ttl_ms", 5000) / 1000)
                await lease.release()
            return {}
        raise KeyError(f"no op {op!r}")

    async def acquire(self, args: Dict[str, Any], handle: str) -> Any:
        c = self.client
        ttl = args.get("ttl_ms", 15000) / 1000
        wait = args.get("wait_ms", 0) / 1000 or None
        lock_delay = args.get("lock_delay_ms", 0) / 1000
        shared = args.get("mode") == "shared"
        permits = args.get("permits")
        if "keys" in args:
            taking = c.lock_set(args["keys"], ttl, wait=wait)
        elif wait is None:
            taking = c.try_lock(args["key"], ttl, lock_delay=lock_delay, shared=shared, permits=permits)
        else:
            taking = c.lock(args["key"], ttl, wait=wait, lock_delay=lock_delay, shared=shared, permits=permits)
        task = asyncio.ensure_future(taking)
        self.waits[handle] = task
        try:
            lease = await task
        except asyncio.CancelledError:
            raise Cancelled() from None
        finally:
            self.waits.pop(handle, None)
        self.leases[handle] = lease
        answer: Dict[str, Any] = {"fence": lease.fence, "lease": lease.lease_id}
        if lease.checkpoint is not None:
            answer["checkpoint"] = lease.checkpoint.decode("utf-8", errors="replace")
            answer["checkpoint_base64"] = base64.b64encode(lease.checkpoint).decode()
        return answer

    async def next(self, handle: str, args: Dict[str, Any]) -> Any:
        try:
            kind, item = await asyncio.wait_for(self.streams[handle].get(), args.get("within_ms", 10000) / 1000)
        except asyncio.TimeoutError:
            raise NoChange() from None
        if kind == "error":
            raise StreamError(item)
        return item


class Cancelled(Exception):
    pass


class NoChange(Exception):
    pass


class StreamError(Exception):
    def __init__(self, error: Dict[str, Any]) -> None:
        super().__init__(error["message"])
        self.error = error


async def main() -> None:
    client = leasehold.AsyncClient()
    adapter = Adapter(client)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def answer(line: Dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()

    async def run(cmd: Dict[str, Any]) -> None:
        try:
            ok = await adapter.command(cmd["op"], cmd.get("args") or {}, cmd.get("as") or "")
            answer({"id": cmd["id"], "ok": ok})
        except Cancelled:
            answer({"id": cmd["id"], "error": {"code": "cancelled", "message": "the wait was given up", "details": {}}})
        except NoChange:
            answer({"id": cmd["id"], "error": {"code": "no_change", "message": "nothing in time", "details": {}}})
        except StreamError as e:
            answer({"id": cmd["id"], "error": e.error})
        except Exception as e:  # every failure is an answer
            answer({"id": cmd["id"], "error": coded(e)})

    tasks = set()
    while True:
        line = await reader.readline()
        if not line:
            break
        task = loop.create_task(run(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


if __name__ == "__main__":
    asyncio.run(main())
