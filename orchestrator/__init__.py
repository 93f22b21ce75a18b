"""wakeloop: a Claude agent that wakes on a schedule, works inside a fresh,
hardened container per tool call, journals, and sleeps."""

__version__ = "0.1.0"
