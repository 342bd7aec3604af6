"""A micro-batch's Delta work: the batch writer, the sinks (mirror, history, changelog),
the Spark transformations they share, the indexed write and its key index, the initial
copy's files, schema evolution and maintenance."""
