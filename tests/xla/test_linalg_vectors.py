"""Eigen- and singular-vector-valued ops through ``partial_trace(fullgraph=True)`` against eager
(issue 29 item 5).

Singular vectors and eigenvectors are unique up to sign (a phase for complex ones) only, so
most tests compare what is invariant: values, the projector onto each eigenvalue cluster
(``V_c V_c^T``), the reconstruction (``U S Vh``, ``V diag(w) V^T``), orthonormality, for
``eig`` the residual ``A v - w v`` of unit vectors. The SVD lowering also takes the path
torch's CPU LAPACK takes (``fusedops.xla.lower_linalg._svd``), so where the sign decisions are
not within rounding of a tie U and Vh equal eager's elementwise: ``test_svd_vectors_equal_eager``
on matrices with at most 3 rows or columns (measured: no sign differed in about 28,000 random
ones per dtype up to 8 x 18, 2 x 3 excepted; larger ones differ in up to a few percent).

Tolerances follow ``fusedops.testing.tolerance``: values within roundoff of the matrix norm
(``terms``: the length of the sums behind one entry); a vector or projector within roundoff
times the norm over the gap that separates its value from the others (Davis-Kahan: the
perturbation of an invariant subspace is at most the perturbation of the matrix over that gap).
"""

from __future__ import annotations

import pytest
import torch

from fusedops.testing import assert_close, random_tensor
from tests.xla.traced import no_cpu_tune  # noqa: F401

pytest.importorskip("jax")

from fusedops.xla import partial_trace  # noqa: E402

DEVICE = "cpu"  # the XLA CPU programs against torch's CPU LAPACK


def _traced(fn, *args):
    torch._dynamo.reset()
    traced = partial_trace(fn, fullgraph=True)
    out = traced(*args)
    assert traced.stats.programs >= 1 and not traced.stats.eager_ops
    return out


def _separation(values: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
    """Per matrix, the smallest distance between two of ``values`` (last dim), and to
    ``extra`` (per matrix: another value the vectors must be told from, e.g. 0)."""
    diff = (values[..., :, None] - values[..., None, :]).abs()
    diff = diff.masked_fill(torch.eye(values.shape[-1], dtype=torch.bool), torch.inf)
    gap = diff.amin(dim=(-2, -1))
    if extra is not None:
        gap = torch.minimum(gap, (values - extra[..., None]).abs().amin(-1))
    return gap


def _over_gap(norm: torch.Tensor, gap: torch.Tensor) -> torch.Tensor:
    """The magnitude of a vector entry's error per matrix (shaped to broadcast over one):
    the matrix norm over the gap of its value."""
    return (norm / gap)[..., None, None]


# ------------------------------------------------------------------------------------------- SVD
# (shape, full_matrices): tall (MKL's QR path below reference LAPACK's threshold, and both QR),
# square, wide (bidiagonalized directly, as MKL does, and by LQ first, n >= 20 m), batched
SIGN_CASES = [
    ((4, 3), False),
    ((5, 3), True),
    ((3, 3), False),
    ((3, 5), False),
    ((3, 5), True),
    ((2, 17), True),
    ((3, 40), False),
    ((2, 45), True),
    ((1, 6), False),
    ((4, 2, 5), True),
    ((4, 3, 14), False),
    ((4, 6, 3), True),
    ((4, 3, 1), False),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(("shape", "full"), SIGN_CASES, ids=str)
def test_svd_vectors_equal_eager(shape, full, dtype):
    """U and Vh as eager's, elementwise. In float32 a sign decision within rounding of a tie
    flips a singular vector in about 1 to 4 of 20,000 random matrices of these shapes (measured
    2026-11-25; none in float64): float32 vectors are compared after taking eager's sign (the
    pair u_i, vh_i together, so U S Vh is unchanged)."""
    a = random_tensor(shape, dtype, DEVICE)
    u, s, vh = torch.linalg.svd(a, full_matrices=full)
    got = list(_traced(lambda t: torch.linalg.svd(t, full_matrices=full), a))
    if dtype == torch.float32:
        k = s.shape[-1]
        sign = torch.where((got[0][..., :, :k] * u[..., :, :k]).sum(-2) < 0, -1.0, 1.0)
        got[0] = torch.cat([got[0][..., :, :k] * sign[..., None, :], got[0][..., :, k:]], -1)
        got[2] = torch.cat([got[2][..., :k, :] * sign[..., :, None], got[2][..., k:, :]], -2)
    m, n = shape[-2:]
    norm = s[..., 0]
    assert_close(got[1], s, terms=max(m, n), magnitude=norm[..., None], msg="S")
    # a singular vector moves by roundoff * norm / (its distance to the other singular values,
    # and to 0 where U or Vh has more rows or columns than there are singular values)
    zero = torch.zeros_like(norm) if m != n else None
    magnitude = _over_gap(norm, _separation(s, zero))
    assert_close(got[0], u, terms=max(m, n), magnitude=magnitude, msg="U")
    assert_close(got[2], vh, terms=max(m, n), magnitude=magnitude, msg="Vh")


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((8, 17), torch.float32), ((20, 44), torch.float32), ((60, 40), torch.float64)],
    ids=str,
)
def test_svd_invariants_match_eager(shape, dtype):
    """Larger shapes, where LAPACK builds' rounding can flip a sign: U S Vh gives back A, U
    and Vh are orthonormal, and each singular vector's projector is eager's."""
    a = random_tensor((2, *shape), dtype, DEVICE)
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    tu, ts, tvh = _traced(lambda t: torch.linalg.svd(t, full_matrices=False), a)
    m, n = shape
    k = min(m, n)
    norm = s[..., 0]
    assert_close(ts, s, terms=max(m, n), magnitude=norm[..., None], msg="S")
    assert_close((tu * ts[..., None, :]) @ tvh, a, terms=max(m, n), magnitude=norm[..., None, None])
    eye = torch.eye(k, dtype=dtype, device=DEVICE).expand(2, k, k)
    assert_close(tu.mT @ tu, eye, terms=max(m, n), msg="U^T U")
    assert_close(tvh @ tvh.mT, eye, terms=max(m, n), msg="Vh Vh^T")
    magnitude = _over_gap(norm, _separation(s, torch.zeros_like(norm)))
    for got, want in ((tu.mT, u.mT), (tvh, vh)):  # rows: the singular vectors
        projector = got[..., :, :, None] * got[..., :, None, :]  # per vector u_j: u_j u_j^T
        expected = want[..., :, :, None] * want[..., :, None, :]
        assert_close(projector, expected, terms=max(m, n), magnitude=magnitude[..., None])


