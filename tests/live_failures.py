"""pytest plugin: name every failed or errored case the moment it is reported.

``benchmarks/gpu_check.sh`` loads it (``-p tests.live_failures``) into every pytest it runs on
the GPU machine. pytest prints its failure list only at the end of a session, and a run that
its time limit kills (or a hung CUDA call that SIGINT cannot stop) ends without one: with this
plugin the log holds a line per failure as it happens::

    FAILED (live) tests/test_x.py::test_y[cuda] - tests/test_x.py:12: AssertionError: ...

Under pytest-xdist the controller prints the lines (the workers' reports reach it); a worker
prints nothing itself.
"""

from __future__ import annotations

import pytest


def describe(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    """The line for a failed report (None for any other): the node id, the phase when it is
    not the test itself, and the first line of the crash message where there is one."""
    if not report.failed:
        return None
    if isinstance(report, pytest.CollectReport):
        line = f"ERROR (live) collecting {report.nodeid or '<session>'}"
    else:
        fixture = report.when in ("setup", "teardown")  # else the test (a crash: "???")
        kind = "ERROR" if fixture else "FAILED"
        phase = f" (at {report.when})" if fixture else ""
        line = f"{kind} (live) {report.nodeid}{phase}"
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        message = (crash.message or "").strip().splitlines() or [""]
        line += f" - {crash.path}:{crash.lineno}: {message[0]}"
    elif isinstance(report.longrepr, str) and report.longrepr.strip():
        line += f" - {report.longrepr.strip().splitlines()[-1]}"  # e.g. a crashed xdist worker
    return line


class _LiveFailures:
    """Writes ``describe``'s line for each failed report through the terminal reporter."""

    def __init__(self, config: pytest.Config):
        self._config = config

    def _write(self, report) -> None:
        line = describe(report)
        if line is None:
            return
        terminal = self._config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            print(line, flush=True)
            return
        writer = terminal._tw
        if writer.width_of_current_line:  # after progress letters: a line of its own
            writer.line()
        writer.line(line)
        writer.flush()  # the log is a pipe: the line goes out now, not at the next test

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._write(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._write(report)


def pytest_configure(config: pytest.Config) -> None:
    """Registers the reporter, except in a pytest-xdist worker (the controller reports)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_LiveFailures(config), "fusedops-live-failures")
