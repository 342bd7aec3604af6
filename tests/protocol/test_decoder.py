"""The decoder's strictness: each kind of bad input gets a ProtocolError saying where and what."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Commit,
    Decoder,
    Encoder,
    Insert,
    ProtocolError,
    StreamAbort,
    StreamStart,
    Update,
)

T0 = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


def _error(raw: bytes, proto: int = 4, decoder: Decoder | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        (decoder or Decoder(proto)).decode(raw)
    return info.value


@pytest.mark.parametrize(
    ("raw", "mtype", "offset", "reason"),
    [
        (b"", None, 0, "empty message"),
        (b"Z\x00", "Z", 0, "unknown message type 'Z'"),
        (b"I\x00\x00", "I", 1, "truncated: relation OID needs 4 bytes, 2 remain"),
        (b"I\x00\x00\x00\x01X", "I", 5, "expected 'N' before the new tuple, found 'X'"),
        (b"I\x00\x00\x00\x01N\x00\x01t\xff\xff\xff\xff", "I", 9, "impossible length -1"),
        (b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x09ab", "I", 13, "has length 9, 2 bytes remain"),
        (b"I\x00\x00\x00\x01N\x00\x02n", "I", 9, "TupleData column 1 of 2 is missing"),
        (b"I\x00\x00\x00\x01N\x00\x01q", "I", 8, "unknown TupleData kind 'q'"),
        (b"I\x00\x00\x00\x01N\xff\xff", "I", 6, "impossible TupleData column count -1"),
        (b"I\x00\x00\x00\x01N\x00\x00!", "I", 8, "1 trailing bytes"),
        (b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x01\xff", "I", 13, "not valid utf-8"),
        (b"U\x00\x00\x00\x01K\x00\x00O\x00\x00", "U", 8, "never both"),
        (b"D\x00\x00\x00\x01N\x00\x00", "D", 5, "expected 'K' or 'O'"),
        (b"R\x00\x00\x00\x01public", "R", 5, "without its terminating zero byte"),
        (b"R\x00\x00\x00\x01p\x00t\x00x\x00\x00", "R", 9, "unknown replica identity 'x'"),
        (b"T\xff\xff\xff\xff\x00", "T", 1, "impossible relation count -1"),
        (b"T\x00\x00\x00\x02\x00\x00\x00\x00\x01", "T", 6, "2 relation OIDs needs 8 bytes"),
        (b"M\x02" + bytes(8) + b"p\x00" + bytes(4), "M", 1, "unrecognized flags 2"),
        (b"C\x01" + bytes(24), "C", 1, "unrecognized flags 1"),
        (b"B" + bytes(8) + b"\x7f" + bytes(7) + bytes(4), "B", 9, "out of range"),
        (b"E", "E", 0, "Stream Stop without a Stream Start"),
    ],
)
def test_bad_input(raw: bytes, mtype: str | None, offset: int, reason: str) -> None:
    error = _error(raw)
    assert (error.message_type, error.offset) == (mtype, offset), str(error)
    assert reason in error.reason
    assert f"at byte {offset}" in str(error)


def test_error_message_names_the_message() -> None:
    error = _error(b"I\x00\x00")
    assert str(error) == (
        "bad pgoutput Insert message ('I') at byte 1: truncated: relation OID needs 4 bytes, "
        "2 remain (message is 3 bytes)"
    )
    assert pickle.loads(pickle.dumps(error)).args == error.args


@pytest.mark.parametrize(("code", "since"), [("S", 2), ("c", 2), ("A", 2), ("p", 2)])
def test_messages_newer_than_the_stream_version(code: str, since: int) -> None:
    error = _error(code.encode() + bytes(40), proto=since - 1)
    assert f"exists from protocol version {since}" in error.reason


def test_stream_state() -> None:
    encoder, decoder = Encoder(2), Decoder(2)
    decoder.decode(encoder.encode(StreamStart(42, True)))
    assert decoder.in_stream and decoder.stream_xid == 42
    # inside a block, data messages carry an Xid
    insert = Insert(42, 7, ("a",))
    assert decoder.decode(encoder.encode(insert)) == insert
    # transaction boundaries cannot appear inside a block
    error = _error(encoder.encode(Commit(0, Lsn(1), Lsn(2), T0)), decoder=decoder)
    assert "inside the streamed block of xid 42" in error.reason
    error = _error(encoder.encode(StreamStart(43, True)), decoder=decoder)
    assert "while the block of xid 42 is open" in error.reason
    # a malformed Stream Stop does not close the block
    _error(b"E!", decoder=decoder)
    assert decoder.in_stream
    decoder.decode(b"E")
    assert not decoder.in_stream
    # outside a block, data messages carry none
    plain = decoder.decode(encoder.encode(Insert(None, 7, ("a",))))
    assert plain == Insert(None, 7, ("a",))
    decoder.decode(encoder.encode(StreamStart(44, False)))
    decoder.reset()
    assert not decoder.in_stream


def test_stream_abort_forms() -> None:
    short = Encoder(4).encode(StreamAbort(5, 6, None, None))
    full = Encoder(4).encode(StreamAbort(5, 6, Lsn("1/2"), T0))
    assert Decoder(4).decode(short) == StreamAbort(5, 6, None, None)
    assert Decoder(4).decode(full) == StreamAbort(5, 6, Lsn("1/2"), T0)
    assert Decoder(4, parallel_streaming=False).decode(short).abort_lsn is None  # type: ignore[union-attr]
    assert "only with protocol version 4" in _error(full, proto=3).reason
    assert (
        "only with protocol version 4"
        in _error(full, decoder=Decoder(4, parallel_streaming=False)).reason
    )
    assert "truncated" in _error(short, decoder=Decoder(4, parallel_streaming=True)).reason


def test_update_without_old_tuple_and_views() -> None:
    update = Update(None, 9, None, None, ("x", None))
    raw = Encoder(1).encode(update)
    assert Decoder(1).decode(memoryview(raw)) == update
    assert Decoder(1).decode(bytearray(raw)) == update


def test_lsn_type() -> None:
    lsn = Lsn("16/B374D848")
    assert lsn == 0x16B374D848 and str(lsn) == "16/B374D848" and repr(lsn) == "Lsn('16/B374D848')"
    assert Lsn(lsn) == lsn and Lsn.parse(str(lsn)) == lsn and f"{lsn}" == "16/B374D848"
    assert pickle.loads(pickle.dumps(lsn)) == lsn and isinstance(lsn + 1, int)
    for bad in ("", "16", "G/1", "1/2/3", "123456789/0"):
        with pytest.raises(ValueError, match="invalid LSN"):
            Lsn.parse(bad)
    with pytest.raises(ValueError, match="out of range"):
        Lsn(-1)


def test_decoder_rejects_unknown_versions() -> None:
    for version in (0, 5):
        with pytest.raises(ValueError, match="proto_version must be 1 to 4"):
            Decoder(version)
