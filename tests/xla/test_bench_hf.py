"""``bench_xla.py --hf``: the eight Hugging Face cases build and train (``Size.tiny()``: the
benchmark's structure at small widths), through the benchmark's own step function."""

from __future__ import annotations

import math
import subprocess

import pytest
import torch

from tests.xla.traced import no_cpu_tune  # noqa: F401

pytest.importorskip("jax")
pytest.importorskip("transformers")

from benchmarks import bench_xla, hf_models  # noqa: E402


def test_hf_flag_names_the_eight_models():
    assert [m.removeprefix("hf_") for m in bench_xla.HF_MODELS] == list(hf_models.NAMES)
    assert len(set(hf_models.NAMES)) == 8
    assert bench_xla.case_name("hf_bert", None, "float32") == "hf-bert-h256-l4-b8"


@pytest.mark.parametrize("name", hf_models.NAMES)
def test_hf_case_trains_one_step_eagerly(name):
    model, batch = hf_models.build(name, hf_models.Size.tiny())
    loss = model(batch)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    record = {}
    ms, compile_s = bench_xla.time_backend("eager", model, batch, steps=1, record=record)
    assert len(ms) == 1 and ms[0] > 0 and compile_s > 0
    assert record == {"picks": []}  # no partial_trace, no regions
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_hf_case_steps_under_partial_trace_as_eager():
    """The bench's xla step (partial_trace of the loss module) gives eager's loss and
    gradients; one forward and one backward program."""
    model, batch = hf_models.build("vit", hf_models.Size.tiny())
    eager_loss = model(batch)
    eager_loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    traced = bench_xla.make_forward("xla", model)
    loss = traced(batch)
    loss.backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-3, atol=1e-5, msg=name)
    assert traced.stats.programs == 2 and not traced.stats.eager_ops


@pytest.mark.parametrize("backend", bench_xla.BACKENDS)
def test_worker_runs_each_backend_in_openmps_defaults(monkeypatch, backend):
    """Each worker process gets no OMP_WAIT_POLICY (even where the caller's environment has
    one) unless asked; ``xla_jax_first`` imports jax before torch, the others torch first."""
    seen = {}

    def fake_run(command, env, **kwargs):
        seen.update(code=command[2], env=env)
        return subprocess.CompletedProcess(command, 0, 'RESULT {"ms": [1.0], "compile_s": 2.0}\n')

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    case = ["mlp", "4", "cpu", "float32"]
    assert bench_xla.run_worker(backend, case, 1, "") == {"ms": [1.0], "compile_s": 2.0}
    assert "OMP_WAIT_POLICY" not in seen["env"]
    jax_at, torch_at = seen["code"].find("import jax"), seen["code"].find("import torch")
    assert torch_at >= 0
    assert (0 <= jax_at < torch_at) == (backend == "xla_jax_first")
    bench_xla.run_worker(backend, case, 1, "PASSIVE")
    assert seen["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
