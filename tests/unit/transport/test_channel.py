"""Per-channel keys and per-session counters: forged, cut, replayed and reordered messages are refused."""

import logging

import pytest

from rlmesh.transport import AuthError, Authenticator, split_address
from rlmesh.transport.channel import Inbound, Outbound, derive
from rlmesh.transport.refusals import RefusalLog, refusal_stats

SECRET = b"k" * 32


def pair(auth: Authenticator | None = None) -> tuple[Outbound, Inbound]:
    auth = auth or Authenticator(SECRET)
    inbound = auth.new_inbound("test")
    return auth.outbound(f"tcp://127.0.0.1:1#m{inbound.nonce.hex()}"), inbound


def test_round_trip_packed_and_framed():
    out, inb = pair()
    sid, body, extra = inb.verify_packed(out.sign_packed(b"hello", [b"x" * 100]))
    assert sid == out.sid and bytes(body) == b"hello" and extra == [b"x" * 100]
    sid, frames = inb.verify(out.sign([b"header", b"y" * 10]))
    assert frames == [b"header", b"y" * 10]


def test_the_mac_is_blake2b_over_header_frame_count_sizes_and_bytes_whatever_the_frame_count():
    """The one-frame fast path and the general one hash the same bytes: pinned against hashlib here,
    so a peer running either path (or an older rlmesh) verifies the other's messages."""
    import hashlib

    key = b"q" * 32
    out = Outbound(key, sid=b"s" * 8)

    def expected(first: bytes, frames: list[bytes], n: int) -> bytes:
        h = hashlib.blake2b(key=key, digest_size=32)
        h.update(b"s" * 8 + n.to_bytes(8, "little") + len(frames).to_bytes(4, "little"))
        for f in frames:
            h.update(len(f).to_bytes(8, "little") + f)
        return h.digest()

    one = out.sign_packed(b"body", [])
    assert bytes(one[0][:32]) == expected(b"body", [b"body"], 1)
    two = out.sign_packed(b"head", [b"z" * 300])
    assert bytes(two[0][:32]) == expected(b"head", [b"head", b"z" * 300], 2)
    inb = Inbound(key, "test")
    assert bytes(inb.verify_packed(one)[1]) == b"body" and inb.verify_packed(two)[2] == [b"z" * 300]


def test_the_one_frame_paths_are_the_general_ones_in_fewer_python_frames():
    """``sign_one`` / ``open_one`` (calls and replies of one frame) make and accept exactly what
    ``sign_packed`` / ``verify_packed`` do, and refuse the same messages, each counted once."""
    out, inb = pair()
    twin = Outbound(out._key, sid=out.sid)  # the same session, signed by the general path
    fast = out.sign_one(b"body")
    assert [fast] == twin.sign_packed(b"body", [])  # the same bytes, MAC included
    sid, body = inb.open_one(fast)
    assert sid == out.sid and bytes(body) == b"body"
    sid, body, extra = inb.verify_packed([out.sign_one(b"next")])  # either side can read either
    assert bytes(body) == b"next" and extra == []
    later = out.sign_one(b"later")
    with pytest.raises(AuthError, match="replayed or reordered"):
        inb.open_one(fast)
    with pytest.raises(AuthError, match="bad MAC"):
        inb.open_one(later[:-1] + b"?")
    with pytest.raises(AuthError, match="too short"):
        inb.open_one(b"short")
    forged_out, _ = pair(Authenticator(b"other" * 8))
    with pytest.raises(AuthError, match="bad MAC"):
        inb.open_one(forged_out.sign_one(b"body"))
    assert inb.replayed == 1 and inb.rejected == 3
    assert bytes(inb.open_one(later)[1]) == b"later"  # refusals did not advance the counter


