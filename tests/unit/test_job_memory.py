"""What an owned job keeps in memory: equal small payloads and slot numbers are shared between
jobs, and nothing of its database row but what it needs (the row's texts are not kept)."""

from __future__ import annotations

import gc
import json
import weakref

from cronman.hashing import slot_of
from scheduler_node.jobs import Decoder, JobRow, OwnedJob
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender


def _row(job_id: str, payload: str) -> JobRow:
    return JobRow(
        job_id,
        int(str(slot_of(job_id))),  # a fresh int object, as a database driver makes one per row
        1,
        json.dumps({"type": "interval", "every_seconds": 60}),
        json.dumps({"type": "http", "url": "https://hooks.example.com/cron"}),
        payload,
        json.dumps({"max_attempts": 3}),
        False,
        1_790_000_000_000,
        "default",
        "{}",
        7,
    )


def _decoder() -> Decoder:
    return Decoder(Senders([HttpSender(10, dev_mode=True)]).decode)


def test_equal_small_payloads_share_one_object_and_a_large_one_is_its_own() -> None:
    d = _decoder()
    a, b = d.job(_row("a", '{"task":"report"}')), d.job(_row("b", '{"task":"report"}'))
    assert a.payload == b.payload == b'{"task":"report"}' and a.payload is b.payload
    big = json.dumps({"blob": "x" * 400})
    c, e = d.job(_row("c", big)), d.job(_row("e", big))
    assert c.payload == e.payload == big.encode()


def test_jobs_of_one_slot_share_its_number() -> None:
    d = _decoder()
    ids = [f"job-{i}" for i in range(5000)]
    jobs: dict[int, OwnedJob] = {}
    for job_id in ids:
        job = d.job(_row(job_id, "{}"))
        first = jobs.setdefault(job.slot, job)
        assert job.slot is first.slot or job.slot < 257  # (small ints are shared by Python itself)


def test_the_rows_payload_text_is_not_kept() -> None:
    class Text(str):  # a str that can be watched for being freed
        pass

    d = _decoder()
    text = Text('{"task":"watch"}')
    gone = weakref.ref(text)
    row = _row("w", text)
    job = d.job(row)
    del row, text
    gc.collect()
    assert job.payload == b'{"task":"watch"}'
    assert gone() is None, "the decoder keeps the row's payload text"
