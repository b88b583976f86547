"""The Python client against a real leaseholdd."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import leasehold
from leasehold import fence


def test_exclusion_under_contention_with_a_fenced_counter(server):
    gate = leasehold.FenceGate()
    counter = {"value": 0}
    inside = []
    overlaps = []
    tokens = []

    def worker(n: int) -> None:
        client = leasehold.Client(server.url, holder=f"w{n}")
        for _ in range(10):
            with client.lock("counter", ttl=5, wait=30) as lease:
                if inside:
                    overlaps.append((n, list(inside)))
                inside.append(n)
                value = counter["value"]
                time.sleep(0.002)
                gate.admit("counter", lease.token())
                counter["value"] = value + 1
                tokens.append(lease.token())
                inside.remove(n)
        client.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert counter["value"] == 60
    assert len(set(tokens)) == 60
    assert tokens == sorted(tokens), "tokens must increase in grant order"


def test_contention_names_the_holder_and_errors_are_typed(server):
    a = leasehold.Client(server.url, holder="a")
    b = leasehold.Client(server.url, holder="b")
    with a.try_lock("nightly", ttl=5) as held:
        with pytest.raises(leasehold.Held) as e:
            b.try_lock("nightly", ttl=5)
        assert e.value.holder == "a"
        assert e.value.fence == held.token()
        assert e.value.code == "held"
        with pytest.raises(leasehold.WaitTimeout):
            b.lock("nightly", ttl=5, wait=0.3)
        held.save_checkpoint(b"row 17")
    with b.try_lock("nightly", ttl=5) as next_holder:
        assert next_holder.checkpoint == b"row 17"
        assert next_holder.token() > held.fence
    with pytest.raises(leasehold.InvalidArgument):
        a.try_lock("", ttl=5)
    with pytest.raises(leasehold.InvalidArgument):
        a.try_lock("k", ttl=0.001)
    # Nothing was left behind by the refusals: no holder, no lease.
    assert all(lock["holders"] == [] for lock in a.locks(""))
    assert a._call("GET", "/v1/leases", None)["leases"] == []


def test_a_lease_outlives_its_ttl_while_renewed_and_release_frees_the_key(server):
    client = leasehold.Client(server.url)
    lease = client.try_lock("long", ttl=0.6)
    time.sleep(2.0)
    assert lease.is_live()
    assert client.describe("long")["holder"]["fence"] == lease.token()
    lease.release()
    assert lease.lost.is_set()
    with pytest.raises(leasehold.LeaseLost):
        lease.token()
    assert client.locks("") == []


def test_a_wait_longer_than_the_ttl_keeps_its_place(server):
    a = leasehold.Client(server.url, holder="a")
    b = leasehold.Client(server.url, holder="b")
    first = a.try_lock("queue", ttl=5)
    got = {}

    def wait() -> None:
        got["lease"] = b.lock("queue", ttl=0.5, wait=10)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(1.5)  # three of the waiter's TTLs
    first.release()
    t.join()
    assert got["lease"].token() > first.fence
    got["lease"].release()


HOLDER = r"""
import sys, time, leasehold
client = leasehold.Client(sys.argv[1], holder="frozen")
lease = client.try_lock("job", ttl=1)
out = open(sys.argv[2], "a", buffering=1)
while True:
    try:
        token = lease.token()
    except leasehold.LeaseLost as e:
        out.write(f"lost {time.monotonic()}\n")
        break
    out.write(f"ok {token} {time.monotonic()}\n")
    time.sleep(0.05)
