"""Equivalences the scale work relies on (issue 8, item 5), checked on small jobs.

`concrete_ops` is the batch form of `_to_concrete` (the canonical plan mapped back to the
user's pipeline numbering); it must give the very same ops, in the same order.
"""

from __future__ import annotations

from planner.failures import normalize
from planner.solve import _to_concrete, concrete_ops
from planner.timeline import Op


def test_batch_mapping_equals_one_op_at_a_time(small_job):
    canonical = normalize(small_job, [(2, 1)])  # canonically pipeline 0: the map is not the identity
    assert any(canonical.to_concrete[p] != p for p in range(small_job.pipelines))
    ops = [Op((0, 1), "F", (0, 3), 1.0, 4.0), Op((1, 2), "B", (2, 0), 5.0, 7.0),
           Op((2, 0), "ALLREDUCE", None, 9.0, 13.0)]
    assert concrete_ops(canonical, ops) == [_to_concrete(canonical, op) for op in ops]
    # Hand-checked: canonical pipeline 0 is the failed concrete pipeline 2.
    assert concrete_ops(canonical, ops)[0].worker == (2, 1)
