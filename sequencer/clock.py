"""The Gazette message Clock: a 60-bit v1 UUID timestamp plus a 4-bit counter.

A clock value counts 100 ns intervals since 1582-10-15 (the RFC 4122 epoch)
in its upper 60 bits; the low 4 bits are a sequence counter. Values are
compared as plain integers and give a total order over one producer's UUIDs.

Invariants (each is exercised by ``tests/test_sequencer/test_clock.py``):

* ``tick()`` adds exactly 160 (one microsecond: 10 units of 100 ns, shifted
  left by the 4 counter bits) and returns the new value.
* ``update(unix_ns)`` never moves the clock backwards; moving forwards it sets
  the timestamp to ``unix_ns`` truncated to 100 ns and zeroes the counter.
* ``Clock.from_unix_ns(t).as_unix_ns()`` is ``t`` truncated to 100 ns.

A Clock is not thread-safe (Gazette's uses atomics). Share one only between
publishers driven from the same thread.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["G1582_NS100", "TICK", "Clock", "clock_from_unix_ns"]

#: Clock increment of one ``tick()``: 1 µs = 10 units of 100 ns, times 16.
TICK = 160

#: 100 ns intervals between 1582-10-15 (RFC 4122 epoch) and 1970-01-01.
G1582_NS100 = 122_192_928_000_000_000


def clock_from_unix_ns(unix_ns: int) -> int:
    """Clock value (counter zero) of a Unix time in nanoseconds."""
    # Go's integer division truncates toward zero; keep that for pre-1970 times.
    ticks = unix_ns // 100 if unix_ns >= 0 else -((-unix_ns) // 100)
    return (ticks + G1582_NS100) << 4


@dataclass(slots=True, order=True)
class Clock:
    """A monotonic message clock, advanced by ``tick()`` and ``update()``."""

    value: int = 0

    @classmethod
    def from_unix_ns(cls, unix_ns: int) -> Clock:
        """A Clock set to ``unix_ns`` (Gazette's ``NewClock``)."""
        return cls(clock_from_unix_ns(unix_ns))

    def tick(self) -> int:
        """Advance by one microsecond and return the new value."""
        self.value += TICK
        return self.value

    def update(self, unix_ns: int) -> None:
        """Move the clock up to ``unix_ns`` if that is ahead of it."""
        nxt = clock_from_unix_ns(unix_ns)
        self.value = max(self.value, nxt)

    def as_unix_ns(self) -> int:
        """The wall time of this clock, in Unix nanoseconds (counter dropped)."""
        return ((self.value >> 4) - G1582_NS100) * 100
