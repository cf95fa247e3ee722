"""`run --nproc` beyond what the host can hold is refused with the numbers, before anything starts."""

from __future__ import annotations

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.launch.capacity import HostCapacity, check_nproc, rank_limits

GIB = 1 << 30


def test_a_few_times_the_cores_is_fine_on_cpu():
    small = HostCapacity(cores=2, available_bytes=16 * GIB, max_user_processes=None,
                         max_open_files=1024)  # fmt: skip
    for nproc in (1, 2, 8, 32):
        check_nproc(nproc, small)


def test_a_hundred_thousand_ranks_are_refused_naming_every_limit():
    host = HostCapacity(cores=2, available_bytes=16 * GIB, max_user_processes=4096,
                        max_open_files=20000)  # fmt: skip
    with pytest.raises(UsageError) as caught:
        check_nproc(100_000, host)
    text = str(caught.value)
    assert text.startswith("--nproc 100000 is more ranks than this host can hold")
    assert "2 usable CPU cores" in text and "16.0 GiB of memory" in text
    assert "4096 processes (ulimit -u)" in text and "20000 open files (ulimit -n)" in text
    assert "use --nproc 32 or fewer" in text  # the tightest limit: 16 a core, at least 32


def test_each_limit_on_its_own():
    roomy = dict(cores=64, available_bytes=1024 * GIB, max_user_processes=None,
                 max_open_files=None)  # fmt: skip
    check_nproc(1000, HostCapacity(**roomy))
    with pytest.raises(UsageError, match="ulimit -u"):
        check_nproc(200, HostCapacity(**{**roomy, "max_user_processes": 300}), workers=1)
    with pytest.raises(UsageError, match="ulimit -n"):
        check_nproc(500, HostCapacity(**{**roomy, "max_open_files": 1024}))
    with pytest.raises(UsageError, match="GiB of memory"):
        check_nproc(500, HostCapacity(**{**roomy, "available_bytes": 10 * GIB}))


def test_this_hosts_own_limits_are_read():
    host = HostCapacity.here()
    assert host.cores >= 1
    assert all(limit >= 0 for limit, _ in rank_limits(host))
