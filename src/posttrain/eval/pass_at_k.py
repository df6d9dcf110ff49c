"""pass@k: the probability that at least one of k samples solves a task.

Sampling exactly k completions per task and checking whether any passes is a high-variance
estimate. Chen et al. (2021), "Evaluating Large Language Models Trained on Code", sample n >= k
completions, count the c that pass, and use the unbiased estimator

    pass@k = E_tasks[ 1 - C(n - c, k) / C(n, k) ]

computed as a running product so that large n does not overflow the binomials.
"""

from __future__ import annotations

from collections.abc import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``c`` of ``n`` samples correct (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks, each given as (n samples, c correct)."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    return sum(values) / len(values) if values else 0.0
