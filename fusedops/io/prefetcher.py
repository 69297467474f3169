"""``Prefetcher``: the next batch is loaded (and, on CUDA, copied to the device on a side stream
from pinned memory) while the current one trains. The seed runtime's module path: ``from
torchacc.runtime.io.prefetcher import Prefetcher`` ports as ``from fusedops.io.prefetcher import
Prefetcher`` (``fusedops.io.Prefetcher`` too).

Two ways to drive it, the same batches either way:

* explicit (the seed API): ``prefetch_CPU()`` after backward loads the next batch from the loader
  in the calling thread (the GPU is still busy with backward); ``prefetch_GPU()`` after the
  optimizer step starts its copy to the device on a side stream and runs ``preprocess_fn``
  there;
* automatic (no explicit call in the epoch): a background thread loads (and pins) one batch
  ahead, and ``next()`` starts the copy of the following batch as soon as it has been loaded.
  The first explicit call of an epoch stops the thread after the batch it is loading.

Each epoch is a new ``iter(prefetcher)``. A loader exception is raised by the ``next()`` that
would have returned that batch, and ends the epoch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree

from fusedops.utils._streams import CudaStreams

#: Seconds between checks of the stop flag while the loading thread waits to hand a batch over.
_POLL_S = 0.05


class _End:
    """The loader is exhausted."""


class _Failed:
    """The loader raised ``error`` where the next batch was due."""

    def __init__(self, error: BaseException):
        self.error = error


class _Staged:
    """A batch on the device (preprocessed) and the event its copy recorded (None on CPU)."""

    def __init__(self, batch, event, host):
        self.batch, self.event, self.host = batch, event, host


def _next_item(iterator):
    """The loader's next batch, or ``_End`` / ``_Failed`` in its place."""
    try:
        return next(iterator)
    except StopIteration:
        return _End()
    except Exception as error:  # surfaced by the next() that would return this batch
        return _Failed(error)