def test_svd_of_a_matrix_with_zero_singular_values():
    """Zero rows tie with the zero rows the wide path appends: the result is still an SVD
    (reference LAPACK's), orthonormal, with eager's singular values."""
    a = random_tensor((3, 3, 9), torch.float64, DEVICE)
    a[0, 1] = 0
    a[1] = 0
    u, s, vh = _traced(lambda t: torch.linalg.svd(t, full_matrices=True), a)
    assert_close(s, torch.linalg.svdvals(a), terms=9, magnitude=9.0)
    assert_close((u * s[..., None, :]) @ vh[..., :3, :], a, terms=9, magnitude=9.0)
    assert_close(u.mT @ u, torch.eye(3, dtype=torch.float64).expand(3, 3, 3), terms=9)
    assert_close(vh @ vh.mT, torch.eye(9, dtype=torch.float64).expand(3, 9, 9), terms=9)


@pytest.mark.parametrize("name", ["svd_lowrank", "pca_lowrank"])
def test_lowrank_of_an_exactly_low_rank_matrix_matches_eager(name):
    """svd_lowrank / pca_lowrank of a rank-q matrix with q columns asked for: U V^T and S are
    eager's whatever the random basis (it draws from JAX's generator in the program)."""
    a = random_tensor((2, 6, 2), torch.float32, DEVICE)
    b = random_tensor((2, 4, 2), torch.float32, DEVICE)

    def fn(x, y):
        u, s, v = getattr(torch, name)(x @ y.mT, q=2)
        return u @ v.mT, s

    want = fn(a, b)
    got = _traced(fn, a, b)
    s = want[1]
    norm = s[..., 0]
    assert_close(got[1], s, terms=24, magnitude=norm[..., None], msg="S")
    magnitude = _over_gap(norm, _separation(s, torch.zeros_like(norm)))
    assert_close(got[0], want[0], terms=24, magnitude=magnitude, msg="U V^T")


