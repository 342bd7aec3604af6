"""PostgreSQL's rules for choosing an operator, a function or a common type for given argument
types: parse_oper.c (oper, left_oper, binary_oper_exact), parse_func.c (func_get_detail,
func_match_argtypes, func_select_candidate) and parse_coerce.c (select_common_type), applied
to the built-in catalog. Ambiguity and absence raise PostgreSQL's errors ("operator does not
exist: integer + text", "operator is not unique: unknown + unknown", ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pgcdc.filters import pg_builtins
from pgcdc.filters.errors import InvalidFilterError
from pgcdc.filters.pg_builtins import (
    UNKNOWN,
    CoercionContext,
    FunctionEntry,
    OperatorEntry,
    can_coerce,
    format_type,
)

__all__ = [
    "Candidate",
    "resolve_function",
    "resolve_operator",
    "select_common_type",
]

_C = TypeVar("_C", bound="Candidate")


@dataclass(frozen=True, slots=True)
class Candidate:
    """An operator or function candidate with its (possibly variadic-expanded) argument types."""

    args: tuple[int, ...]
    operator: OperatorEntry | None = None
    function: FunctionEntry | None = None
    expanded_variadic: bool = False


def _match_argtypes(inputs: Sequence[int], candidates: list[_C]) -> list[_C]:
    return [c for c in candidates if can_coerce(inputs, c.args, CoercionContext.IMPLICIT)]


def _keep_best(candidates: list[_C], score: list[int]) -> list[_C]:
    best = max(score)
    return [c for c, s in zip(candidates, score, strict=True) if s == best]


def select_candidate(inputs: Sequence[int], candidates: list[_C]) -> _C | None:
    """func_select_candidate: the best of several viable candidates, or None if ambiguous."""
    nargs = len(inputs)
    nunknowns = sum(1 for t in inputs if t == UNKNOWN)
    # most exact matches
    scores = [
        sum(1 for i in range(nargs) if inputs[i] != UNKNOWN and c.args[i] == inputs[i])
        for c in candidates
    ]
    candidates = _keep_best(candidates, scores)
    if len(candidates) == 1:
        return candidates[0]
    # exact matches or preferred types (of the input's category) where coercion is needed
    slot_category = [pg_builtins.category(t) for t in inputs]
    scores = []
    for c in candidates:
        n = 0
        for i in range(nargs):
            if inputs[i] == UNKNOWN:
                continue
            current = c.args[i]
            if current == inputs[i] or (
                pg_builtins.is_preferred(current)
                and pg_builtins.category(current) == slot_category[i]
            ):
                n += 1
        scores.append(n)
    candidates = _keep_best(candidates, scores)
    if len(candidates) == 1:
        return candidates[0]
    if nunknowns == 0:
        return None
    # resolve unknown positions by type category (STRING wins)
    resolved = True
    slot_cat: dict[int, str] = {}
    slot_pref: dict[int, bool] = {}
    for i in range(nargs):
        if inputs[i] != UNKNOWN:
            continue
        cat: str | None = None
        pref = False
        conflict = False
        for c in candidates:
            ccat = pg_builtins.category(c.args[i])
            cpref = pg_builtins.is_preferred(c.args[i])
            if cat is None:
                cat, pref = ccat, cpref
            elif ccat == cat:
                pref = pref or cpref
            elif ccat == "S":
                cat, pref = ccat, cpref
            else:
                conflict = True
        if conflict and cat != "S":
            resolved = False
            break
        assert cat is not None
        slot_cat[i] = cat
        slot_pref[i] = pref
    if resolved:
        kept = []
        for c in candidates:
            keep = True
            for i, cat_i in slot_cat.items():
                t = c.args[i]
                if pg_builtins.category(t) != cat_i or (
                    slot_pref[i] and not pg_builtins.is_preferred(t)
                ):
                    keep = False
                    break
            if keep:
                kept.append(c)
        if kept:
            candidates = kept
        if len(candidates) == 1:
            return candidates[0]
    # last gasp: unknowns take the one known type
    if nunknowns < nargs:
        known = {t for t in inputs if t != UNKNOWN}
        if len(known) == 1:
            (known_type,) = known
            assumed = [known_type] * nargs
            matches = [
                c for c in candidates if can_coerce(assumed, c.args, CoercionContext.IMPLICIT)
            ]
            if len(matches) == 1:
                return matches[0]
    return None


def _op_signature(name: str, left: int | None, right: int) -> str:
    if left is None:
        return f"{name} {format_type(right)}"
    return f"{format_type(left)} {name} {format_type(right)}"


def resolve_operator(
    name: str, left: int | None, right: int, position: int, schema: str | None = None
) -> OperatorEntry:
    """The built-in operator ``name`` for these argument types (``left`` None: prefix)."""
    entries = pg_builtins.operators_named(name) or ()
    kind = "l" if left is None else "b"
    pool = [e for e in entries if e.kind == kind]
    shown = name if schema is None else f"{schema}.{name}"
    if left is None:
        exact = [e for e in pool if e.right == right]
    else:
        l_type, r_type = left, right
        was_unknown = False
        if l_type == UNKNOWN and r_type != UNKNOWN:
            l_type, was_unknown = r_type, True
        elif r_type == UNKNOWN and l_type != UNKNOWN:
            r_type, was_unknown = l_type, True
        exact = [e for e in pool if e.left == l_type and e.right == r_type]
        del was_unknown
    if exact:
        return exact[0]
    inputs = (right,) if left is None else (left, right)
    candidates = [Candidate(e.args, operator=e) for e in pool]
    viable = _match_argtypes(inputs, candidates)
    chosen: Candidate | None
    if not viable:
        chosen = None
    elif len(viable) == 1:
        chosen = viable[0]
    else:
        chosen = select_candidate(inputs, viable)
        if chosen is None:
            raise InvalidFilterError(
                f"operator is not unique: {_op_signature(shown, left, right)}",
                sqlstate="42725",
                hint="Could not choose a best candidate operator. You might need to add "
                "explicit type casts.",
                position=position + 1,
            )
    if chosen is None or chosen.operator is None:
        raise InvalidFilterError(
            f"operator does not exist: {_op_signature(shown, left, right)}",
            sqlstate="42883",
            hint="No operator matches the given name and argument types. You might need to "
            "add explicit type casts.",
            position=position + 1,
        )
    return chosen.operator


def function_candidates(entries: Sequence[FunctionEntry], nargs: int) -> list[Candidate]:
    """The candidates taking ``nargs`` arguments, variadic ones expanded
    (FuncnameGetCandidates)."""
    out: list[Candidate] = []
    for e in entries:
        if e.variadic:
            fixed = len(e.args) - 1
            if nargs >= fixed + 1:
                out.append(
                    Candidate(
                        e.args[:fixed] + (e.variadic,) * (nargs - fixed),
                        function=e,
                        expanded_variadic=True,
                    )
                )
            continue
        if len(e.args) == nargs:
            out.append(Candidate(e.args, function=e))
        elif e.ndefaults and len(e.args) - e.ndefaults <= nargs < len(e.args):
            out.append(Candidate(e.args[:nargs], function=e))
    return out


def resolve_function(
    entries: Sequence[FunctionEntry], inputs: Sequence[int]
) -> tuple[FunctionEntry | None, bool]:
    """func_get_detail's candidate choice: (entry, ambiguous). Exact matches first."""
    candidates = function_candidates(entries, len(inputs))
    for c in candidates:
        if c.args == tuple(inputs):
            return c.function, False
    viable = _match_argtypes(inputs, candidates)
    if len(viable) == 1:
        return viable[0].function, False
    if len(viable) > 1:
        chosen = select_candidate(inputs, viable)
        if chosen is None:
            return None, True
        return chosen.function, False
    return None, False


