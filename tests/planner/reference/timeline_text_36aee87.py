"""FROZEN reference: cli/timeline_text.py as of commit 36aee87 (before the lexsort order and the
per-time text memo). Kept only for tests/planner/test_fast_equivalence.py; never edited."""
from __future__ import annotations

import json
from collections.abc import Iterator


def compact_json(doc) -> str:
    return json.dumps(doc, separators=(",", ":"))


def timeline_text(result) -> str:
    """`result.timeline_json()` as compact JSON text (`timeline_chunks` joined)."""
    return "".join(timeline_chunks(result))


def timeline_chunks(result) -> Iterator[str]:
    """`result.timeline_json()` as compact JSON text in pieces, about twice as fast for a 100k-op plan.

    The CLI's 3 s bar at 32 x 16 x 64 is spent mostly in planning; building ~100k op dicts and
    encoding them was a further ~0.8 s. The header (job, failed, periods, solver) still comes from
    `timeline_json()` itself; only the ops are written directly, with `Op.to_json`'s keys, order and
    rounding (test_cli checks that both parse to the same document). A compressed plan
    (planner/compress.py) streams its ops in order from the expansion, one worker's text at a time,
    so a 3.1 M-op timeline never holds its op list or all its op strings at once.
    """
    import dataclasses

    header = dataclasses.replace(result, ops=[]).timeline_json()
    if result.expansion is not None:
        ordered = result.expansion.in_worker_order()
    else:
        ordered = iter(sorted(result.ops, key=lambda o: (o.worker, o.start_ms)))
    for index, (key, value) in enumerate(header.items()):
        yield "{" if index == 0 else ","
        if key != "ops":
            yield f"{json.dumps(key)}:{compact_json(value)}"
            continue
        yield '"ops":['
        piece: list[str] = []
        worker, sep = None, ""
        for o in ordered:  # one worker's ops joined at a time
            if o.worker != worker and piece:
                yield sep + ",".join(piece)
                piece, sep = [], ","
            worker = o.worker
            mb = "" if o.microbatch is None else f',"microbatch":[{o.microbatch[0]},{o.microbatch[1]}]'
            piece.append(f'{{"worker":[{o.worker[0]},{o.worker[1]}],"kind":"{o.kind}",'
                         f'"start_ms":{round(o.start_ms, 6)!r},"end_ms":{round(o.end_ms, 6)!r}{mb}}}')
        if piece:
            yield sep + ",".join(piece)
        yield "]"
    yield "}"
