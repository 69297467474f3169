"""Lowerings of FFTs and of dense linear algebra (factorizations, solves, inverses).

FFT ops compute the unnormalized transform and scale it as ATen's ``normalization`` says (0:
none, 1: by 1/sqrt(n), 2: by 1/n, n the product of the transformed signal sizes). Linear
algebra runs jax.numpy.linalg / jax.scipy.linalg (LAPACK on the CPU, as ATen); the ``info``
outputs of the ``*_ex`` ops are 0 (XLA has no error channel: a singular input gives inf/nan as
in ATen with ``check_errors=False``). Their backward formulas are decomposed by AOTAutograd into
products and solves, so they need no lowering of their own.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch

from fusedops.xla.lower_table import _HIGHEST, register

aten = torch.ops.aten


# ------------------------------------------------------------------------------------------ FFT
def _scaled(y, n: int, normalization: int):
    if normalization == 1:
        return y / jnp.asarray(math.sqrt(n), y.real.dtype)
    if normalization == 2:
        return y / jnp.asarray(n, y.real.dtype)
    return y


def _axes(dim, ndim: int) -> tuple[int, ...]:
    return tuple(d % ndim for d in dim)


@register(aten._fft_c2c.default)
def _fft_c2c(x, dim, normalization, forward):
    axes = _axes(dim, x.ndim)
    # the unnormalized inverse: numpy's "forward" convention puts the 1/n on the forward
    y = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scaled(y, math.prod(x.shape[a] for a in axes), normalization)


@register(aten._fft_r2c.default)
def _fft_r2c(x, dim, normalization, onesided):
    axes = _axes(dim, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    y = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return _scaled(y, n, normalization)


@register(aten._fft_c2r.default)
def _fft_c2r(x, dim, normalization, last_dim_size):
    axes = _axes(dim, x.ndim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _scaled(y, math.prod(sizes), normalization)


# ------------------------------------------------------------------------------- linear algebra
def _info(x, batch_dims: int = 2):
    """The ``info`` output of a ``*_ex`` op: zeros over x's batch dims (int32)."""
    return jnp.zeros(x.shape[: x.ndim - batch_dims], jnp.int32)


@register(aten.linalg_inv_ex.default)
def _inv_ex(a, *, check_errors=False):
    return jnp.linalg.inv(a), _info(a)


@register(aten.linalg_cholesky_ex.default)
def _cholesky_ex(a, *, upper=False, check_errors=False):
    low = jnp.linalg.cholesky(a)
    return (jnp.conj(jnp.swapaxes(low, -1, -2)) if upper else low), _info(a)


@register(aten.cholesky.default)
def _cholesky(a, upper=False):
    return _cholesky_ex(a, upper=upper)[0]


def _lu_of_transpose(a):
    """ATen's det/slogdet keep the LU factors of A^T (their backward solves with A^-T)."""
    lu, pivots = jsl.lu_factor(jnp.swapaxes(a, -1, -2))
    return lu, (pivots + 1).astype(jnp.int32)


@register(aten._linalg_det.default)
def _det(a):
    return jnp.linalg.det(a), *_lu_of_transpose(a)


@register(aten._linalg_slogdet.default)
def _slogdet(a):
    sign, logabsdet = jnp.linalg.slogdet(a)
    return sign, logabsdet, *_lu_of_transpose(a)


@register(aten.linalg_lu_factor_ex.default)
def _lu_factor_ex(a, pivot=True, check_errors=False):
    lu, pivots = jsl.lu_factor(a)
    return lu, (pivots + 1).astype(jnp.int32), _info(a)


