"""Property tests: encode/decode round trips, and bad bytes only ever raise ProtocolError.

Hypothesis prints a failing example together with the `@reproduce_failure` seed to replay it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.protocol import Decoder, Encoder, ProtocolError, ReplicationMessage, StreamStart
from tests.protocol.strategies import control_messages, data_messages, streams

PROTOS = st.integers(1, 4)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_stream_round_trip(data: st.DataObject) -> None:
    proto = data.draw(PROTOS)
    messages = data.draw(streams(proto))
    encoder, decoder = Encoder(proto), Decoder(proto)
    for message in messages:
        raw = encoder.encode(message)
        decoded = decoder.decode(raw)
        assert decoded == message
        assert encoder.encode(decoded) == raw
    assert not decoder.in_stream


@settings(max_examples=300)
@given(data_messages(st.none()) | control_messages(4))
def test_every_message_round_trips(message: ReplicationMessage) -> None:
    assert Decoder(4).decode(Encoder(4).encode(message)) == message


def _try(decoder: Decoder, raw: bytes) -> None:
    try:
        decoder.decode(raw)
    except ProtocolError as exc:
        assert 0 <= exc.offset <= len(raw)
        assert str(exc).startswith("bad pgoutput")


@settings(max_examples=1000)
@given(st.binary(max_size=64), PROTOS, st.booleans())
def test_random_bytes_raise_only_protocol_error(raw: bytes, proto: int, in_stream: bool) -> None:
    decoder = Decoder(proto)
    if in_stream and proto >= 2:
        decoder.decode(Encoder(proto).encode(_start()))
    _try(decoder, raw)


def _start() -> ReplicationMessage:
    return StreamStart(1, True)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_messages_raise_only_protocol_error(data: st.DataObject) -> None:
    proto = data.draw(PROTOS)
    message = data.draw(data_messages(st.none()) | control_messages(proto))
    raw = bytearray(Encoder(proto).encode(message))
    mutation = data.draw(st.sampled_from(["truncate", "flip", "append", "splice"]))
    if mutation == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif mutation == "flip" and len(raw) > 1:
        at = data.draw(st.integers(1, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    elif mutation == "append":
        raw += data.draw(st.binary(min_size=1, max_size=8))
    else:
        at = data.draw(st.integers(0, len(raw)))
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    _try(Decoder(proto), bytes(raw))


@settings(max_examples=200)
@given(st.data())
def test_every_truncation_is_reported(data: st.DataObject) -> None:
    """Every strict prefix of a valid message is an error, never a shorter valid message."""
    message = data.draw(data_messages(st.none()) | control_messages(4))
    raw = Encoder(4).encode(message)
    # a Stream Abort's abort LSN and time exist only with streaming = parallel; a decoder told
    # which form to expect finds the cut, one left to guess by length cannot
    parallel = getattr(message, "abort_lsn", None) is not None
    for cut in range(len(raw)):
        try:
            Decoder(4, parallel_streaming=parallel).decode(raw[:cut])
        except ProtocolError:
            continue
        raise AssertionError(f"prefix of {cut} bytes of {message!r} decoded without error")