class _Loader(threading.Thread):
    """Background thread: loads (and pins) batches into a one-slot queue until the loader ends,
    fails, or ``stop()`` is called."""

    def __init__(self, iterator, pin: Callable):
        super().__init__(name="fusedops-prefetch", daemon=True)
        self.iterator, self.pin = iterator, pin
        self.items: queue.Queue = queue.Queue(maxsize=1)
        self.stopping = threading.Event()
        self.leftover = None

    def run(self) -> None:
        while not self.stopping.is_set():
            item = _next_item(self.iterator)
            if not isinstance(item, (_End, _Failed)):
                try:
                    item = self.pin(item)
                except Exception as error:
                    item = _Failed(error)
            while True:
                if self.stopping.is_set():
                    self.leftover = item  # loaded after stop(): drain() hands it over
                    return
                try:
                    self.items.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, (_End, _Failed)):
                return

    def take(self, block: bool):
        """The next loaded item; None when ``block`` is False and none is ready."""
        while True:
            try:
                return self.items.get(timeout=_POLL_S) if block else self.items.get_nowait()
            except queue.Empty:
                if not block:
                    return None
                if not self.is_alive() and self.items.empty():
                    return _End()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop after the batch being loaded; wait for that at most ``timeout`` seconds."""
        self.stopping.set()
        self.join(timeout)

    def drain(self) -> list:
        """Stop, wait for the batch being loaded, and return every loaded item not taken yet,
        in loader order (nothing the thread took from the loader is lost)."""
        self.stop(timeout=None)
        items = []
        while not self.items.empty():
            items.append(self.items.get_nowait())
        if self.leftover is not None:
            items.append(self.leftover)
        return items


class Prefetcher:
    """Iterate over ``loader`` with the next batch loaded and copied to ``device`` ahead.

    loader: any iterable of batches (a ``DataLoader``...); a batch is a tensor or a nested
    tuple/list/dict of tensors (other leaves pass through). preprocess_fn: called on each batch
    after it reached the device (on the side stream on CUDA), e.g. normalisation; None keeps the
    batch. device: where batches go (default: the current CUDA device when CUDA is available,
    else CPU). On CUDA, host tensors are pinned, copied with ``non_blocking=True`` on a side
    stream, the consumer's stream waits for the copy's event and every device tensor is
    ``record_stream``-ed on it. On CPU nothing is copied: a plain iterator with the same API.

    Usage (explicit, as in the seed code)::

        prefetcher = Prefetcher(data_loader, preprocess_fn)
        for batch in prefetcher:
            loss = model(batch).loss
            loss.backward()
            prefetcher.prefetch_CPU()   # load the next batch while backward runs on the GPU
            optimizer.step()
            prefetcher.prefetch_GPU()   # start its copy to the GPU on the side stream

    Without the two calls it prefetches by itself (a background loading thread). Every batch is
    returned once, in loader order. ``close()`` (or leaving a ``with`` block) stops the thread
    of an epoch left early.
    """

    def __init__(self, loader, preprocess_fn: Callable | None = None, device=None):
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be iterable, got {type(loader).__name__}")
        if preprocess_fn is not None and not callable(preprocess_fn):
            raise TypeError(
                f"preprocess_fn must be callable or None, got {type(preprocess_fn).__name__}"
            )
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"device: not a torch device: {device!r}") from error
        self.loader = loader
        self.preprocess_fn = preprocess_fn
        self._streams = CudaStreams(self.device) if self.device.type == "cuda" else None
        self._side = None
        self._iterator = None
        self._thread: _Loader | None = None
        self._backlog: list = []  # batches the stopped thread had loaded, in order
        self._loaded = None  # the next batch on the host (or _End/_Failed), not yet copied
        self._staged: _Staged | _End | _Failed | None = None
        self._explicit = False

    # ----------------------------------------------------------------- epoch
    def __iter__(self) -> Prefetcher:
        self.close()
        self._iterator = iter(self.loader)
        self._loaded = self._staged = None
        self._backlog = []
        self._explicit = False
        self._thread = _Loader(self._iterator, self._pin)
        self._thread.start()
        return self

    def __next__(self):
        if self._iterator is None:
            raise TypeError("Prefetcher: call iter() (a for loop) before next()")
        if self._staged is None:
            self._stage(block=True)
        item, self._staged = self._staged, None
        if isinstance(item, (_End, _Failed)):
            self.close()
            self._iterator = None
            if isinstance(item, _Failed):
                raise item.error
            raise StopIteration
        batch = item.batch
        if self._streams is not None:
            current = self._streams.current()
            current.wait_event(item.event)
            self._streams.record(batch, current)
        if not self._explicit:
            self._stage(block=False)  # start the next copy if its batch is already loaded
        return batch

    def close(self) -> None:
        """Stop this epoch's loading thread (waits for the batch it is loading)."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.stopping.set()

    # -------------------------------------------------------------- explicit
    def prefetch_CPU(self) -> None:  # noqa: N802 - the seed API's name
        """Load the next batch from the loader now (after backward, before the optimizer step);
        pinned on CUDA. A loader exception is kept and raised by the ``next()`` of that batch.
        The first call of an epoch stops the background loading thread."""
        self._require_epoch("prefetch_CPU")
        self._explicit = True
        if self._loaded is None and self._staged is None:
            self._loaded = self._take_loaded(block=True)

    def prefetch_GPU(self) -> None:  # noqa: N802 - the seed API's name
        """Start copying the batch ``prefetch_CPU`` loaded to the device on the side stream and
        preprocess it there (after the optimizer step); loads it first if needed."""
        self._require_epoch("prefetch_GPU")
        self._explicit = True
        if self._staged is None:
            self._stage(block=True)

    # -------------------------------------------------------------- internals
    def _require_epoch(self, name: str) -> None:
        if self._iterator is None:
            raise TypeError(f"Prefetcher.{name}: call iter() (a for loop) first")

    def _pin(self, batch):
        if self.device.type != "cuda":
            return batch
        return pytree.tree_map(
            lambda t: (
                t.pin_memory()
                if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_pinned()
                else t
            ),
            batch,
        )

    def _take_loaded(self, block: bool):
        """The next host batch: from the thread in automatic mode (stopped once explicit), else
        loaded here. None when ``block`` is False and the thread has none ready."""
        if self._thread is not None and self._explicit:
            self._backlog.extend(self._thread.drain())
            self._thread = None
        if self._thread is not None:
            return self._thread.take(block)
        if self._backlog:
            return self._backlog.pop(0)
        if not block:
            return None
        item = _next_item(self._iterator)
        return item if isinstance(item, (_End, _Failed)) else self._pin(item)

    def _stage(self, block: bool) -> None:
        """Copy the loaded batch to the device (side stream) and preprocess it."""
        if self._loaded is None:
            self._loaded = self._take_loaded(block)
            if self._loaded is None:
                return
        host, self._loaded = self._loaded, None
        if isinstance(host, (_End, _Failed)):
            self._staged = host
            return
        try:
            self._staged = self._copy(host)
        except Exception as error:
            self._staged = _Failed(error)

    def _copy(self, host) -> _Staged:
        if self._streams is None:
            batch = self.preprocess_fn(host) if self.preprocess_fn is not None else host
            return _Staged(batch, None, None)
        if self._side is None:
            self._side = self._streams.side_streams(1)[0]
        self._side.wait_stream(self._streams.current())
        with self._streams.use(self._side):
            batch = pytree.tree_map(
                lambda t: (
                    t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t
                ),
                host,
            )
            if self.preprocess_fn is not None:
                batch = self.preprocess_fn(batch)
            event = self._streams.new_event()
            event.record(self._side)
        return _Staged(batch, event, host)
