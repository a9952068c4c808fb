"""Waiting for a condition in a test: poll it and fail naming it, never sleep a fixed time hoping it
came true. The limits are generous (a loaded machine is slow, not wrong); a process that should
bring the condition about and exits without it fails the wait at once."""

import time


def wait_until(condition, what: str, *, timeout_s: float, interval_s: float = 0.05, process=None):
    """The first true value of `condition()`, polled every `interval_s`.

    Fails with "`what`: ..." after `timeout_s`, or as soon as `process` (a Popen) has exited while the
    condition is still false."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            value = condition()  # it may have come true just before the exit
            if value:
                return value
            raise AssertionError(f"{what}: its process exited (code {process.returncode}) before that")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout_s:.0f} s")
        time.sleep(interval_s)
