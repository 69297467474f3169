"""A recording stand-in for ``fusedops.utils._streams.CudaStreams``: the stream logic of
``multi_apply_multi_stream`` and ``Prefetcher`` runs on CPU and every stream operation lands in
``log`` in order, so the tests check the ordering a real CUDA run relies on."""

from __future__ import annotations

import contextlib

from fusedops.utils._streams import tensors_in


class FakeStream:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name, event.name))


class FakeEvent:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record_event", stream.name, self.name))


class FakeStreams:
    """Current stream "current", side streams "side0", "side1", ...; ``active`` is the stream
    work is queued on now."""

    def __init__(self):
        self.log: list = []
        self._current = FakeStream(self.log, "current")
        self.active = self._current
        self._side: list[FakeStream] = []
        self._events = 0

    def current(self) -> FakeStream:
        return self._current

    def side_streams(self, n: int) -> list[FakeStream]:
        while len(self._side) < n:
            self._side.append(FakeStream(self.log, f"side{len(self._side)}"))
        return self._side[:n]

    @contextlib.contextmanager
    def use(self, stream: FakeStream):
        previous, self.active = self.active, stream
        self.log.append(("enter", stream.name))
        try:
            yield
        finally:
            self.active = previous
            self.log.append(("exit", stream.name))

    def new_event(self) -> FakeEvent:
        self._events += 1
        return FakeEvent(self.log, f"event{self._events}")

    def record(self, tree, stream: FakeStream) -> None:
        for t in tensors_in(tree):
            self.log.append(("record_stream", id(t), stream.name))
