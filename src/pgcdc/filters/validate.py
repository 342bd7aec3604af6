"""Checks on a bound filter, in the order the server makes them, then the client's own:

1. collations (parse_collate.c): conflicting explicit COLLATE clauses are an error;
2. PostgreSQL's row filter rules (check_simple_rowfilter_expr_walker in publicationcmds.c):
   only columns, constants, built-in operators, types, collations and immutable built-in
   functions; no system columns. Errors carry the server's detail lines and positions;
3. the replica identity rule for publications that publish UPDATE or DELETE
   (pub_rf_contains_invalid_column);
4. what this client can evaluate: column and intermediate types, implemented functions, and
   text ordering or case mapping only under the C collation (code point order, ASCII case).

``prepare`` runs them all and returns the tree with each call's implementation attached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeAlias, TypeVar

from pgcdc.filters import datums, pg_builtins
from pgcdc.filters.binder import INVALID_EXPRESSION, children
from pgcdc.filters.bound import (
    ArrayExpr,
    BooleanTest,
    BoolExpr,
    Bound,
    Call,
    CaseExpr,
    CaseTestExpr,
    CoalesceExpr,
    CollateExpr,
    Const,
    DistinctExpr,
    MinMaxExpr,
    NullIfExpr,
    NullTest,
    RelabelType,
    ScalarArrayOpExpr,
    SQLValueFunction,
    Var,
)
from pgcdc.filters.errors import (
    CollationError,
    InvalidFilterError,
    ReplicaIdentityError,
    UnsupportedFilterError,
)
from pgcdc.filters.functions import COLLATION_SENSITIVE, IMPLEMENTATIONS, UNICODE_CASE_SUFFIX
from pgcdc.protocol.messages import Relation

__all__ = ["C_COLLATIONS", "ColumnCollations", "prepare", "unicode_simple_case"]

#: The columns declared with a collation other than the database's default, by name: the
#: collation's name and schema (``attcollation``; pgoutput's Relation does not carry it)
ColumnCollations: TypeAlias = Mapping[str, tuple[str, str]]

#: Collations whose text ordering is code point order and whose case mapping is ASCII-only.
C_COLLATIONS = frozenset({"C", "POSIX", "ucs_basic"})
_CASE_MAPPING = frozenset({"lower", "upper", "initcap", "texticlike", "texticnlike"})


def unicode_simple_case(name: str | None) -> bool:
    """Is this C.UTF-8: code point order and Unicode's simple case mapping?

    glibc's C.UTF-8 (libc provider; initdb's default here) orders by code point (its LC_COLLATE
    says ``codepoint_collation``) and maps case with i18n_ctype's per-character tables;
    PostgreSQL 17's builtin provider (``pg_c_utf8``) does the same with its own Unicode tables.
    glibc accepts the codeset as UTF-8, utf8, UTF8 and so on.
    """
    if name is None:
        return False
    if name == "pg_c_utf8":
        return True
    base, _, codeset = name.partition(".")
    return base == "C" and codeset.replace("-", "").lower() == "utf8"


_NONE, _IMPLICIT, _CONFLICT, _EXPLICIT = 0, 1, 2, 3
_ONLY_DETAIL = (
    "Only columns, constants, built-in operators, built-in data types, built-in collations, "
    "and immutable built-in functions are allowed."
)

_N = TypeVar("_N", bound=Bound)


@dataclass(frozen=True, slots=True)
class _Coll:
    name: str | None
    schema: str | None
    strength: int
    location: int = -1


_NO_COLL = _Coll(None, None, _NONE)


def _pos(location: int) -> int | None:
    return location + 1 if location >= 0 else None


class _Collations:
    """assign_collations: each node's (result) collation and its functions' input collation."""

    def __init__(self, columns: ColumnCollations) -> None:
        self.columns = columns
        self.result: dict[int, _Coll] = {}
        self.input: dict[int, _Coll] = {}

    def visit(self, node: Bound) -> _Coll:
        key = id(node)
        if key in self.result:
            return self.result[key]
        if isinstance(node, CollateExpr):
            self.visit(node.arg)
            state = _Coll(node.collation, node.schema, _EXPLICIT, node.keyword)
            self.input[key] = _NO_COLL
        elif isinstance(node, Var | Const | CaseTestExpr | SQLValueFunction):
            state = self._leaf(node.type, node.location)
            if isinstance(node, Var) and state.strength and node.name in self.columns:
                name, schema = self.columns[node.name]  # the column's own (Var's varcollid)
                state = _Coll(name, schema, _IMPLICIT, node.location)
            self.input[key] = _NO_COLL
        elif isinstance(node, CaseExpr):
            merged = _NO_COLL
            if node.arg is not None:
                self.visit(node.arg)
            for cond, result in node.whens:
                self.visit(cond)
                merged = _merge(merged, self.visit(result))
            merged = _merge(merged, self.visit(node.default))
            self.input[key] = merged
            state = self._output(node.type, merged, node.location)
        else:
            merged = _NO_COLL
            for child in children(node):
                merged = _merge(merged, self.visit(child))
            self.input[key] = merged
            state = self._output(node.type, merged, node.location)
        self.result[key] = state
        return state

    @staticmethod
    def _leaf(type_oid: int, location: int) -> _Coll:
        entry = pg_builtins.type_entry(type_oid)
        if entry is None or not entry.collatable:
            return _NO_COLL
        return _Coll("C" if type_oid == pg_builtins.NAME else "default", None, _IMPLICIT, location)

    @staticmethod
    def _output(type_oid: int, merged: _Coll, location: int) -> _Coll:
        entry = pg_builtins.type_entry(type_oid)
        if entry is None or not entry.collatable:
            return _NO_COLL
        if merged.strength > _NONE:
            return merged
        return _Coll("default", None, _IMPLICIT, location)


def _merge(a: _Coll, b: _Coll) -> _Coll:
    """merge_collation_state."""
    if b.strength > a.strength:
        return b
    if b.strength < a.strength or b.strength == _NONE:
        return a
    if (a.name, a.schema) == (b.name, b.schema):
        return a
    if a.strength == _IMPLICIT:
        if a.name == "default":
            return b
        if b.name == "default":
            return a
        return _Coll(None, None, _CONFLICT, a.location)
    if a.strength == _EXPLICIT:
        raise InvalidFilterError(
            f'collation mismatch between explicit collations "{a.name}" and "{b.name}"',
            sqlstate="42P21",
            position=_pos(b.location),
        )
    return a


def _functions_mutable(node: Bound) -> bool:
    """check_functions_in_node with contain_mutable_or_user_functions_checker."""
    if isinstance(node, Call):
        return node.volatility != "i"
    if isinstance(node, DistinctExpr | NullIfExpr):
        return node.eq.volatility != "i"
    if isinstance(node, ScalarArrayOpExpr):
        return node.op.volatility != "i"
    return False


def _user_collation(state: _Coll) -> bool:
    return state.schema not in (None, "pg_catalog")


def _check_rowfilter(node: Bound, collations: _Collations) -> None:
    """check_simple_rowfilter_expr_walker, pre-order."""
    detail: str | None = None
    if isinstance(node, Var):
        if node.attnum < 0:
            detail = "System columns are not allowed."
    elif not isinstance(
        node,
        Const
        | Call
        | DistinctExpr
        | NullIfExpr
        | ScalarArrayOpExpr
        | BoolExpr
        | RelabelType
        | CollateExpr
        | CaseExpr
        | CaseTestExpr
        | ArrayExpr
        | CoalesceExpr
        | MinMaxExpr
        | NullTest
        | BooleanTest,
    ):
        detail = _ONLY_DETAIL
    if detail is None:
        if node.type >= pg_builtins.FIRST_NORMAL_OBJECT_ID:
            detail = "User-defined types are not allowed."
        elif _functions_mutable(node):
            detail = "User-defined or built-in mutable functions are not allowed."
        elif _user_collation(collations.result.get(id(node), _NO_COLL)) or _user_collation(
            collations.input.get(id(node), _NO_COLL)
        ):
            detail = "User-defined collations are not allowed."
    if detail is not None:
        raise InvalidFilterError(
            INVALID_EXPRESSION, sqlstate="0A000", detail=detail, position=_pos(node.location)
        )
    for child in children(node):
        _check_rowfilter(child, collations)


def _vars(node: Bound) -> list[Var]:
    if isinstance(node, Var):
        return [node]
    out: list[Var] = []
    for child in children(node):
        out += _vars(child)
    return out


def _check_replica_identity(node: Bound, relation: Relation) -> None:
    if relation.replica_identity == "f":
        return
    for var in _vars(node):
        if var.index < 0 or not relation.columns[var.index].is_key:
            raise ReplicaIdentityError(
                f"a row filter of a publication that publishes UPDATE or DELETE cannot use "
                f'column "{var.name}" of table "{relation.namespace}.{relation.name}"',
                sqlstate="42P10",
                detail="Column used in the publication WHERE expression is not part of the "
                "replica identity.",
                hint="Filter on replica identity columns only, set REPLICA IDENTITY FULL on the "
                "table, or publish only inserts (PostgreSQL refuses UPDATE and DELETE of the "
                "table otherwise).",
                position=_pos(var.location),
            )


def _describe(call: Call) -> str:
    if call.kind == "op":
        return f"operator {call.name} ({call.implementation})"
    if call.kind == "cast":
        return f"the cast {call.name}"
    return f"function {call.name}() ({call.implementation})"


def _effective(state: _Coll, database: str) -> str | None:
    if state.strength == _CONFLICT:
        return None
    if state.name == "default" or state.name is None:
        return database
    return state.name


def _check_support(
    node: Bound, collations: _Collations, database: str, unicode_case: set[int]
) -> None:
    """Refuse what cannot be evaluated exactly; note the calls that map case as C.UTF-8 does
    (``unicode_case``, by id)."""
    if isinstance(node, Var) and node.type not in datums.SUPPORTED_TYPES:
        raise UnsupportedFilterError(
            f'column "{node.name}" has type {pg_builtins.format_type(node.type)}, which '
            "client-side row filters cannot evaluate",
            sqlstate="0A000",
            position=_pos(node.location),
        )
    if (
        not isinstance(node, ArrayExpr)
        and node.type not in datums.SUPPORTED_TYPES
        and node.type != pg_builtins.UNKNOWN
    ):
        raise UnsupportedFilterError(
            f"values of type {pg_builtins.format_type(node.type)} are not supported by client-side "
            "row filters",
            sqlstate="0A000",
            position=_pos(node.location),
        )
    calls: list[Call] = []
    if isinstance(node, Call):
        calls.append(node)
    elif isinstance(node, DistinctExpr | NullIfExpr):
        calls.append(node.eq)
    elif isinstance(node, ScalarArrayOpExpr):
        calls.append(node.op)
    elif isinstance(node, MinMaxExpr):
        calls.append(node.compare)
    for call in calls:
        if call.implementation not in IMPLEMENTATIONS:
            raise UnsupportedFilterError(
                f"{_describe(call)} is not supported by client-side row filters",
                sqlstate="0A000",
                position=_pos(node.location),
            )
        if call.implementation in COLLATION_SENSITIVE:
            collation = _effective(collations.input.get(id(node), _NO_COLL), database)
            if collation in C_COLLATIONS:
                continue
            if unicode_simple_case(collation) and call.implementation != "initcap":
                if call.implementation in _CASE_MAPPING:
                    unicode_case.add(id(call))
                continue
            what = "case mapping" if call.implementation in _CASE_MAPPING else "text ordering"
            raise CollationError(
                f"{what} under collation {collation or '(indeterminate)'} is not supported "
                "by client-side row filters",
                sqlstate="0A000",
                detail="Client-side evaluation orders text by code point and maps case as the "
                "C collation (ASCII only) and C.UTF-8 (Unicode's simple case mapping) do; "
                "initcap only under C.",
                hint='Add COLLATE "C" to the expression, or filter on the server '
                "(a publication WHERE clause).",
                position=_pos(node.location),
            )
    for child in children(node):
        _check_support(child, collations, database, unicode_case)


def _attach(node: _N, unicode_case: frozenset[int] = frozenset()) -> _N:
    """The tree with every Call's ``fn`` set from IMPLEMENTATIONS."""
    if isinstance(node, Call):
        args = tuple(_attach(a, unicode_case) for a in node.args)
        name = node.implementation
        if id(node) in unicode_case:
            name += UNICODE_CASE_SUFFIX
        return replace(node, args=args, fn=IMPLEMENTATIONS[name])
    if isinstance(node, BoolExpr | CoalesceExpr):
        return replace(node, args=tuple(_attach(a, unicode_case) for a in node.args))
    if isinstance(node, MinMaxExpr):
        return replace(
            node,
            args=tuple(_attach(a, unicode_case) for a in node.args),
            compare=_attach(node.compare, unicode_case),
        )
    if isinstance(node, NullTest | BooleanTest | RelabelType | CollateExpr):
        return replace(node, arg=_attach(node.arg, unicode_case))
    if isinstance(node, DistinctExpr | NullIfExpr):
        return replace(node, eq=_attach(node.eq, unicode_case))
    if isinstance(node, ScalarArrayOpExpr):
        return replace(
            node,
            op=_attach(node.op, unicode_case),
            left=_attach(node.left, unicode_case),
            array=_attach(node.array, unicode_case),
        )
    if isinstance(node, ArrayExpr):
        return replace(node, elements=tuple(_attach(e, unicode_case) for e in node.elements))
    if isinstance(node, CaseExpr):
        return replace(
            node,
            arg=None if node.arg is None else _attach(node.arg, unicode_case),
            whens=tuple(
                (_attach(c, unicode_case), _attach(r, unicode_case)) for c, r in node.whens
            ),
            default=_attach(node.default, unicode_case),
        )
    return node


def prepare(
    node: Bound,
    relation: Relation,
    *,
    publishes_update_or_delete: bool,
    collation: str,
    column_collations: ColumnCollations,
) -> Bound:
    """Run every check on a bound filter; the tree ready for folding and evaluation."""
    collations = _Collations(column_collations)
    collations.visit(node)
    _check_rowfilter(node, collations)
    if publishes_update_or_delete:
        _check_replica_identity(node, relation)
    unicode_case: set[int] = set()
    _check_support(node, collations, collation, unicode_case)
    return _attach(node, frozenset(unicode_case))
