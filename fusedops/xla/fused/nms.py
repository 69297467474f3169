"""The NMS ops in XLA: the static parts (``fusedops::nms``, ``fusedops::soft_nms``; no backward,
NMS is not differentiable) with the same outputs as the eager ops (see ``fusedops.ops.nms``).

nms walks the boxes in decreasing score order with ``lax.fori_loop``, each step removing the
later boxes of the same class that the box (if still kept) overlaps above the threshold.
soft-NMS runs ``lax.while_loop`` while boxes are left (at most N steps), each step picking the
best live score (lowest index on ties), which gives the picks of all classes already in
decreasing score order; a NaN-scored box is never live (count is -1 then).
IoU in fp32 (fp64 for fp64 boxes) with the reference's formula.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from fusedops.kernels.shared.nms_plan import GAUSSIAN, NAIVE
from fusedops.xla.lower_table import compute_dtype, register

fusedops = torch.ops.fusedops


def _areas(b, offset):
    return (b[:, 2] - b[:, 0] + offset) * (b[:, 3] - b[:, 1] + offset)


def _iou_with(b, area, i, offset):
    """IoU of box i with every box: (N,), NaN where the union is 0."""
    w = jnp.maximum(jnp.minimum(b[i, 2], b[:, 2]) - jnp.maximum(b[i, 0], b[:, 0]) + offset, 0)
    h = jnp.maximum(jnp.minimum(b[i, 3], b[:, 3]) - jnp.maximum(b[i, 1], b[:, 1]) + offset, 0)
    inter = w * h
    return inter / (area[i] + area - inter)


def _classes(idxs, n):
    return jnp.zeros((n,), jnp.int64) if idxs is None else idxs.astype(jnp.int64)


@register(fusedops.nms.default)
def nms(boxes, scores, idxs, iou_threshold, offset, backend=None):
    n = boxes.shape[0]
    if n == 0:
        return jnp.zeros((0,), jnp.int64), jnp.zeros((), jnp.int64)
    order = jnp.argsort(scores, descending=True, stable=True)
    b = boxes[order].astype(compute_dtype(boxes.dtype))
    classes = _classes(idxs, n)[order]
    area = _areas(b, offset)
    later = jnp.arange(n)

    def step(i, removed):
        hit = (_iou_with(b, area, i, offset) > iou_threshold) & (later > i)
        return removed | (hit & (classes == classes[i]) & ~removed[i])

    kept = ~lax.fori_loop(0, n, step, jnp.zeros((n,), bool))
    count = kept.sum(dtype=jnp.int64)
    keep = order[jnp.argsort(~kept, stable=True)].astype(jnp.int64)
    keep = jnp.where(later < count, keep, -1)
    return keep, jnp.where(jnp.isnan(scores).any(), -1, count)


def _weight(iou, iou_threshold, sigma, method):
    iou = jnp.where(jnp.isnan(iou), 0, iou)
    if method == GAUSSIAN:
        return jnp.exp(-(iou * iou) / sigma)
    decayed = jnp.zeros_like(iou) if method == NAIVE else 1 - iou
    return jnp.where(iou >= iou_threshold, decayed, 1)


@register(fusedops.soft_nms.default)
def soft_nms(boxes, scores, idxs, iou_threshold, sigma, min_score, method, offset, backend=None):
    n = boxes.shape[0]
    dtype = compute_dtype(boxes.dtype)
    if n == 0:
        return jnp.zeros((0,), jnp.int64), jnp.zeros((0,), dtype), jnp.zeros((), jnp.int64)
    b = boxes.astype(dtype)
    area = _areas(b, offset)
    classes = _classes(idxs, n)
    index = jnp.arange(n)

    def live_left(state):  # at most n steps, whatever the scores
        return state[1].any() & (state[4] < n)

    def step(state):
        score, live, picks, picked, k = state
        top = jnp.max(jnp.where(live, score, -jnp.inf))
        i = jnp.argmax(live & (score == top))  # first index among the best
        picks, picked = picks.at[k].set(i), picked.at[k].set(score[i])
        same = classes == classes[i]
        decayed = score * _weight(_iou_with(b, area, i, offset), iou_threshold, sigma, method)
        score = jnp.where(same, decayed, score)
        live = live & ~(same & ~(score >= min_score)) & (index != i)
        return score, live, picks, picked, k + 1

    start = (
        scores.astype(dtype),
        ~jnp.isnan(scores),  # a NaN-scored box is never picked (count is -1 anyway)
        jnp.full((n,), -1, jnp.int64),
        jnp.zeros((n,), dtype),
        jnp.zeros((), jnp.int64),
    )
    _, _, picks, picked, count = lax.while_loop(live_left, step, start)
    return picks, picked, jnp.where(jnp.isnan(scores).any(), -1, count)


def samples(name):
    """Arguments of ``fusedops::nms`` / ``soft_nms`` for the lowering test: overlapping random
    boxes (fp32 and fp16), with and without classes, offset 0 and 1, every soft-NMS method."""
    from fusedops.testing import random_tensor as r

    def boxes(n, dtype=torch.float32):
        corner = r((n, 2), low=0.0, high=20.0)
        return torch.cat([corner, corner + r((n, 2), low=1.0, high=12.0)], 1).to(dtype)

    def classes(n):
        return torch.randint(0, 3, (n,))

    if name == "nms":
        return [
            (boxes(40), r((40,), low=0.0, high=1.0), None, 0.5, 0),
            (boxes(33, torch.float16), r((33,), low=0.0, high=1.0), classes(33), 0.3, 1),
            (boxes(1), r((1,), low=0.0, high=1.0), None, 0.5, 0),
        ]
    return [
        (boxes(30), r((30,), low=0.0, high=1.0), None, 0.3, 0.5, 1e-3, method, offset)
        for method, offset in ((0, 0), (1, 1), (2, 0))
    ] + [(boxes(25), r((25,), low=0.0, high=1.0), classes(25), 0.3, 0.5, 1e-3, 1, 0)]