@register(aten._linalg_solve_ex.default)
def _solve_ex(a, b, *, left=True, check_errors=False):
    """(result, LU, pivots, info) of ``linalg.solve``; b is a vector batch when it has one dim
    fewer than a (as ATen decides)."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    lu, pivots = jsl.lu_factor(a)
    pivots = (pivots + 1).astype(jnp.int32)
    rhs = b[..., None] if vector else b
    batch = jnp.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
    lu = jnp.broadcast_to(lu, (*batch, *a.shape[-2:]))
    pivots = jnp.broadcast_to(pivots, (*batch, pivots.shape[-1]))
    x = _lu_solve(lu, pivots, jnp.broadcast_to(rhs, (*batch, *rhs.shape[-2:])), left=left)
    return (x[..., 0] if vector else x), lu, pivots, _info(a)


@register(aten.linalg_solve_triangular.default)
def _solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    if not left:  # x a = b  <=>  a^T x^T = b^T (a^T has the other triangle)
        x = jsl.solve_triangular(
            jnp.swapaxes(a, -1, -2), jnp.swapaxes(b, -1, -2), lower=upper,
            unit_diagonal=unitriangular,
        )  # fmt: skip
        return jnp.swapaxes(x, -1, -2)
    return jsl.solve_triangular(a, b, lower=not upper, unit_diagonal=unitriangular)


@register(aten.triangular_solve.default)
def _triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    a_used = jnp.swapaxes(a, -1, -2) if transpose else a
    lower_tri = not upper if not transpose else upper
    x = jsl.solve_triangular(a_used, b, lower=lower_tri, unit_diagonal=unitriangular)
    return x, jnp.broadcast_to(a, (*x.shape[:-2], *a.shape[-2:]))


@register(aten.cholesky_solve.default)
def _cholesky_solve(b, factor, upper=False):
    low = jnp.conj(jnp.swapaxes(factor, -1, -2)) if upper else factor
    y = jsl.solve_triangular(low, b, lower=True)
    return jsl.solve_triangular(jnp.conj(jnp.swapaxes(low, -1, -2)), y, lower=False)


@register(aten.cholesky_inverse.default)
def _cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_solve(eye, factor, upper)


@register(aten._linalg_eigh.default)
def _eigh(a, UPLO="L", compute_v=True):
    values, vectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else jnp.zeros((0,), a.dtype))


@register(aten.linalg_qr.default)
def _qr(a, mode="reduced"):
    q, r = jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        return jnp.zeros((0,), a.dtype), r
    return q, r


#: torch's CPU LAPACK is MKL's (the x86 wheels): its gesdd takes other paths than reference
#: LAPACK's (JAX's on the CPU), so the singular vectors' signs differ unless the paths agree
_TORCH_MKL = torch.backends.mkl.is_available()


def _gesdd_rows(m: int, n: int) -> int | None:
    """Rows of zeros to append to an m x n matrix (None: none) so that reference LAPACK's
    gesdd takes the path MKL's gesdd takes for m x n (measured on MKL 2024.2, torch 2.13):

    - tall: MKL factors A = QR first from m >= int(1.5 n), reference LAPACK from
      m >= int(11 n / 6); zero rows up to the latter make it take the QR path too (Q's
      reflectors leave the zero rows alone: the first m rows of U are MKL's);
    - wide: MKL bidiagonalizes A itself up to n < 20 m (then A = LQ first, as reference does
      from n >= int(11 m / 6)); zero rows up to the first m' with n < int(11 m' / 6) make
      reference bidiagonalize too (the zero rows stay zero: the same reflectors, the
      appended rows' singular values 0). One shape has no such m': 2 x 3.
    """
    if m > n:
        reference = int(n * 11 / 6)
        return reference if int(1.5 * n) <= m < reference else None
    if m < 2 or n < int(m * 11 / 6) or n >= 20 * m:
        return None
    rows = m
    while int(rows * 11 / 6) <= n:
        rows += 1
    return rows if rows < n else None


def _svd_on_mkl_path(a, rows: int, full_matrices: bool):
    """``jnp.linalg.svd(a)`` through zero rows appended up to ``rows`` (``_gesdd_rows``)."""
    m, n = a.shape[-2:]
    widths = [(0, 0)] * (a.ndim - 2) + [(0, rows - m), (0, 0)]
    u, s, vh = jnp.linalg.svd(jnp.pad(a, widths), full_matrices=full_matrices)
    if m > n:
        return u[..., :m, :m] if full_matrices else u[..., :m, :n], s, vh
    u_a, s_a = u[..., :m, :m], s[..., :m]
    if full_matrices:
        # Vh's rows m..rows-1 belong to the appended rows' zero singular values, in the order
        # the bidiagonal solver sorted them; U's columns there are those rows' unit vectors
        # (+-e_k): put each row back in place k, as MKL has them
        back = jnp.matmul(u[..., m:rows, m:rows], vh[..., m:rows, :], precision=_HIGHEST)
        vh_a = jnp.concatenate([vh[..., :m, :], back, vh[..., rows:, :]], axis=-2)
    else:
        vh_a = vh[..., :m, :]
    # a zero singular value of A itself ties with the appended ones: its U column may be one
    # of theirs (zero in A's rows); such matrices take reference LAPACK's result
    ok = jnp.all(jnp.sum(u_a * jnp.conj(u_a), axis=-2).real > 0.5, axis=-1)

    def mixed():
        plain = jnp.linalg.svd(a, full_matrices=full_matrices)
        return tuple(
            jnp.where(ok.reshape(ok.shape + (1,) * (x.ndim - ok.ndim)), x, y)
            for x, y in zip((u_a, s_a, vh_a), plain)
        )

    return jax.lax.cond(jnp.all(ok), lambda: (u_a, s_a, vh_a), mixed)


@register(aten._linalg_svd.default)
def _svd(a, full_matrices=False, compute_uv=True, driver=None):
    """U, S, Vh as torch's CPU result: singular vectors are unique up to sign only and torch
    documents no sign; its LAPACK (MKL on x86) fixes them by the path its gesdd takes, which
    the CPU program takes too (``_gesdd_rows``). Same path, same signs, but where the
    algorithm's sign decisions are within rounding of a tie (LAPACK builds round differently:
    measured on random inputs up to 8 x 18, up to 0.5% of float64 and 2% of float32 matrices
    of a shape have a column of the other sign; torch's own float32 and float64 results
    differ far more often, in 40% of 8 x 15 matrices), and for 2 x 3 (about half the
    columns). Off the CPU, XLA's SVD as it is."""
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        empty = jnp.zeros((0,), a.dtype)
        return empty, s, empty

    def plain(x):
        return tuple(jnp.linalg.svd(x, full_matrices=full_matrices))

    rows = _gesdd_rows(*a.shape[-2:]) if _TORCH_MKL and not jnp.iscomplexobj(a) else None
    if rows is None:
        return plain(a)
    on_mkl_path = functools.partial(_svd_on_mkl_path, rows=rows, full_matrices=full_matrices)
    return jax.lax.platform_dependent(a, cpu=on_mkl_path, default=plain)


