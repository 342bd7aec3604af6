"""``MessageType`` and ``peek``: the protocol's vocabulary, and a message's header read at the
offsets the formats give, checked against the decoder's full reading of the same messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.protocol import (
    Decoder,
    Encoder,
    Insert,
    Message,
    MessageType,
    ProtocolError,
    Relation,
    StreamStart,
    StreamStop,
    Truncate,
    peek,
)
from pgcdc.protocol.decoder import MAX_PROTO_VERSION
from pgcdc.protocol.message_types import relation_id, truncated_relations, without_xid
from pgcdc.protocol.messages import Begin, Delete, Update
from tests.protocol.strategies import control_messages, data_messages


def test_every_type_byte_has_one_name_and_a_first_version() -> None:
    assert len({int(t) for t in MessageType}) == len(MessageType) == 19
    assert {t.letter for t in MessageType} == set("BMCORYIUDTSEcAbPKrp")
    assert {t for t in MessageType if t.since == 2} == {
        MessageType.STREAM_START,
        MessageType.STREAM_STOP,
        MessageType.STREAM_COMMIT,
        MessageType.STREAM_ABORT,
        MessageType.STREAM_PREPARE,
    }


@given(data_messages(st.none()))
def test_peek_outside_a_stream_agrees_with_the_decoder(message: object) -> None:
    payload = Encoder(MAX_PROTO_VERSION).encode(message)  # type: ignore[arg-type]
    header = peek(payload, in_stream=False)
    decoded = Decoder(MAX_PROTO_VERSION).decode(payload)
    assert header.kind == payload[0] and header.xid is None
    _agrees(header, decoded)


@given(data_messages(st.integers(1, 2**32 - 1)))
def test_peek_inside_a_stream_reads_the_xid_first(message: object) -> None:
    encoder = Encoder(MAX_PROTO_VERSION)
    payload = encoder.encode(message)  # type: ignore[arg-type]
    header = peek(payload, in_stream=True)
    decoder = Decoder(MAX_PROTO_VERSION)
    xid = message.xid  # type: ignore[attr-defined]
    decoder.decode(encoder.encode(StreamStart(xid, True)))
    decoded = decoder.decode(payload)
    assert header.xid == xid
    _agrees(header, decoded)
    decoder.decode(encoder.encode(StreamStop()))


@given(st.integers(1, 4).flatmap(control_messages))
def test_peek_reads_the_xid_of_transaction_messages(message: object) -> None:
    payload = Encoder(MAX_PROTO_VERSION).encode(message)  # type: ignore[arg-type]
    header = peek(payload, in_stream=False)
    assert header.kind == payload[0]
    if isinstance(message, Begin | StreamStart) or header.kind in (
        MessageType.STREAM_COMMIT,
        MessageType.STREAM_ABORT,
    ):
        assert header.xid == message.xid  # type: ignore[attr-defined]


def _agrees(header: object, decoded: object) -> None:
    if isinstance(decoded, Insert | Update | Delete | Relation):
        assert header.relation_id == decoded.relation_id  # type: ignore[attr-defined]
    elif isinstance(decoded, Message):
        assert header.transactional == decoded.transactional  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("payload", "in_stream"),
    [
        (b"", False),
        (b"Z", False),  # an unknown type
        (b"I\x00\x00", False),  # an Insert too short for its relation id
        (b"I\x00\x00\x00\x01", True),  # inside a stream: the Xid, then no relation id
        (b"M", False),  # a Message without its flags
        (b"B\x00", False),  # a Begin without its Xid
    ],
)
def test_peek_refuses_what_is_too_short_or_unknown(payload: bytes, in_stream: bool) -> None:
    with pytest.raises(ProtocolError):
        peek(payload, in_stream=in_stream)


def test_fields_read_without_decoding_match_the_decoder() -> None:
    for xid in (None, 77):
        in_stream = xid is not None
        e = Encoder(2)
        insert = e.encode(Insert(xid, 16384, ("1",)))
        truncate = e.encode(Truncate(xid, 0, (16384, 16385, 16386)))
        assert relation_id(insert, in_stream=in_stream) == 16384
        assert truncated_relations(truncate, in_stream=in_stream) == 3
        if in_stream:
            plain = Decoder(2).decode(without_xid(insert))
            assert plain == Insert(None, 16384, ("1",))
    with pytest.raises(ProtocolError, match="too short for its relation"):
        relation_id(b"I\x00\x00", in_stream=False)
    with pytest.raises(ProtocolError, match="too short for its relation count"):
        truncated_relations(b"T\x00\x00\x00\x07\x00", in_stream=True)
