"""Publication row filters, evaluated client-side exactly as PostgreSQL evaluates them.

A filter is parsed once (``RowFilter.parse``), bound to a table as the pgoutput Relation
message describes it (``RowFilter.bind`` -> ``BoundFilter``), and evaluated against pgoutput
tuples (``BoundFilter.matches``), with the server's semantics: its parse analysis and
restrictions for publication WHERE clauses, three-valued logic, its arithmetic and errors,
C-collation text comparison. ``to_sql`` prints a filter back for CREATE PUBLICATION or a
snapshot query.

``FilterSet`` combines filters per table and action like pgoutput combines several
publications, from a client-side configuration or from the server's publication catalog;
``StreamFilter.apply`` applies them to decoded protocol messages, turning UPDATEs into
INSERTs or DELETEs exactly as pgoutput does, so its output is what the server would have sent
with the filters in the publication.
"""

from pgcdc.filters.errors import (
    CollationError,
    FilterEvaluationError,
    FilterSyntaxError,
    InvalidFilterError,
    ReplicaIdentityError,
    RowFilterError,
    UnsupportedFilterError,
)
from pgcdc.filters.rowfilter import BoundFilter, RowFilter
from pgcdc.filters.rules import (
    ACTIONS,
    Action,
    FilterSet,
    Publication,
    PublishedFilter,
    TableRule,
    load_publications,
)
from pgcdc.filters.stream import StreamFilter, UnknownRelationError

__all__ = [
    "ACTIONS",
    "Action",
    "BoundFilter",
    "CollationError",
    "FilterEvaluationError",
    "FilterSet",
    "FilterSyntaxError",
    "InvalidFilterError",
    "Publication",
    "PublishedFilter",
    "ReplicaIdentityError",
    "RowFilter",
    "RowFilterError",
    "StreamFilter",
    "TableRule",
    "UnknownRelationError",
    "UnsupportedFilterError",
    "load_publications",
]
