"""Prefetcher: every batch once, in order, preprocessed; explicit prefetch_CPU/prefetch_GPU and
automatic mode; loader errors at their batch; the CUDA stream ordering through a recording
stand-in on CPU, and on a real device in the gpu tests."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fusedops.io import Prefetcher
from fusedops.testing import random_tensor
from tests.fake_streams import FakeStreams

CPU = torch.device("cpu")


def _batches(n: int) -> list:
    """Nested batches: a dict holding a tensor, a tuple (tensor, list of tensor and int), a tag."""
    return [
        {
            "x": random_tensor((3, 4), device=CPU),
            "pair": (random_tensor((2,), device=CPU), [random_tensor((5,), device=CPU), i]),
            "index": i,
        }
        for i in range(n)
    ]


def _double(batch):
    return {**batch, "x": batch["x"] * 2}


def _assert_batch(got, want, preprocessed: bool = True) -> None:
    assert got["index"] == want["index"]
    assert torch.equal(got["x"], want["x"] * 2 if preprocessed else want["x"])
    assert torch.equal(got["pair"][0], want["pair"][0])
    assert torch.equal(got["pair"][1][0], want["pair"][1][0])
    assert got["pair"][1][1] == want["index"]


def _no_prefetch_threads() -> bool:
    return not any(t.name == "fusedops-prefetch" for t in threading.enumerate())


def _schedules(n: int):
    """When the explicit calls are made: never, always, only one of them, or irregularly."""
    return {
        "automatic": [(False, False)] * n,
        "both": [(True, True)] * n,
        "cpu_only": [(True, False)] * n,
        "gpu_only": [(False, True)] * n,
        "mixed": [(i % 2 == 0, i % 3 == 0) for i in range(n)],
    }


@pytest.mark.parametrize("schedule", list(_schedules(0)))
def test_every_batch_once_in_order_over_two_epochs(schedule):
    data = _batches(7)
    prefetcher = Prefetcher(data, _double, device=CPU)
    for _epoch in range(2):
        seen = []
        for i, batch in enumerate(prefetcher):
            seen.append(batch["index"])
            _assert_batch(batch, data[batch["index"]])
            cpu, gpu = _schedules(len(data))[schedule][i]
            if cpu:
                prefetcher.prefetch_CPU()
            if gpu:
                prefetcher.prefetch_GPU()
        assert seen == list(range(len(data)))
    assert _no_prefetch_threads()


class _Numbers(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((2,), float(i)), "i": i}


def test_dataloader_with_workers_and_explicit_calls():
    loader = DataLoader(_Numbers(10), batch_size=3, num_workers=2)
    prefetcher = Prefetcher(loader, device=CPU)
    seen = []
    for batch in prefetcher:
        seen += batch["i"].tolist()
        assert torch.equal(batch["x"][:, 0], batch["i"].float())
        prefetcher.prefetch_CPU()
        prefetcher.prefetch_GPU()
    assert seen == list(range(10))


@pytest.mark.parametrize("explicit", [False, True])
def test_loader_error_surfaces_at_its_batch(explicit):
    data = _batches(5)

    class Failing:
        def __iter__(self):
            yield from data[:3]
            raise RuntimeError("bad record 3")

    prefetcher = Prefetcher(Failing(), device=CPU)
    seen = []
    with pytest.raises(RuntimeError, match="bad record 3"):
        for batch in prefetcher:
            seen.append(batch["index"])
            if explicit:
                prefetcher.prefetch_CPU()
                prefetcher.prefetch_GPU()
    assert seen == [0, 1, 2]
    assert _no_prefetch_threads()


def test_automatic_mode_loads_ahead_in_a_thread():
    """Without explicit calls the next batch is loaded by the background thread while the
    consumer holds the current one (checked with events, not timing)."""
    loaded = [threading.Event() for _ in range(4)]
    consumer_has_batch_0 = threading.Event()

    def loader():
        for i in range(4):
            if i == 1:  # loaded while the consumer still holds batch 0
                assert consumer_has_batch_0.wait(timeout=10)
            loaded[i].set()
            yield i

    prefetcher = Prefetcher(_Iterable(loader), device=CPU)
    it = iter(prefetcher)
    assert next(it) == 0
    consumer_has_batch_0.set()
    assert loaded[1].wait(timeout=10), "batch 1 was not loaded ahead"
    assert [next(it) for _ in range(3)] == [1, 2, 3]  # (list(it) would start a new epoch)
    with pytest.raises(StopIteration):
        next(it)
    assert _no_prefetch_threads()


class _Iterable:
    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return self.make()


def test_leaving_an_epoch_early_and_close_stop_the_thread():
    prefetcher = Prefetcher(_batches(6), device=CPU)
    with prefetcher:
        for batch in prefetcher:
            if batch["index"] == 1:
                break
    assert _no_prefetch_threads()
    assert [b["index"] for b in prefetcher] == list(range(6))  # a new epoch starts over


def test_stream_ordering_with_fake_cuda_streams():
    """The CUDA path on CPU: the copy and preprocess run on the side stream after it waited
    for the consumer's stream; the event is recorded after them; the consumer waits on that
    event and record_streams every tensor of the batch before getting it."""
    data = _batches(4)
    prefetcher = Prefetcher(data, _double, device=CPU)
    streams = prefetcher._streams = FakeStreams()
    for i, batch in enumerate(prefetcher):
        _assert_batch(batch, data[i])
        log = streams.log
        waits = [k for k, e in enumerate(log) if e[0] == "wait_event" and e[1] == "current"]
        event = log[waits[-1]][2]
        recorded = [k for k, e in enumerate(log) if e[0] == "record_event" and e[2] == event]
        assert len(recorded) == 1 and log[recorded[0]][1] == "side0"
        enter = max(k for k in range(recorded[0]) if log[k] == ("enter", "side0"))
        assert log[enter - 1] == ("wait_stream", "side0", "current")
        tensors = {id(batch["x"]), id(batch["pair"][0]), id(batch["pair"][1][0])}
        marked = {e[1] for e in log[waits[-1] :] if e[0] == "record_stream" and e[2] == "current"}
        assert tensors <= marked
        if i % 2:
            prefetcher.prefetch_CPU()
            prefetcher.prefetch_GPU()


def test_bad_arguments():
    with pytest.raises(TypeError, match="loader"):
        Prefetcher(42)
    with pytest.raises(TypeError, match="preprocess_fn"):
        Prefetcher([], preprocess_fn=3)
    with pytest.raises(ValueError, match="device"):
        Prefetcher([], device="not-a-device")
    with pytest.raises(TypeError, match="iter"):
        Prefetcher([], device=CPU).prefetch_CPU()


@pytest.mark.gpu
@pytest.mark.parametrize("explicit", [False, True])
def test_cuda_batches_arrive_on_the_device(explicit):
    data = _batches(6)
    prefetcher = Prefetcher(data, _double, device="cuda")
    seen = []
    for batch in prefetcher:
        assert batch["x"].is_cuda and batch["pair"][1][0].is_cuda
        host = {**batch, "x": batch["x"].cpu() / 2}
        _assert_batch(
            {
                "x": host["x"],
                "pair": (batch["pair"][0].cpu(), [batch["pair"][1][0].cpu(), batch["pair"][1][1]]),
                "index": batch["index"],
            },
            data[batch["index"]],
            preprocessed=False,
        )
        torch.cuda._sleep(1_000_000)  # a busy consumer stream while the next copy runs
        seen.append(batch["index"])
        if explicit:
            prefetcher.prefetch_CPU()
            prefetcher.prefetch_GPU()
    assert seen == list(range(6))
