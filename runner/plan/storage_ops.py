"""What a run asks of Cloud Storage while it runs: the request rate on its run directory and what that costs an
hour, for the plan of a multi-host job (beside the slice's own price).

The hosts write (runner.worker.supervisor, at its real cadence): every sync (RUNNER_SYNC_S, 5 s) a log that grew
travels by its new bytes, a part uploaded and composed onto the log (two Class A operations) and the part deleted
(free); every heartbeat (RUNNER_HEARTBEAT_S, 10 s) one object per worker (worker 0 writes the run's too). A job
that writes output at least every sync is assumed: the most its logs can cost. Checkpoints, metrics and TensorBoard
files are the job's own and are left out. The runner follows (runner.watch.view): each poll (every 2 s) lists the
exit records, heartbeats, events and logs (four Class A listings, whatever the number of hosts), and reads each
log that grew and, at most every 30 s once its worker runs, each heartbeat (Class B).

Prices: Cloud Storage operations, Standard storage in a single region, per 1,000 operations: Class A (objects.insert,
compose, list) $0.005, Class B (objects.get) $0.0004, deletes free (cloud.google.com/storage/pricing, as transcribed in
a public copy of the page read 2026-09-20; not checked against the live page: multi-region buckets charge more for
Class A). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

CLASS_A_PER_1000 = 0.005
CLASS_B_PER_1000 = 0.0004
PRICES_READ_ON = "2026-09-20"
PRICES_SOURCE = "cloud.google.com/storage/pricing"

SYNC_S = 5.0  # the supervisor's default sync (runner.worker.supervisor, RUNNER_SYNC_S)
HEARTBEAT_S = 10.0  # its default heartbeat (RUNNER_HEARTBEAT_S)
POLL_S = 2.0  # the runner's poll of a gs:// run directory (runner.timings.Timings.follow_gcs_s)
BEAT_READ_S = 30.0  # how often the runner reads a running worker's heartbeat (Timings.heartbeat_read_every_s)
LISTINGS = 4  # per poll: exit/, heartbeat*, events/, logs/


@dataclass(frozen=True)
class StorageOps:
    """Requests a second on a run directory while its job runs."""

    hosts_class_a: float  # the hosts' uploads and composes
    hosts_free: float  # the hosts' deletes of composed parts
    runner_class_a: float  # the runner's listings
    runner_class_b: float  # the runner's reads

    @property
    def per_s(self) -> float:
        return self.hosts_class_a + self.hosts_free + self.runner_class_a + self.runner_class_b

    @property
    def hosts_per_s(self) -> float:
        return self.hosts_class_a + self.hosts_free

    @property
    def per_hour_usd(self) -> float:
        class_a = (self.hosts_class_a + self.runner_class_a) * 3600 / 1000 * CLASS_A_PER_1000
        return class_a + self.runner_class_b * 3600 / 1000 * CLASS_B_PER_1000


def estimate(
    hosts: int,
    *,
    sync_s: float = SYNC_S,
    heartbeat_s: float = HEARTBEAT_S,
    poll_s: float = POLL_S,
    beat_read_s: float = BEAT_READ_S,
) -> StorageOps:
    """The request rate of a run on `hosts` hosts (every slice's), each host's job writing output continuously."""
    return StorageOps(
        hosts_class_a=hosts * 2 / sync_s + (hosts + 1) / heartbeat_s,
        hosts_free=hosts / sync_s,
        runner_class_a=LISTINGS / poll_s,
        runner_class_b=hosts / sync_s + hosts / max(heartbeat_s, beat_read_s),
    )


def plan_row(hosts: int, slice_per_hour: float | None) -> tuple[str, str]:
    """The plan's line: the run directory's request rate, and its cost beside the slice's."""
    ops = estimate(hosts)
    runner = ops.runner_class_a + ops.runner_class_b
    beside = f" beside the slice's ${slice_per_hour:,.2f}/hour" if slice_per_hour else ""
    return (
        "storage ops",
        f"about {_rate(ops.per_s)} requests/s on the run directory ({_rate(ops.hosts_per_s)} from the {hosts} hosts: a "
        f"log sync every {SYNC_S:g} s and a heartbeat every {HEARTBEAT_S:g} s each; {_rate(runner)} from the runner's "
        f"polls): ${ops.per_hour_usd:,.2f}/hour{beside}  (Cloud Storage operation prices per 1,000, Standard, one "
        f"region, read {PRICES_READ_ON})",
    )


def _rate(per_s: float) -> str:
    return f"{per_s:,.0f}" if per_s >= 10 else f"{per_s:.1f}"
