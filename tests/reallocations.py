"""Page faults of the main thread, then of another, each making and freeing a 40 MB array five times over (one made
before): glibc maps a block that large afresh each time (it is above its largest dynamic mmap threshold, 32 MB), and
hands the main arena's freed top back, so its pages are new and faulted in, unless the process keeps freed memory
(compute.threads.keep_freed_memory). Light to import, for a fresh process or a `--jobs` worker to run."""
import resource
import threading

import numpy as np

# Fewer faults than one fresh block takes, even in 2 MB pages: what a process that reuses the blocks may see (another
# thread's stray fault, say); five fresh blocks take five times as many at least.
ONE_BLOCK = 40_000_000 // (2 << 20)


def faults() -> int:
    seen = []

    def work():
        np.ones(5_000_000).sum()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            np.ones(5_000_000).sum()
        seen.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    work()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return sum(seen)
