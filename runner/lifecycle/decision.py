"""What a run's end means: after the watch's verdict, the run's state and its reason (cancelled by `runner down`,
timed out, hung, failed, lost), or Retry when its machine is to be replaced (a preemption within
retries.preemptions, a silent boot, a failure within retries.failures). Part of runner.lifecycle.run's Run, kept
apart for its size: the decision alone, from the verdict, the run directory's snapshot and the machine's state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.backends.base import Backend, Handle
from runner.errors import RunnerError
from runner.lifecycle.watchdog import NOTICES, Verdict, Watchdog, machine_end
from runner.plan.planner import Plan, hang_limit
from runner.watch import runs
from runner.watch.events import EventLog
from runner.watch.rundir import Snapshot
from runner.watch.state import RunState, derive_state

STOPPED_BY_DOWN = "stopped by runner down"  # the reason of a run `runner down` cancelled, in its record


class Retry(Exception):
    """Replace the machine and run again (a preemption, a silent boot, a failure with retries left); `resumes`: the
    job ran, and the next attempt goes on from what it saved."""

    def __init__(self, resumes: bool = True) -> None:
        super().__init__()
        self.resumes = resumes


class Deciding:
    """The decision half of a Run (runner.lifecycle.run), which sets these."""

    plan: Plan
    backend: Backend[Any]
    say: Callable[[str], None]
    events: EventLog
    reason: str | None
    safety_stop: bool
    watchdog: Watchdog | None
    preemptions: int
    failures: int
    silent_boots: int

    def _let_the_chief_save(self) -> None:
        raise NotImplementedError

    def _down_elsewhere(self) -> bool:
        """`runner down` from another shell: it marks this machine's record (down_at, cancelled) before it deletes
        anything, so a machine gone that way is never taken for a preemption (and recreated), nor a create it cut
        short for the API's failure, even with storage out of reach."""
        try:
            record = runs.load(self.plan.run_id)
        except RunnerError:
            return False
        return record.down_at is not None or record.state == RunState.CANCELLED

    def decide(self, verdict: Verdict, snapshot: Snapshot, handle: Handle) -> RunState:
        """The run's state after a verdict, or Retry when the machine is to be replaced."""
        retries = self.plan.spec.retries
        if verdict == Verdict.DOWN or (verdict == Verdict.MACHINE_GONE and self._down_elsewhere()):
            self.reason = STOPPED_BY_DOWN
            return RunState.CANCELLED
        if verdict == Verdict.DEADLINE:
            self.reason = f"max_runtime ({self.plan.spec.teardown.max_runtime}s) passed"
            self.say(f"{self.reason}: stopping the run and deleting what it created")
            self.events.emit("deadline_passed", deadline=self.plan.deadline)
            self.safety_stop = True
            return RunState.TIMED_OUT
        if verdict == Verdict.HUNG and (hang := hang_limit(self.plan)) is not None:
            self.reason = f"no progress for over {hang.seconds}s ({hang.why})"
            self.say(f"{self.reason}: stopping the run")
            self.events.emit("hung", seconds=hang.seconds)
            self.safety_stop = True
            return RunState.HUNG
        if verdict == Verdict.SILENT:
            hint = getattr(self.backend, "console_hint", None)
            where = f"; what the VM did at boot: {hint(handle)}" if hint else ""
            self.say(f"{self.reason}{where}")
            retry = self.silent_boots < 1
            self.events.emit("boot_timeout", seconds=self.plan.spec.teardown.boot_timeout, retry=retry)
            if retry:
                self.silent_boots += 1
                self.say("deleting it and creating it once more")
                raise Retry(resumes=False)
            self.safety_stop = True  # a VM that never ran the job bills for nothing: nothing to keep it for
            return RunState.FAILED
        notice = self.watchdog.notice if self.watchdog is not None else None
        end = machine_end(self.backend, handle, verdict, snapshot, self.plan.num_workers, notice)
        if end.taken_back:
            if self.preemptions >= retries.preemptions:
                self.events.emit("preempted", attempt=self.preemptions + 1, retry=False)
                self.reason = f"preempted again, after {self.preemptions} recreation(s) (retries.preemptions)"
                self.say(f"{self.reason}: giving up")
                return RunState.FAILED
            self.preemptions += 1
            self.events.emit("preempted", attempt=self.preemptions, retry=True)
            self.reason = None  # a worker stopped by the preemption is not the run's failure
            slices = self.plan.cloud.slices if self.plan.cloud is not None else 1
            # One slice of a multislice taken back means all restart from the last checkpoint, as Cloud TPU does
            # when it repairs one (cloud.google.com/tpu/docs/multislice-introduction: "Auto-repair").
            what = "the machine was preempted: recreating it"
            if end.notice is not None:  # the job was stopped at the notice; the API shows the machine still
                what = f"{NOTICES[end.notice]} (the job was stopped at once): recreating the machine"
            if slices > 1:
                what = f"a slice was preempted: recreating all {slices} slices"
            self.say(f"{what} ({self.preemptions}/{retries.preemptions})")
            if slices > 1:
                self._let_the_chief_save()
            raise Retry
        if end.stopped is not None:
            self.reason = end.stopped
            self.say(f"{end.stopped}: ending the run")
            self.events.emit("machine_stopped", reason=end.stopped)
            return RunState.LOST
        if verdict == Verdict.WORKER_LOST:
            self.say(f"{self.reason}: ending the run")
            self.events.emit("worker_lost", reason=self.reason)
            self.safety_stop = True  # a slice that cannot finish bills for nothing
            state = RunState.FAILED
        else:
            state = derive_state(
                snapshot, self.plan.num_workers, RunState.STARTING, machine_alive=False, heartbeat_timeout_s=0
            )
        if verdict == Verdict.WORKER_FAILED:
            self.say(f"{self.reason}: ending the run on every worker")
            self.events.emit("worker_failed", reason=self.reason)
            self.safety_stop = True  # the other workers cannot finish without it: the slice goes, whatever the policy
        if state == RunState.FAILED and self.failures < retries.failures:
            self.failures += 1
            self.events.emit("retrying_failure", attempt=self.failures)
            self.say(f"the job failed: running it again ({self.failures}/{retries.failures})")
            raise Retry
        return state
