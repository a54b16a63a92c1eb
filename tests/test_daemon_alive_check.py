"""The 4,096-daemon benchmark checks each answer's derived alive set once per distinct answer shape
(`benchmarks/api_daemons.AliveCheck`): a wrong alive set must still be counted, whatever answer
came first with the same grid."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from api_daemons import AliveCheck, answer_head  # noqa: E402


def _answer(pipelines: int, stages: int, failed: list[list[int]]) -> dict:
    return {"pipelines": pipelines, "stages": stages, "failed": failed, "generation": 2}


def test_a_different_failure_set_is_checked_again():
    expected = [(p, s) for p in range(3) for s in range(4) if (p, s) != (1, 2)]
    check = AliveCheck(expected)
    assert check(_answer(3, 4, [[1, 2]]))
    assert check(_answer(3, 4, [[1, 2]]))  # remembered
    assert not check(_answer(3, 4, [[1, 3]]))  # same grid, another failure: wrong
    assert not check(_answer(3, 4, [[1, 2], [0, 0]]))
    assert not check(_answer(4, 4, [[1, 2]]))  # another grid


def test_a_wrong_first_answer_stays_wrong():
    expected = [(p, s) for p in range(2) for s in range(2) if (p, s) != (0, 1)]
    check = AliveCheck(expected)
    assert not check(_answer(2, 2, []))
    assert not check(_answer(2, 2, []))
    assert check(_answer(2, 2, [[0, 1]]))


def test_the_head_is_the_answer_less_worker_and_stream():
    """The head the benchmark decides "held" from is the answer as the service builds it
    (`api.assignment._splice`), less the two members it splices in last."""
    from api.assignment import _splice

    head = b'{"generation":2,"failed":[[1,2]],"reason":"worker [1, 2] \\",\\"worker\\":[ odd","pipelines":3}'
    body = _splice(head, (0, 1), b',"instructions":{"ops":[{"op":"F","worker":[9,9]}]}')
    assert answer_head(body) == {"generation": 2, "failed": [[1, 2]], "pipelines": 3,
                                 "reason": 'worker [1, 2] ","worker":[ odd'}
    assert answer_head(b'{"generation":3,"failed":[]}') == {"generation": 3, "failed": []}
