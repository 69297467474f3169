"""The dispatch rule answers as it did before backends became registered objects: every op's
automatic pick and every forced backend, with their errors and warnings, under every switch of
``tests/dispatch_cases.py``, equal the table recorded from the code at d35f0b7."""

import gzip
import json
from pathlib import Path

import pytest

from fusedops import dispatch
from fusedops.kernels.cuda import build
from tests.dispatch_cases import observe

RECORDED = Path(__file__).with_name("data") / "dispatch_before_backends.json.gz"
FAILED = "CUDA extension build failed: boom"


class _Controls:
    """The switches of ``observe`` on registered backends (monkeypatch undoes them)."""

    def __init__(self, monkeypatch):
        self.patch = monkeypatch
        self.cuda = dispatch.get_backend("cuda")
        self.triton = dispatch.get_backend("triton")

    def cuda_build(self, ok):
        state = None if ok else FAILED
        self.patch.setattr(build, "known_state", lambda: state)
        self.patch.setattr(self.cuda, "probe_build", lambda: state)

    def triton_installed(self, ok):
        missing = None if ok else "triton is not installed"
        self.patch.setattr(self.triton, "missing", lambda: missing)

    def verified(self, pairs):
        check = lambda name, backend: pairs is None or (name, backend) in pairs  # noqa: E731
        self.patch.setattr(dispatch, "gpu_verified", check)

    def forget_warnings(self):
        dispatch._warned_unverified.clear()

    def restore(self):
        pass  # monkeypatch restores at the end of the test


def _recorded() -> dict:
    return json.loads(gzip.decompress(RECORDED.read_bytes()))


#: An op of d35f0b7 with kernels of both families: an op registered since (no recorded row)
#: must be available as it is.
TEMPLATE_OP = "quick_gelu"


def _recorded_ops_only(availability: dict, recorded: dict) -> dict:
    """``availability()`` (op -> backend -> state) restricted to the ops the recorded table
    has; an op registered since d35f0b7 has no recorded row, and must read as TEMPLATE_OP does
    (checked here)."""
    for op, row in availability.items():
        if op not in recorded:
            assert row == availability[TEMPLATE_OP], (op, row)
    return {op: row for op, row in availability.items() if op in recorded}


def test_every_answer_is_the_recorded_one(monkeypatch):
    monkeypatch.setattr(dispatch, "_warned_unverified", set())
    now = json.loads(json.dumps(observe(_Controls(monkeypatch)), sort_keys=True))
    before = _recorded()
    availability = "availability, build failed"
    now[availability] = _recorded_ops_only(now[availability], before[availability])
    assert now.keys() == before.keys()
    differ = [
        (switches, case, before[switches].get(case), answers)
        for switches, rows in now.items()
        for case, answers in rows.items()
        if before[switches].get(case) != answers
    ]
    assert not differ, f"{len(differ)} answers differ, the first: {differ[0]}"


def test_the_comparison_sees_a_changed_answer(monkeypatch):
    """The table is not vacuous: a rule that prefers triton over cuda differs from it."""
    before = _recorded()
    key = "build=ok triton=yes UNVERIFIED=1 INTERPRET=0 verified=all"
    assert before[key]["cuda: quick_gelu float32"]["auto"] == {"picked": "cuda"}
    monkeypatch.setattr(dispatch.get_backend("triton"), "priority", -1)
    for op in dispatch.registered_ops().values():
        op._plan = None
    monkeypatch.setattr(dispatch, "_warned_unverified", set())
    now = observe(_Controls(monkeypatch))
    assert now[key]["cuda: quick_gelu float32"]["auto"] == {"picked": "triton"}
    for op in dispatch.registered_ops().values():
        op._plan = None


@pytest.mark.parametrize("failed", [False, True])
def test_availability_matches(monkeypatch, failed):
    """``availability()`` as recorded, whichever build state (the recorded one is a failed
    build; a working one reads "available" there)."""
    controls = _Controls(monkeypatch)
    controls.cuda_build(not failed)
    controls.triton_installed(True)
    expected = _recorded()["availability, build failed"]
    if not failed:
        for row in expected.values():
            if row["cuda"] == FAILED:
                row["cuda"] = "available"
    assert _recorded_ops_only(dispatch.availability(), expected) == expected
