"""What a rehearsal leaves on disk: its moto server's buckets, copied before the server ends."""

from __future__ import annotations

from local_platform.moto_s3 import LocalS3
from local_platform.rehearsal.keep import keep_buckets, kept_path


def test_the_buckets_are_kept_in_a_new_folder_per_rehearsal_without_the_left_out_keys(tmp_path):
    with LocalS3(buckets=("rehearsal",)) as s3:
        client = s3.client()
        client.put_object(Bucket="rehearsal", Key="lake/runs/r/report.html", Body=b"<html>report</html>")
        client.put_object(Bucket="rehearsal", Key="lake/runs/r/stats/train.json", Body=b'{"steps": 3}')
        client.put_object(Bucket="rehearsal", Key="emr-logs/j-1/steps/s-1/stdout.gz", Body=b"\x1f\x8b")
        client.put_object(Bucket="rehearsal", Key="lake/runs/r/tokens/", Body=b"")  # a folder marker
        client.put_object(Bucket="rehearsal", Key="corpus/books.txt", Body=b"the user's own file")
        first = keep_buckets(client, tmp_path / "rehearsals", "rehearse-1", leave_out=("corpus/",))
        second = keep_buckets(client, tmp_path / "rehearsals", "rehearse-1", leave_out=("corpus/",))
    assert first == tmp_path / "rehearsals" / "rehearse-1" and second == tmp_path / "rehearsals" / "rehearse-1-2"
    assert kept_path(first, "s3://rehearsal/lake/runs/r/report.html").read_bytes() == b"<html>report</html>"
    assert sorted(str(path.relative_to(first)) for path in first.rglob("*") if path.is_file()) == [
        "rehearsal/emr-logs/j-1/steps/s-1/stdout.gz",
        "rehearsal/lake/runs/r/report.html",
        "rehearsal/lake/runs/r/stats/train.json",
    ]
    assert sorted(path.name for path in (tmp_path / "rehearsals").iterdir()) == ["rehearse-1", "rehearse-1-2"]
