"""When and how often a dropped replication connection is re-established.

``ReconnectPolicy`` is exponential backoff with a cap, limited by a number of attempts and/or a
deadline (at least one of them: a session never retries forever in silence). ``Backoff`` walks
one outage through the policy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["NO_RECONNECT", "Backoff", "ReconnectPolicy"]


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """Exponential backoff for reconnects.

    The first attempt waits ``initial_delay`` seconds, each next one ``multiplier`` times longer,
    at most ``max_delay``, each spread by up to ``jitter`` (a fraction) either way. The session
    gives up after ``max_attempts`` failed attempts or once ``deadline`` seconds have passed
    since the connection dropped, whichever comes first; ``None`` disables that limit, but not
    both. ``max_attempts=0`` turns reconnecting off.
    """

    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    max_attempts: int | None = 10
    deadline: float | None = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.max_attempts is None and self.deadline is None:
            raise ValueError(
                "a ReconnectPolicy needs max_attempts or deadline (or both): without either a "
                "session would retry forever"
            )
        if self.max_attempts is not None and self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, not {self.max_attempts}")
        if self.deadline is not None and self.deadline < 0:
            raise ValueError(f"deadline must be >= 0 seconds, not {self.deadline}")
        if self.initial_delay < 0 or self.max_delay < self.initial_delay:
            raise ValueError(
                f"need 0 <= initial_delay <= max_delay, got {self.initial_delay} and "
                f"{self.max_delay}"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, not {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), not {self.jitter}")

    def describe(self) -> str:
        limits = []
        if self.max_attempts is not None:
            limits.append(f"{self.max_attempts} attempts")
        if self.deadline is not None:
            limits.append(f"{self.deadline:g}s")
        return " / ".join(limits)


NO_RECONNECT = ReconnectPolicy(max_attempts=0, deadline=None)


class Backoff:
    """One outage: how long to wait before each next attempt, or None once it is time to stop."""

    __slots__ = ("_clock", "_delay", "_random", "attempts", "policy", "started")

    def __init__(
        self,
        policy: ReconnectPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._random = rng or random.Random()
        self.started = clock()
        self.attempts = 0
        self._delay = policy.initial_delay

    def elapsed(self) -> float:
        return self._clock() - self.started

    def next_delay(self) -> float | None:
        """Seconds to sleep before the next attempt, or None when the policy is exhausted."""
        policy = self.policy
        if policy.max_attempts is not None and self.attempts >= policy.max_attempts:
            return None
        delay = self._delay
        if policy.jitter:
            delay *= 1 + self._random.uniform(-policy.jitter, policy.jitter)
        if policy.deadline is not None:
            remaining = policy.deadline - self.elapsed()
            if remaining <= 0:
                return None
            delay = min(delay, remaining)
        self.attempts += 1
        self._delay = min(self._delay * policy.multiplier, policy.max_delay)
        return max(delay, 0.0)