# ------------------------------------------------------------------------------------------ eigh
def _clusters(w: torch.Tensor, tol: float) -> list[list[int]]:
    """Indices of sorted eigenvalues ``w`` (one matrix) grouped where neighbours are within
    ``tol``."""
    groups = [[0]]
    for i in range(1, w.numel()):
        if float(w[i] - w[i - 1]) <= tol:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [3, 8, 30])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_projectors_match_eager(n, uplo, dtype):
    """Eigenvalues, V diag(w) V^T, V^T V = I and the projector onto each cluster of
    eigenvalues (a repeated one included) as eager's. torch's MKL solves n <= 25 by another
    tridiagonal method than reference LAPACK: the signs differ there (not compared).

    The solver applies about n orthogonal transformations (reflections, rotation sweeps) of
    n-term sums to every entry: ``terms=n * n``. V diag(w) V^T and each projector carry three
    error sources (the backward error E in A + E = Q diag(w) Q^T, and V - Q on either side),
    V^T V two (V - Q on either side). With ``terms=n`` and one source, 3 x 3 float32 matrices
    failed (1.14x the bound, seed 3014249972); eager's own eigh measured up to 20 u ||A||."""
    a = random_tensor((3, n, n), dtype, DEVICE)  # eigh reads one triangle: a[0] as it is
    a[2] = a[2] + a[2].mT
    # a[1] = Q diag(0, 0, 2, 3, ...) Q^T: a repeated eigenvalue
    q = torch.linalg.qr(random_tensor((n, n), torch.float64, DEVICE))[0]
    d = torch.arange(n, dtype=torch.float64)
    d[1] = d[0]
    a[1] = ((q * d) @ q.mT).to(dtype)
    w, v = torch.linalg.eigh(a, UPLO=uplo)
    tw, tv = _traced(lambda t: torch.linalg.eigh(t, UPLO=uplo), a)
    full = a.tril() + a.tril(-1).mT if uplo == "L" else a.triu() + a.triu(1).mT
    norm = torch.linalg.matrix_norm(full.double(), 2).to(dtype)
    terms = n * n
    assert_close(tw, w, terms=terms, magnitude=norm[..., None], msg="eigenvalues")
    reconstructed = (tv * tw[..., None, :]) @ tv.mT
    magnitude = norm[..., None, None]
    assert_close(reconstructed, full, scale=3, terms=terms, magnitude=magnitude, msg="V w V^T")
    eye = torch.eye(n, dtype=dtype, device=DEVICE).expand(3, n, n)
    assert_close(tv.mT @ tv, eye, scale=2, terms=terms, msg="V^T V")
    rtol = 4 * torch.finfo(dtype).eps * n
    for i in range(3):
        groups = _clusters(w[i].double(), rtol * float(norm[i]))
        # the gap separating each cluster from the rest
        for j, group in enumerate(groups):
            left = float(w[i, group[0]] - w[i, groups[j - 1][-1]]) if j else float("inf")
            right = (
                float(w[i, groups[j + 1][0]] - w[i, group[-1]])
                if j + 1 < len(groups)
                else float("inf")
            )
            gap = min(left, right)
            got = tv[i][:, group] @ tv[i][:, group].mT
            want = v[i][:, group] @ v[i][:, group].mT
            magnitude = float(norm[i]) / gap if gap < float("inf") else 1.0
            assert_close(
                got, want, scale=3, terms=terms, magnitude=magnitude, msg=f"projector {i} {group}"
            )


# ------------------------------------------------------------------------------------------- eig
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [4, 9])
def test_eig_values_and_residuals(n, dtype):
    """linalg.eig: eager's eigenvalues (each within roundoff x norm x its condition number
    ||x|| ||y|| / |y^H x|, from eager's left and right vectors), and the program's vectors are
    unit eigenvectors of A (A v = w v within roundoff x norm x that condition number)."""
    a = random_tensor((2, n, n), dtype, DEVICE)
    w, v = torch.linalg.eig(a)
    tw, tv = _traced(torch.linalg.eig, a)
    assert tw.dtype == w.dtype and tv.dtype == v.dtype
    left = torch.linalg.inv(v.to(torch.complex128))  # rows: y_i^H with y_i^H x_i = 1
    condition = left.abs().square().sum(-1).sqrt() * v.abs().square().sum(-2).sqrt()
    norm = torch.linalg.matrix_norm(a.double(), 2)
    real = torch.float64 if dtype == torch.float64 else torch.float32
    for i in range(2):
        # the program's eigenvalue nearest each of eager's, one for one
        nearest = (w[i][:, None] - tw[i][None, :]).abs().argmin(-1)
        assert sorted(nearest.tolist()) == list(range(n)), (w[i], tw[i])
        bound = (norm[i] * condition[i]).to(real)
        assert_close(tw[i][nearest].real, w[i].real, terms=n, magnitude=bound, msg="Re w")
        assert_close(tw[i][nearest].imag, w[i].imag, terms=n, magnitude=bound, msg="Im w")
        residual = a[i].to(tv.dtype) @ tv[i] - tv[i] * tw[i][None, :]
        zero = torch.zeros(n, n, dtype=real)
        magnitude = (norm[i] * condition[i][nearest.argsort()]).to(real)[None, :]
        # the eigensolver's error, as eigh's below: about n orthogonal transformations of
        # n-term sums per entry (terms n * n), from 3 sources (Hessenberg reduction, the Schur
        # iterations, the vectors' back-substitution and back-transformation). At terms n
        # (12-16 u x norm x condition) the tail went over: of 40,000 matrices a case, n = 4
        # float64's 99.9th percentile 13.9 u, its worst 25.9 u; that worst uses 0.43 of this.
        assert_close(
            residual.abs(), zero, scale=3, terms=n * n, magnitude=magnitude, msg="A v - w v"
        )
        assert_close(tv[i].abs().square().sum(0), torch.ones(n, dtype=real), terms=n, msg="|v|")