def test_replayed_and_reordered_messages_are_dropped_and_counted():
    out, inb = pair()
    first, second, third = (out.sign_packed(b"m%d" % i, []) for i in range(3))
    inb.verify_packed(first)
    inb.verify_packed(third)  # a gap is fine (a send that failed): counters only go up
    for stale in (first, second, third):  # a replay, a message overtaken (reordered), a replay
        with pytest.raises(AuthError, match="replayed or reordered"):
            inb.verify_packed(stale)
    assert inb.replayed == 3 and inb.rejected == 0


def test_forged_cut_and_tampered_messages_fail_the_mac():
    out, inb = pair()
    msg = out.sign([b"header", b"z" * 100, b"tail"])
    with pytest.raises(AuthError):
        inb.verify(msg[:-1])  # truncated: the frame count is MAC'd
    with pytest.raises(AuthError):
        inb.verify([msg[0], b"HEADER", *msg[2:]])
    with pytest.raises(AuthError):
        inb.verify([b"short", b"x"])
    forged_out, _ = pair(Authenticator(b"other" * 8))
    with pytest.raises(AuthError):
        inb.verify(forged_out.sign([b"header"]))
    assert inb.rejected == 4
    inb.verify(msg)  # the genuine message still passes: refusals did not advance the counter


def test_a_message_is_valid_for_one_channel_incarnation_only():
    auth = Authenticator(SECRET)
    out, inb = pair(auth)
    msg = out.sign_packed(b"train", [])
    _, restarted = pair(auth)  # the same socket rebound (a replacement proc): a fresh nonce, another key
    with pytest.raises(AuthError, match="bad MAC"):
        restarted.verify_packed(msg)


def test_replies_are_bound_to_the_requesting_session():
    out, inb = pair()
    sid, _, _ = inb.verify_packed(out.sign_packed(b"req", []))
    reply = inb.reply_outbound(sid).sign([b"rep"])
    assert out.reply_inbound("r").verify(reply)[1] == [b"rep"]
    other, _ = pair()
    with pytest.raises(AuthError):
        other.reply_inbound("r").verify(reply)
    with pytest.raises(AuthError):  # a reply is not a request (no reflection)
        inb.verify(reply)


def test_large_frames_are_bound_by_size_small_ones_by_bytes():
    out, inb = pair()
    big = b"y" * (128 * 1024)
    msg = out.sign([b"h", big])
    with pytest.raises(AuthError):
        inb.verify([msg[0], b"h", big[:-1]])


def test_addresses_carry_nonce_and_mode():
    endpoint, nonce, mode = split_address("tcp://127.0.0.1:5#c" + "ab" * 16)
    assert endpoint == "tcp://127.0.0.1:5" and nonce == b"\xab" * 16 and mode == "c"
    assert split_address("tcp://127.0.0.1:5") == ("tcp://127.0.0.1:5", b"", "")
    with pytest.raises(AuthError, match="malformed"):
        split_address("tcp://127.0.0.1:5#x12")
    with pytest.raises(AuthError, match="no channel nonce"):
        Authenticator(SECRET).outbound("tcp://127.0.0.1:5")
    assert derive(SECRET, b"a") != derive(SECRET, b"b")


def test_refusal_warnings_are_rate_limited_per_peer_with_a_count(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("rlmesh.transport.refusals.time.monotonic", lambda: now[0])
    log = RefusalLog("chan", interval_s=10.0)
    with caplog.at_level(logging.WARNING, logger="rlmesh.transport"):
        for _ in range(50):
            log.refused("10.0.0.1", "bad MAC")
        log.replayed("10.0.0.2")
        now[0] += 11
        log.refused("10.0.0.1", "bad MAC")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # one per peer, then one more after the interval
    assert "refused 1 message(s) from 10.0.0.1" in lines[0]
    assert "refused 50 message(s) from 10.0.0.1" in lines[2]  # 49 held back + this one
    assert log.counts.rejected == 51 and log.counts.replayed == 1


def test_refusal_stats_sum_open_channels_by_name():
    out, inb = pair()
    msg = out.sign([b"x"])
    inb.verify(msg)
    with pytest.raises(AuthError):
        inb.verify(msg)
    assert refusal_stats()["test"].replayed >= 1