"""


def test_a_holder_frozen_past_its_ttl_loses_its_token(server, tmp_path: Path):
    log = tmp_path / "holder.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, server.url, str(log)], env=env)
    try:
        until = time.monotonic() + 10
        while not (log.exists() and log.read_text().startswith("ok")):
            assert time.monotonic() < until, "the holder never took the lock"
            time.sleep(0.05)
        os.kill(holder.pid, signal.SIGSTOP)
        other = leasehold.Client(server.url, holder="other")
        taken = other.lock("job", ttl=5, wait=10)
        taken_at = time.monotonic()
        os.kill(holder.pid, signal.SIGCONT)
        assert holder.wait(timeout=10) == 0
    finally:
        holder.kill()
    lines = log.read_text().split("\n")
    lines = [l.split() for l in lines if l]
    assert lines[-1][0] == "lost", lines[-3:]
    writes = [l for l in lines if l[0] == "ok"]
    assert all(float(l[2]) < taken_at for l in writes), "a write passed token() after the key moved on"
    assert taken.token() > int(writes[-1][1])
    taken.release()


def test_a_semaphore_never_admits_more_than_n(server):
    inside = [0]
    most = [0]
    lock = threading.Lock()
    tokens = []

    def worker(n: int) -> None:
        client = leasehold.Client(server.url, holder=f"s{n}")
        for _ in range(4):
            with client.semaphore("api", permits=3, ttl=5, wait=30) as permit:
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    tokens.append(permit.token())
                time.sleep(0.03)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 3
    assert len(set(tokens)) == 32


def test_semaphore_sizes_and_readers(server):
    client = leasehold.Client(server.url)
    one = client.semaphore("pool", permits=2, wait=None)
    with pytest.raises(leasehold.InvalidArgument) as e:
        client.semaphore("pool", permits=3, wait=None)
    assert "2 permits" in str(e.value)
    with pytest.raises(leasehold.InvalidArgument):
        client.semaphore("pool", permits=0)
    view = client.describe("pool")
    assert view["permits"] == 2 and len(view["holders"]) == 1
    one.release()

    r1 = client.try_lock("doc", shared=True)
    r2 = client.try_lock("doc", shared=True)
    with pytest.raises(leasehold.Held):
        client.try_lock("doc")
    r1.release()
    r2.release()
    with client.try_lock("doc") as writer:
        with pytest.raises(leasehold.Held):
            client.try_lock("doc", shared=True)
        assert writer.is_live()


def test_the_async_client(server):
    async def main() -> None:
        async with leasehold.AsyncClient(server.url, holder="a") as a, leasehold.AsyncClient(
            server.url, holder="b"
        ) as b:
            lease = await a.lock("async", ttl=0.6)
            async with lease:
                with pytest.raises(leasehold.Held):
                    await b.try_lock("async", ttl=5)
                await asyncio.sleep(1.5)
                assert lease.is_live()
                waiter = asyncio.ensure_future(b.lock("async", ttl=5, wait=10))
                await asyncio.sleep(0.2)
                first = lease.token()
            second = await waiter
            assert second.token() > first
            await second.release()
            pair = await b.lock_set(["y", "x"], ttl=5, wait=None)
            with pytest.raises(leasehold.Held):
                await a.try_lock("x", ttl=5)
            await pair.release()
            sem = [await b.semaphore("asem", permits=2, wait=None) for _ in range(2)]
            with pytest.raises(leasehold.Held):
                await b.semaphore("asem", permits=2, wait=None)
            for s in sem:
                await s.release()

    asyncio.run(main())


def test_fenced_sql_refuses_an_older_token():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence INTEGER)")
    db.execute("INSERT INTO accounts VALUES (1, 100, 0)")
    cur = db.cursor()
    # sqlite3 says its placeholder is `?` (paramstyle "qmark"): no argument needed.
    assert fence.fenced_update(cur, "accounts", {"balance": 90}, {"id": 1}, 7) == 1
    assert fence.fenced_update(cur, "accounts", {"balance": 80}, {"id": 1}, 7, placeholder="?") == 1
    with pytest.raises(leasehold.StaleFence):
        fence.fenced_update(cur, "accounts", {"balance": 0}, {"id": 1}, 6)
    assert db.execute("SELECT balance, fence FROM accounts").fetchone() == (80, 7)
    with pytest.raises(ValueError):
        fence.fenced_update(cur, "accounts; DROP TABLE accounts", {"balance": 1}, {"id": 1}, 8)
    assert fence.fence_clause() == "fence <= %s"


def test_several_endpoints_move_past_a_dead_one(server):
    from conftest import free_port

    dead = f"127.0.0.1:{free_port()}"
    client = leasehold.Client(f"http://{dead},{server.addr}")
    with client.try_lock("k", ttl=2) as lease:
        assert lease.is_live()


def test_election_observe_sees_every_change(server):
    watcher = leasehold.Client(server.url, holder="watcher")
    election = watcher.election("scheduler")
    seen = []
    first_seen = threading.Event()

    def observe() -> None:
        for leader in election.observe():
            seen.append(leader.value if leader else None)
            first_seen.set()
            if len(seen) == 6:
                return

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    assert first_seen.wait(10)

    a = leasehold.Client(server.url, holder="a")
    b = leasehold.Client(server.url, holder="b")
    lead_a = a.election("scheduler").campaign("a:1", ttl=5)
    got = {}
    waiting = threading.Thread(target=lambda: got.update(b=b.election("scheduler").campaign("b:1", ttl=5)))
    waiting.start()
    lead_a.proclaim("a:2")
    assert election.leader().value == "a:2"
    token_a = lead_a.token()
    lead_a.resign()
    waiting.join(10)
    lead_b = got["b"]
    assert lead_b.token() > token_a
    lead_b.resign()
    observer.join(10)
    assert seen == [None, "a:1", "a:2", None, "b:1", None]
    assert election.leader() is None


def test_a_hold_released_by_its_token_elsewhere_is_lost_at_the_next_renewal(server):
    holder = leasehold.Client(server.url, holder="holder")
    operator = leasehold.Client(server.url, holder="operator")
    lone = holder.try_lock("elsewhere/lone", ttl=0.6)
    whole = holder.lock_set(["elsewhere/a", "elsewhere/b"], ttl=0.6, wait=None)
    operator.release_by_fence("elsewhere/lone", lone.fence)
    operator.release_by_fence("elsewhere/b", whole.fence)
    assert lone.lost.wait(5) and whole.lost.wait(5)
    assert "released by its token elsewhere" in lone.lost_reason
    with pytest.raises(leasehold.LeaseLost):
        whole.token()
    with pytest.raises(leasehold.LeaseLost):
        lone.release()


def test_lock_sets_are_all_or_nothing(server):
    a = leasehold.Client(server.url, holder="a")
    b = leasehold.Client(server.url, holder="b")
    y = a.try_lock("y", ttl=5)
    with pytest.raises(leasehold.Held):
        b.lock_set(["x", "y"], ttl=5, wait=None)
    assert a.describe("x")["holder"] is None
    got = {}
    waiter = threading.Thread(target=lambda: got.update(s=b.lock_set(["y", "x"], ttl=5, wait=10)))
    waiter.start()
    time.sleep(0.2)
    y.release()
    waiter.join(10)
    held = got["s"]
    token = held.token()
    assert a.describe("x")["holder"]["fence"] == token == a.describe("y")["holder"]["fence"]
    held.release()
    assert a.describe("x")["holder"] is None and a.describe("y")["holder"] is None


def test_a_cluster_client_follows_the_leader_through_a_kill(cluster):
    client = leasehold.Client(cluster.url, holder="py")
    first = client.try_lock("k", ttl=3)
    token = first.token()
    first.release()
    leader = cluster.leader()
    cluster.kill(leader)
    # The next lock goes to the new leader, wherever the client was pointing.
    with client.lock("k", ttl=3, wait=10) as again:
        assert again.token() > token


def _wait_for(what, ready, within=20.0):
    until = time.monotonic() + within
    while not ready():
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_watch_and_an_observer_go_on_across_a_kill_of_their_node(cluster):
    """Both stream from a follower, the first endpoint they are given; it is
    killed while a writer takes and releases keys and the election changes
    hands. Every event arrives once, in order (the same list, position by
    position, as a watch from the start on a node never killed), and the
    observer sees every leader."""
    leader = cluster.leader()
    order = [n for n in (1, 2, 3) if n != leader] + [leader]
    follower_first = ",".join(cluster.addrs[n] for n in order)
    watcher = leasehold.Client(follower_first)
    seen = []
    threading.Thread(target=lambda: [seen.append(e) for e in watcher.watch("w/")], daemon=True).start()
    observer = leasehold.Client(follower_first)
    leaders = []
    threading.Thread(
        target=lambda: [leaders.append(x.value if x else None) for x in observer.election("boss").observe()],
        daemon=True,
    ).start()
    _wait_for("the observer's first answer", lambda: leaders == [None])

    stop = threading.Event()

    def write() -> None:
        client = leasehold.Client(cluster.url)
        i = 0
        while not stop.is_set():
            try:
                with client.try_lock(f"w/{i}", ttl=5):
                    pass
            except leasehold.LeaseholdError:
                pass  # refused in the failover: the events say what happened
            i += 1
            time.sleep(0.005)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    a = leasehold.Client(cluster.url, holder="a")
    lead_a = a.election("boss").campaign("a", ttl=5)
    _wait_for("20 events", lambda: len(seen) >= 20)
    cluster.kill(order[0])
    lead_a.resign()
    b = leasehold.Client(cluster.url, holder="b")
    lead_b = b.election("boss").campaign("b", ttl=5)
    before = len(seen)
    _wait_for("40 events after the kill", lambda: len(seen) >= before + 40)
    stop.set()
    writer.join(10)
    _wait_for("every leader", lambda: len(leaders) >= 4)
    assert leaders == [None, "a", None, "b"]
    lead_b.resign()

    positions = [(e.index, e.seq) for e in seen]
    assert all(x < y for x, y in zip(positions, positions[1:])), "in order, none twice"
    reference = leasehold.Client(cluster.addrs[order[2]])
    expected = []
    for e in reference.watch("w/", after=(0, 2**32 - 1)):
        expected.append(e)
        if (e.index, e.seq) >= positions[-1]:
            break
    start = [(e.index, e.seq) for e in expected].index(positions[0])
    assert seen[: len(expected) - start] == expected[start:]


def test_async_election(server):
    async def main() -> None:
        async with leasehold.AsyncClient(server.url, holder="w") as w, leasehold.AsyncClient(
            server.url, holder="a"
        ) as a:
            election = w.election("jobs")
            seen = []
            observing = election.observe()
            seen.append(await observing.__anext__())
            lead = await a.election("jobs").campaign("a:1", ttl=5)
            seen.append(await asyncio.wait_for(observing.__anext__(), 10))
            await lead.proclaim("a:2")
            seen.append(await asyncio.wait_for(observing.__anext__(), 10))
            assert (await election.leader()).value == "a:2"
            await lead.resign()
            seen.append(await asyncio.wait_for(observing.__anext__(), 10))
            await observing.aclose()
            assert [s.value if s else None for s in seen] == [None, "a:1", "a:2", None]

    asyncio.run(main())


def test_a_release_whose_answer_is_lost_is_sent_again_and_not_called_a_loss(server):
    # The server is frozen while the revoke is in flight: the call times out
    # with its outcome unknown, the retry after the thaw finds the lease
    # already ended by the first one, and that is a release, not a loss.
    client = leasehold.Client(server.url, timeout=0.5)
    lease = client.try_lock("k", ttl=30)
    os.kill(server.proc.pid, signal.SIGSTOP)
    thaw = threading.Timer(1.5, lambda: os.kill(server.proc.pid, signal.SIGCONT))
    thaw.start()
    try:
        lease.release()
    finally:
        thaw.join()
    assert lease.lost_reason == "released"
    assert client.describe("k")["holder"] is None
    # A lease ended by someone else before its release is still a loss.
    other = client.try_lock("j", ttl=30)
    client._call("DELETE", f"/v1/leases/{other.lease_id}", None)
    with pytest.raises(leasehold.LeaseLost):
        other.release()


def test_a_lone_endpoint_that_refuses_connections_fails_at_once():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = leasehold.Client(f"http://127.0.0.1:{port}", holder="py")
    try:
        client.try_lock("k", ttl=3)
    except leasehold.Unavailable as e:
        # Said only by the first refusal, not after the retry budget.
        assert "is leaseholdd running there?" in str(e)
    else:
        raise AssertionError("a lock from nobody")


def test_a_leader_reads_as_the_readme_shows_it():
    leader = leasehold.Leader(raw=b"node-3", fence=42, holder="host-a")
    assert repr(leader) == "Leader(value='node-3', fence=42, holder='host-a')"
