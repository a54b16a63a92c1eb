"""Issue 9 ("long-polls answered, not dropped, on shutdown"): SIGTERM answers every coordinator
long-poll with 204 (poll again) before the server closes, instead of dropping the connection."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

from api_testkit import Server, create_job, metric, small_job


def test_sigterm_answers_waiting_long_polls(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log")
    server.start()
    try:
        with server.client() as c:
            job_id = create_job(c, small_job(2, 2, 4))
            first = c.get(f"/v1/jobs/{job_id}/workers/0/0/assignment", params={"after": 0, "wait_s": 60})
            assert first.status_code == 200, first.text

            def poll(worker):
                with server.client() as own:
                    return own.get(f"/v1/jobs/{job_id}/workers/{worker[0]}/{worker[1]}/assignment",
                                   params={"after": 1, "wait_s": 50})

            with ThreadPoolExecutor(4) as pool:
                waiting = [pool.submit(poll, w) for w in ((0, 0), (0, 1), (1, 0), (1, 1))]
                deadline = time.monotonic() + 30
                while metric(c, "recycle_long_polls_waiting") < 4:
                    assert time.monotonic() < deadline, "the polls never reached the server"
                    time.sleep(0.05)
                server.proc.send_signal(signal.SIGTERM)
                answers = [f.result(timeout=40) for f in waiting]
        assert [r.status_code for r in answers] == [204] * 4
        assert server.proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    finally:
        server.stop()