@register(aten.linalg_matrix_exp.default)
def _matrix_exp(a):
    return jsl.expm(a)


@register(aten.linalg_householder_product.default)
def _householder_product(a, tau):
    """Q = H_1 ... H_k, H_i = I - tau_i v_i v_i^H (v_i: column i of a below the diagonal, 1 on
    it), the first a.shape[-1] columns."""
    m, n = a.shape[-2:]
    q = jnp.broadcast_to(jnp.eye(m, dtype=a.dtype), (*a.shape[:-2], m, m))
    rows = jnp.arange(m)
    for i in range(tau.shape[-1]):
        v = jnp.where(rows > i, a[..., :, i], jnp.where(rows == i, 1, 0).astype(a.dtype))
        qv = jnp.matmul(q, v[..., None], precision=_HIGHEST)
        q = q - tau[..., i, None, None] * qv * jnp.conj(v)[..., None, :]
    return q[..., :, :n]


@register(aten.addbmm.default)
def _addbmm(x, a, b, *, beta=1, alpha=1):
    prod = jnp.sum(jnp.matmul(a, b, precision=_HIGHEST), axis=0) * alpha
    return prod if beta == 0 else prod + beta * x  # beta 0 ignores x (nan included), as ATen


def _adjoint(m):
    return jnp.conj(jnp.swapaxes(m, -1, -2))


