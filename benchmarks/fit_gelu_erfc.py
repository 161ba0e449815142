"""Fit the polynomial behind half_erfc_fast (csrc/common/gelu_math.h) and check it.

erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2). P is fitted on z in [0, 10] (erfc(10) is
2e-45, below float's range) by iteratively reweighted least squares on a Chebyshev basis, a
cheap route to near-minimax. The kernel uses Q(t) = log2(e) P(t) - 1 (base-2 exponent, the
factor 1/2 of Phi folded in). Prints Q's coefficients and the relative error of Phi computed
in float32 the way the kernel does.  Run: python benchmarks/fit_gelu_erfc.py
"""

import math

import numpy as np
from numpy.polynomial import chebyshev as C

DEGREE = 5


def fit():
    z = np.linspace(0, 10, 20001)
    erfc = np.array([math.erfc(v) for v in z])
    t = 1 / (1 + 0.5 * z)
    g = np.log(erfc) + z**2 - np.log(t)
    w = np.ones_like(t)
    for _ in range(60):
        c = C.chebfit(t, g, DEGREE, w=w)
        err = np.abs(C.chebval(t, c) - g)
        w = w * (1 + err / err.max())
    q = C.cheb2poly(c) / math.log(2)
    q[0] -= 1.0
    return q


def check(q):
    x = np.linspace(-14, 8, 2_000_001).astype(np.float32)
    t = np.float32(1) / (np.float32(1) + np.abs(x) * np.float32(0.5 / math.sqrt(2)))
    acc = np.float32(q[-1])
    for k in range(len(q) - 2, -1, -1):
        acc = (acc * t + np.float32(q[k])).astype(np.float32)
    h = t * np.exp2(acc - x * x * np.float32(0.5 / math.log(2)))
    phi = np.where(x < 0, h, np.float32(1) - h).astype(np.float64)
    ref = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    ok = ref > 1e-37
    return np.max(np.abs(phi[ok] / ref[ok] - 1))


if __name__ == "__main__":
    q = fit()
    print("Q(t) coefficients, t^0 .. t^%d:" % DEGREE, ", ".join("%.9g" % v for v in q))
    print("max relative error of Phi in float32: %.2e" % check(q))
