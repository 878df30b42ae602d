"""wait_readable works with descriptors numbered past 1,023, which select() refuses: a controller of
1,000 procs holds that many, and a gather there raised "filedescriptor out of range"."""

import os
import resource

from rlmesh.transport.sockets import wait_readable


def test_a_descriptor_past_1023_is_waited_on():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    high = os.dup2(efd, 1500)  # the same eventfd, under a number select() cannot take
    try:
        assert wait_readable([high], 0.01) == []
        os.eventfd_write(efd, 1)
        assert wait_readable([high], 1.0) == [high]
    finally:
        os.close(high)
        os.close(efd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
