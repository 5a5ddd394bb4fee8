"""GP conditioning (cate_function_gp.md §6.2, §7): incremental factor, joint law, edge cases.

The distributional test whitens many simulated sequential paths with the full jittered
covariance and tests ``E[z z^T] = I`` with the likelihood-ratio statistic
``n (tr S - log det S - d) ~ chi2(d (d + 1) / 2)``; false-failure rate ALPHA = 1e-6. Its power
is shown on a broken conditioning (prior draws that ignore the stored values).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from scipy import stats

from service.mechanisms import gp

ALPHA = 1e-6
H = 0.4


def _points(rng: np.random.Generator, m: int, q: int = 2) -> np.ndarray:
    return rng.uniform(0, 1, size=(m, q))


def test_incremental_factor_equals_full_cholesky() -> None:
    rng = np.random.default_rng(1)
    path = gp.GpPath(2, H, capacity=2)
    for m in (1, 3, 5, 2, 7):
        path.append(path.draw(_points(rng, m), normals=rng.standard_normal))
    x = path.points
    full = scipy.linalg.cholesky(gp.gaussian_kernel(x, x, H) + np.diag(path.jitters), lower=True)
    assert np.max(np.abs(full - path.factor)) < 1e-10
    # Reloading from the stored (points, values, jitters) rebuilds the same state.
    again = gp.GpPath(2, H)
    again.extend_known(path.points[:4], path.values[:4], path.jitters[:4])
    again.extend_known(path.points[4:], path.values[4:], path.jitters[4:])
    assert np.max(np.abs(again.factor - path.factor)) < 1e-10


def _lr_pvalue(z: np.ndarray) -> float:
    n, d = z.shape
    s = z.T @ z / n
    statistic = n * (np.trace(s) - np.linalg.slogdet(s)[1] - d)
    return float(stats.chi2.sf(statistic, d * (d + 1) // 2))


def _simulate(broken: bool, n_paths: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(7 if not broken else 8)
    x = np.array([[0.1, 0.2], [0.3, 0.25], [0.8, 0.9], [0.5, 0.5], [0.52, 0.5], [0.2, 0.7]])
    batches = [x[:2], x[2:3], x[3:6]]
    cov = gp.gaussian_kernel(x, x, H) + gp.DEFAULT_JITTER * np.eye(6)
    whiten = scipy.linalg.cholesky(cov, lower=True)
    out = np.empty((n_paths, 6))
    for k in range(n_paths):
        path = gp.GpPath(2, H)
        values = []
        for batch in batches:
            if broken:
                fresh = gp.GpPath(2, H)  # ignores the stored values: wrong law
                draw = fresh.draw(batch, normals=rng.standard_normal)
                values.append(draw.values)
                path.extend_known(batch, draw.values, draw.jitters)
            else:
                draw = path.draw(batch, normals=rng.standard_normal)
                values.append(draw.values)
                path.append(draw)
        out[k] = scipy.linalg.solve_triangular(whiten, np.concatenate(values), lower=True)
    return out


def test_sequential_draws_have_the_joint_law_of_one_path() -> None:
    assert _lr_pvalue(_simulate(broken=False)) > ALPHA


def test_power_broken_conditioning_is_rejected() -> None:
    assert _lr_pvalue(_simulate(broken=True)) < ALPHA


def test_numerically_dependent_points_do_not_fail() -> None:
    rng = np.random.default_rng(3)
    path = gp.GpPath(2, H)
    first = path.draw(np.array([[0.5, 0.5]]), normals=rng.standard_normal)
    path.append(first)
    near = path.draw(
        np.array([[0.5, 0.5 + 2.0**-20], [0.5 + 2.0**-20, 0.5]]), normals=rng.standard_normal
    )
    path.append(near)
    # Conditional variance ~ jitter: the nearby answers are within a few jitter sds.
    assert np.all(np.abs(near.values - first.values[0]) < 1e-2)
    assert np.all(np.isfinite(path.factor))


def test_jitter_escalation_and_rejection() -> None:
    bad = np.array([[1.0, 2.0], [2.0, 1.0]])  # indefinite: eigenvalues 3 and -1
    with pytest.raises(gp.GpNumericalError):
        gp.jittered_cholesky(bad, 1e-8)
    nearly = np.array([[1.0, 1.0], [1.0, 1.0]]) - 1e-11 * np.eye(2)
    _, used = gp.jittered_cholesky(nearly, 1e-12)
    assert used > 1e-12


def test_full_refactor_agrees_in_mean_and_variance() -> None:
    rng = np.random.default_rng(5)
    path = gp.GpPath(2, H)
    path.append(path.draw(_points(rng, 10), normals=rng.standard_normal))
    new = _points(rng, 1)
    draws = np.array(
        [
            gp.full_refactor_draw(
                path.points,
                path.values,
                path.jitters,
                new,
                bandwidth=H,
                normals=rng.standard_normal,
            )[0]
            for _ in range(4000)
        ]
    )
    k_sn = gp.gaussian_kernel(path.points, new, H)
    v = path.solve_lower(k_sn)
    mean = float((v.T @ scipy.linalg.solve_triangular(path.factor, path.values, lower=True))[0])
    var = float(1.0 - (v.T @ v)[0, 0] + gp.DEFAULT_JITTER)
    # z-test on the mean (ALPHA two-sided), chi2 on the variance.
    z = (draws.mean() - mean) / np.sqrt(var / draws.size)
    assert abs(z) < stats.norm.isf(ALPHA / 2)
    chi = (draws.size - 1) * draws.var(ddof=1) / var
    assert stats.chi2.sf(chi, draws.size - 1) > ALPHA / 2
    assert stats.chi2.cdf(chi, draws.size - 1) > ALPHA / 2


def test_finite_bases() -> None:
    centres = gp.sobol_centres(50, 3)
    assert centres.shape == (50, 3)
    assert np.all((centres > 0) & (centres < 1))
    assert np.array_equal(centres, gp.sobol_centres(50, 3))  # public and deterministic
    rng = np.random.default_rng(0)
    freq = rng.normal(0, 1 / H, size=(20, 3))
    phi = gp.random_features(rng.uniform(size=(5, 3)), freq)
    assert np.allclose(np.linalg.norm(phi, axis=1), 1.0)


def test_squared_distances_are_bitwise_the_plain_expression() -> None:
    rng = np.random.default_rng(11)
    a, b = rng.uniform(size=(150, 7)), rng.uniform(size=(90, 7))
    norms_a, norms_b = np.einsum("ij,ij->i", a, a), np.einsum("ij,ij->i", b, b)
    plain = np.maximum((norms_a[:, None] + norms_b[None, :]) - 2.0 * (a @ b.T), 0.0)
    assert np.array_equal(gp.squared_distances(a, b), plain)
    out = np.full((150, 90), np.nan)
    assert gp.squared_distances(a, b, out=out) is out
    assert np.array_equal(out, plain)


def test_only_the_latest_draw_can_be_appended() -> None:
    rng = np.random.default_rng(12)
    path = gp.GpPath(2, H)
    path.append(path.draw(_points(rng, 5), normals=rng.standard_normal))
    stale = path.draw(_points(rng, 3), normals=rng.standard_normal)
    latest = path.draw(_points(rng, 3), normals=rng.standard_normal)
    with pytest.raises(ValueError, match="current state"):
        path.append(stale)  # its V was overwritten in the shared workspace
    path.append(latest)
    with pytest.raises(ValueError, match="current state"):
        path.append(latest)  # appended once only
    full = scipy.linalg.cholesky(
        gp.gaussian_kernel(path.points, path.points, H) + np.diag(path.jitters), lower=True
    )
    assert np.max(np.abs(full - path.factor)) < 1e-10


def test_ahead_hands_out_each_region_once() -> None:
    rng = np.random.default_rng(13)
    path = gp.GpPath(2, H, capacity=40, max_capacity=40)
    assert [r.shape for r in path.ahead(10)] == [(10, 10)]  # no workspace before a solve
    path.append(path.draw(_points(rng, 10), normals=rng.standard_normal))
    path.append(path.draw(_points(rng, 5), normals=rng.standard_normal))  # makes the workspace
    regions = path.ahead(10)
    assert [r.shape for r in regions] == [(25, 10), (40 * 5,)]  # columns 15..24, workspace
    assert path.ahead(10) == []
    assert [r.shape for r in path.ahead(100)] == [(40, 15)]  # up to the capacity only
