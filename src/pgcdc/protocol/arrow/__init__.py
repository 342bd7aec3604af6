"""Column-wise decoding with numpy and pyarrow: many pgoutput messages (or ``COPY`` binary
tuples) at once into typed Arrow record batches, one per relation.

``columnar`` (``ColumnarDecoder``) is the entry point; ``framing`` finds the messages' fields
in one buffer with numpy, ``typed_arrays`` makes Arrow arrays straight from value bytes. The
row-at-a-time codec (``pgcdc.protocol.decoder``) does not use them.
"""
