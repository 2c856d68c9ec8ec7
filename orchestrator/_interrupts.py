"""Ctrl-C held back over a few steps that must happen together (an epoch's checkpoint and its history line)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Run the block with SIGINT held: a Ctrl-C during it takes effect as it ends, as it would have at once.
    Only the main thread receives signals; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
            signal.SIG_IGN, None):
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)  # what it would have done at once (Python's own raises KeyboardInterrupt)
        else:
            raise KeyboardInterrupt  # the default action (SIG_DFL) would have ended the process