def select_common_type(types: Sequence[int], positions: Sequence[int], context: str) -> int:
    """select_common_type: the type all of ``types`` are coerced to (CASE, COALESCE, IN, ...)."""
    known = [(t, p) for t, p in zip(types, positions, strict=True) if t != UNKNOWN]
    if not known:
        return pg_builtins.TEXT
    ptype, _ = known[0]
    if all(t == ptype for t, _ in known):
        return ptype
    pcategory = pg_builtins.category(ptype)
    ppreferred = pg_builtins.is_preferred(ptype)
    for ntype, npos in known[1:]:
        if ntype == ptype:
            continue
        ncategory = pg_builtins.category(ntype)
        if ncategory != pcategory:
            raise InvalidFilterError(
                f"{context} types {format_type(ptype)} and {format_type(ntype)} cannot be matched",
                sqlstate="42804",
                position=npos + 1,
            )
        if (
            not ppreferred
            and can_coerce([ptype], [ntype], CoercionContext.IMPLICIT)
            and not can_coerce([ntype], [ptype], CoercionContext.IMPLICIT)
        ):
            ptype = ntype
            pcategory = ncategory
            ppreferred = pg_builtins.is_preferred(ntype)
    return ptype


def try_common_type(types: Sequence[int]) -> int | None:
    """select_common_type without raising (IN lists fall back to OR when there is none)."""
    try:
        return select_common_type(types, [0] * len(types), "")
    except InvalidFilterError:
        return None
