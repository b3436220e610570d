"""The classic group coordinator's rules, driven call by call (GroupManager, no
sockets): a member that keeps heartbeating through a rebalance is waited for up to the
rebalance timeout, not dropped at its session timeout (librdkafka's head-of-line test),
and a follower rejoining with the same protocols gets its generation back without a
rebalance."""

import threading
import time

from logkit.protocol import errors as E
from logkit.protocol.groups import GroupManager

PROTOCOLS = [("range", b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff")]


def _manager():
    snapshots = {}
    return GroupManager(persist=snapshots.__setitem__, embedded_live=lambda g: False), \
        snapshots


def _join(manager, member_id="", client="c", session_ms=1000, rebalance_ms=30000):
    return manager.join("g", member_id, client, "127.0.0.1", session_ms, rebalance_ms,
                        "consumer", PROTOCOLS)


def test_a_heartbeating_member_is_waited_for_past_its_session_timeout():
    manager, snapshots = _manager()
    first = _join(manager)
    a = first["member_id"]
    assert manager.sync("g", first["generation_id"], a,
                        [{"member_id": a, "assignment": b"x"}])["error_code"] == 0
    joined = {}
    second = threading.Thread(target=lambda: joined.update(_join(manager, client="b")))
    second.start()
    deadline = time.monotonic() + 30
    while manager.describe("g")["group_state"] != "PreparingRebalance":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # three session timeouts of heartbeats answered REBALANCE_IN_PROGRESS: still a member
    for _ in range(15):
        assert manager.heartbeat("g", first["generation_id"], a) == E.REBALANCE_IN_PROGRESS
        time.sleep(0.2)
    assert a in [m["member_id"] for m in manager.describe("g")["members"]]
    assert not joined                                 # b waits for a to rejoin
    again = _join(manager, member_id=a)
    second.join(30)
    assert again["error_code"] == 0 and joined["error_code"] == 0
    assert again["generation_id"] == joined["generation_id"] == first["generation_id"] + 1
    assert snapshots["g"]["generation"] == again["generation_id"]


def test_a_follower_rejoining_unchanged_keeps_the_generation():
    manager, _ = _manager()
    leader = {}
    thread = threading.Thread(target=lambda: leader.update(_join(manager, client="a")))
    thread.start()
    deadline = time.monotonic() + 30
    while not manager.describe("g") or not manager.describe("g")["members"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    thread.join(30)
    follower = {}
    thread = threading.Thread(target=lambda: follower.update(_join(manager, client="b")))
    thread.start()
    while manager.describe("g")["group_state"] != "PreparingRebalance":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    leader = _join(manager, member_id=leader["member_id"])
    thread.join(30)
    generation = leader["generation_id"]
    assignments = [{"member_id": m["member_id"], "assignment": b"p"}
                   for m in leader["members"]]
    assert manager.sync("g", generation, leader["member_id"], assignments)["error_code"] == 0
    assert manager.sync("g", generation, follower["member_id"], [])["assignment"] == b"p"
    rejoined = _join(manager, member_id=follower["member_id"])
    assert (rejoined["error_code"], rejoined["generation_id"]) == (0, generation)
    assert manager.describe("g")["group_state"] == "Stable"
    assert manager.heartbeat("g", generation, follower["member_id"]) == E.NONE


def test_a_static_member_back_under_its_instance_id_takes_over_without_a_rebalance():
    """KIP-345: the new member id replaces the old one in place (same generation, same
    assignment, no rebalance); the old member id is fenced from then on."""
    manager, snapshots = _manager()
    first = manager.join("g", "", "c", "127.0.0.1", 10000, 30000, "consumer", PROTOCOLS,
                         "instance-1")
    old, generation = first["member_id"], first["generation_id"]
    assert old.startswith("instance-1-")
    assert manager.sync("g", generation, old, [{"member_id": old, "assignment": b"p"}],
                        "instance-1")["error_code"] == E.NONE
    back = manager.join("g", "", "c", "127.0.0.1", 10000, 30000, "consumer", PROTOCOLS,
                        "instance-1")
    new = back["member_id"]
    assert new != old and new.startswith("instance-1-")
    assert (back["error_code"], back["generation_id"], back["leader"]) == (0, generation, new)
    assert back["skip_assignment"] and [m["member_id"] for m in back["members"]] == [new]
    assert manager.describe("g")["group_state"] == "Stable"
    assert manager.sync("g", generation, new, [], "instance-1")["assignment"] == b"p"
    assert list(snapshots["g"]["members"]) == [new]
    assert manager.heartbeat("g", generation, old, "instance-1") == E.FENCED_INSTANCE_ID
    assert manager.check_commit("g", generation, old, "instance-1") == E.FENCED_INSTANCE_ID
    assert manager.leave("g", [(old, "instance-1")]) == [E.FENCED_INSTANCE_ID]
    assert manager.heartbeat("g", generation, new, "instance-1") == E.NONE
    assert manager.delete("g", lambda: E.NONE) == E.NON_EMPTY_GROUP
    assert manager.leave("g", [("", "instance-1")]) == [E.NONE]     # by instance id
    assert manager.describe("g")["members"] == []
    assert manager.delete("g", lambda: E.GROUP_ID_NOT_FOUND) == E.NONE
    assert manager.describe("g") is None


def _static_join(manager, instance, member_id=""):
    return manager.join("g", member_id, "c", "127.0.0.1", 10000, 30000, "consumer",
                        PROTOCOLS, instance)


def test_a_static_member_replaced_while_its_old_id_waits_in_sync_fences_that_wait():
    manager, _ = _manager()
    a = _static_join(manager, "a")
    assert manager.sync("g", a["generation_id"], a["member_id"], [], "a")["error_code"] == 0
    b: dict = {}
    joining = threading.Thread(target=lambda: b.update(_static_join(manager, "b")))
    joining.start()
    deadline = time.monotonic() + 30
    while manager.describe("g")["group_state"] != "PreparingRebalance":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    a = _static_join(manager, "a", a["member_id"])
    joining.join(30)
    generation = a["generation_id"]
    assert b["generation_id"] == generation and a["leader"] == a["member_id"]
    waited: dict = {}
    syncing = threading.Thread(target=lambda: waited.update(
        manager.sync("g", generation, b["member_id"], [], "b")))
    syncing.start()                      # the follower waits for the leader's assignment
    back = _static_join(manager, "b")    # its instance id comes back meanwhile
    syncing.join(30)
    assert waited["error_code"] == E.FENCED_INSTANCE_ID
    assert (back["error_code"], back["generation_id"]) == (0, generation)
    assignments = [{"member_id": a["member_id"], "assignment": b"a"},
                   {"member_id": back["member_id"], "assignment": b"b"}]
    assert manager.sync("g", generation, a["member_id"], assignments, "a")["error_code"] == 0
    assert manager.sync("g", generation, back["member_id"], [], "b")["assignment"] == b"b"
