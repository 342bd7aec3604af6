"""Fuzzing the layers that read pgoutput bytes, not only the codec: the decoder inside streamed
blocks, and the consumers of whole streams (the Spark source's ``Framer``, which reads most
messages only by their first bytes, and the decoding ``Assembler``). Well-formed transactions
(plain and streamed, every protocol version) get one message truncated, a byte changed, or
bytes spliced in; what comes out is either the right result or the layer's own error
(``ProtocolError`` for bytes, ``SparkSourceError`` / ``DecodingError`` for a sequence that
cannot happen), never ``struct.error``, ``IndexError``, ``UnicodeDecodeError``, ``KeyError``...

Coverage-guided fuzzing of the same layers with atheris is in ``tools/fuzz.py`` (shortened in
``test_atheris.py``, longer with ``make fuzz``).
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tools.fuzz_targets import feed_assembler, feed_framer

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    Commit,
    Decoder,
    Encoder,
    ProtocolError,
    ReplicationMessage,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from tests.protocol.strategies import data_messages, xids

PROTOS = st.integers(1, 4)
T0 = datetime(2024, 1, 1, tzinfo=UTC)


@st.composite
def transactions(draw: st.DrawFn, proto: int) -> list[ReplicationMessage]:
    """Plain transactions and (protocol 2+) streamed ones, committed or aborted."""
    out: list[ReplicationMessage] = []
    lsn = 0x1000
    for _ in range(draw(st.integers(1, 4))):
        lsn += 0x100
        xid = draw(xids)
        if proto >= 2 and draw(st.booleans()):
            first = True
            subs = [xid, *draw(st.lists(xids, max_size=2))]
            for _ in range(draw(st.integers(1, 3))):
                out.append(StreamStart(xid, first))
                first = False
                out += draw(st.lists(data_messages(st.sampled_from(subs)), max_size=4))
                out.append(StreamStop())
            if draw(st.booleans()):
                out.append(StreamCommit(xid, 0, Lsn(lsn), Lsn(lsn + 0x40), T0))
            else:
                out.append(StreamAbort(xid, draw(st.sampled_from(subs)), None, None))
        else:
            out.append(Begin(Lsn(lsn), T0, xid))
            out += draw(st.lists(data_messages(st.none()), max_size=5))
            out.append(Commit(0, Lsn(lsn), Lsn(lsn + 0x40), T0))
    return out


def mutate(data: st.DataObject, raw: bytes) -> bytes:
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["truncate", "flip", "splice", "delete"]))
        if how == "truncate":
            out = out[: data.draw(st.integers(0, len(out)))]
        elif how == "flip" and out:
            out[data.draw(st.integers(0, len(out) - 1))] = data.draw(st.integers(0, 255))
        elif how == "splice":
            at = data.draw(st.integers(0, len(out)))
            out[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif out:
            at = data.draw(st.integers(0, len(out) - 1))
            del out[at : at + data.draw(st.integers(1, 8))]
    return bytes(out)


def encoded_with_one_mutation(data: st.DataObject) -> tuple[int, list[bytes]]:
    proto = data.draw(PROTOS)
    messages = data.draw(transactions(proto))
    encoder = Encoder(proto)
    raws = [encoder.encode(m) for m in messages]
    at = data.draw(st.integers(0, len(raws) - 1))
    raws[at] = mutate(data, raws[at])
    return proto, raws


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decoder_in_and_out_of_streams(data: st.DataObject) -> None:
    """The decoder keeps its stream state across a whole mutated stream; every message either
    decodes or raises ProtocolError."""
    proto, raws = encoded_with_one_mutation(data)
    decoder = Decoder(proto)
    for raw in raws:
        try:
            decoder.decode(raw)
        except ProtocolError as exc:
            assert 0 <= exc.offset <= len(raw)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_framer_raises_only_its_own_errors(data: st.DataObject) -> None:
    feed_framer(*encoded_with_one_mutation(data))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_assembler_raises_only_its_own_errors(data: st.DataObject) -> None:
    proto, raws = encoded_with_one_mutation(data)
    with tempfile.TemporaryDirectory() as spill:
        feed_assembler(proto, raws, spill)
