"""Ctrl-C held over an epoch's checkpoint and history line (orchestrator/_interrupts.py)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from orchestrator._interrupts import held


def test_a_ctrl_c_inside_the_block_lets_it_finish_then_interrupts():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("checkpoint")
            done.append("history")
    assert done == ["checkpoint", "history"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_without_a_ctrl_c_nothing_changes_and_other_threads_run_the_block_as_it_is():
    with held():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    seen = []

    def elsewhere():
        with held():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]


def test_a_handler_of_the_callers_gets_the_held_ctrl_c_and_decides_what_it_does():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with held():
            os.kill(os.getpid(), signal.SIGINT)
            assert seen == []  # held
        assert seen == [signal.SIGINT]  # handed over as the block ended, and no KeyboardInterrupt of our own
    finally:
        signal.signal(signal.SIGINT, previous)