@register(aten.linalg_lu_solve.default)
def _lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    """Solve op(A) X = B (left) or X op(A) = B with A = P L U given as ATen's (LU, pivots),
    op the adjoint when ``adjoint``."""
    factors = (lu, (pivots - 1).astype(jnp.int32))
    if left:
        return jsl.lu_solve(factors, b, trans=2 if adjoint else 0)
    # X op(A) = B  <=>  op(A)^H X^H = B^H
    return _adjoint(jsl.lu_solve(factors, _adjoint(b), trans=0 if adjoint else 2))


@register(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """Each input with size-1 dims inserted at its ``expand`` positions, multiplied, summed
    over ``sumdim`` (``nn.Bilinear``'s product)."""

    def grow(t, dims):
        for d in sorted(dims):
            t = jnp.expand_dims(t, d)
        return t

    product = grow(i1, expand1) * grow(i2, expand2) * grow(i3, expand3)
    return jnp.sum(product, axis=tuple(sumdim)) if sumdim else product


@register(aten.lu_unpack.default)
def _lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    """(P, L, U) with A = P L U from ATen's (LU, 1-based LAPACK pivots)."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_pivots:
        order = jnp.broadcast_to(jnp.arange(m), (*pivots.shape[:-1], m))
        for i in range(pivots.shape[-1]):  # the row swaps, in order
            j = pivots[..., i].astype(jnp.int32) - 1
            row_i = order[..., i]
            row_j = jnp.take_along_axis(order, j[..., None], axis=-1)[..., 0]
            order = order.at[..., i].set(row_j)
            order = jnp.where(jnp.arange(m) == j[..., None], row_i[..., None], order)
        # (P^T A)[i] = A[order[i]]: P[order[i], i] = 1
        p = jnp.swapaxes(jax.nn.one_hot(order, m, dtype=lu.dtype), -1, -2)
    else:
        p = jnp.zeros((0,), lu.dtype)
    if not unpack_data:
        empty = jnp.zeros((0,), lu.dtype)
        return p, empty, empty
    lower_part = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return p, lower_part, jnp.triu(lu[..., :k, :])


@register(aten.linalg_pinv.atol_rtol_tensor)
def _pinv(a, *, atol=None, rtol=None, hermitian=False):
    """Pseudo-inverse: singular values at most max(atol, rtol * the largest) count as zero
    (rtol default: eps * max(m, n) when atol is not given either, else 0)."""
    m, n = a.shape[-2:]
    if min(m, n) == 0:
        return jnp.zeros((*a.shape[:-2], n, m), a.dtype)
    if rtol is None:
        rtol = (jnp.finfo(a.dtype).eps * max(m, n)) if atol is None else 0.0
    atol = 0.0 if atol is None else atol
    if hermitian:
        s, u = jnp.linalg.eigh(a, symmetrize_input=False)
        vh = _adjoint(u) * jnp.sign(s)[..., :, None]
        s = jnp.abs(s)
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    cutoff = jnp.maximum(jnp.asarray(atol)[..., None], jnp.asarray(rtol)[..., None]
                         * jnp.max(s, axis=-1, keepdims=True))  # fmt: skip
    keep = s > cutoff
    inverse = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    return jnp.matmul(_adjoint(vh) * inverse[..., None, :], _adjoint(u), precision=_HIGHEST)


@register(aten.linalg_lu.default)
def _linalg_lu(a, *, pivot=True):
    lu, pivots = jsl.lu_factor(a)
    return _lu_unpack(lu, (pivots + 1).astype(jnp.int32))


@register(aten.linalg_eig.default)
def _eig(a):
    return jnp.linalg.eig(a)
