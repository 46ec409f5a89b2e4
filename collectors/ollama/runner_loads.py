"""Where each runner put its model, and the runner's own waits before each prompt, from their lines in Ollama's log
(``analysis.runner_placement``, ``analysis.runner_wait_fold``): a part of ``RunnerReader`` (``collectors.ollama.runners``).

Load lines carry no port: they count only inside a start sequence (``StartSequence``) that a runner found on that
port confirms as its own. Wait lines carry no port either: they are the runner's Ollama started last, or the only
one's.
"""

from __future__ import annotations

from analysis.model_names import same_model
from analysis.runner_load_rows import RunnerDeviceRow, placement_rows
from analysis.runner_placement import RunnerPlacement
from analysis.runner_wait_fold import WaitJoiner
from analysis.runner_wait_tasks import RequestWaitsRow, waits_row
from collectors.ollama.log import EventKind, LogEvent
from collectors.ollama.runner_state import ReaderState, RunnerState, StartSequence

MAX_WAIT_RUNNERS = 8  # runners (by port) whose wait lines and placements are kept: runners come and go, the newest kept
# A start line is read at most this long after Ollama wrote it (a log read every step, a worker thread, a busy
# machine): the runner it started began after that.
START_LINE_READ_LAG_S = 10.0
MAX_START_SEQUENCES = 4  # starts told of and not yet confirmed by discovery (models loaded one after another)


class RunnerLoads(ReaderState):
    """Placements (by port) and waits (joined to requests) from Ollama's log."""

    def _placement(self, state: RunnerState) -> RunnerPlacement | None:
        """The runner's placement from its own start sequence (None: not read, or not confirmed as this process's)."""
        port = state.runner.port
        reader = self.placements.get(port)
        if reader is None or self._placement_pid.get(port) != state.runner.pid:
            return None
        return reader.placement()

    def placement_rows(self, ts_unix_s: float) -> dict[int, list[RunnerDeviceRow]]:
        """Each found runner's placement from its own load lines, by port, for the store (runners whose load was
        not read, e.g. loaded before the collector started, have none)."""
        out: dict[int, list[RunnerDeviceRow]] = {}
        for state in self.runners.values():
            placement = self._placement(state)
            if placement is not None:
                port = state.runner.port
                out[port] = placement_rows(placement, ts_unix_s=ts_unix_s, port=port, model=state.model, digest=state.digest)
        return out

    def placement_of(self, model: str) -> RunnerPlacement | None:
        """Where the runner serving ``model`` put it, in its own load lines; None when no found runner serves it or
        its load was not read."""
        for state in self.runners.values():
            matches = state.model is not None and same_model(model, state.model)
            if matches and (placement := self._placement(state)) is not None:
                return placement
        return None

    def _fold_load_lines(self, events: list[LogEvent]) -> None:
        """A load line counts only inside the start sequence Ollama's log told of last (its ``starting llama-server``
        line, to the runner's listening line): one after the runner is up, or with no start, is dropped and counted."""
        for event in events:
            seq = self._sequences[-1] if self._sequences else None
            if event.kind == EventKind.RUNNER_START and event.port is not None:
                self._loading_port = event.port
                self._sequences.append(StartSequence(event.port, event.read_unix_s))
            elif event.kind == EventKind.RUNNER_LOAD and event.load is not None:
                if seq is None or seq.up or not seq.reader.feed(event.load):
                    self.load_lines_dropped += 1
            elif event.kind in (EventKind.RUNNER_LISTENING, EventKind.RUNNER_STARTED) and seq is not None:
                seq.up = seq.up or event.port in (None, seq.port)
        self._adopt_sequences()

    def _started_after(self, seq: StartSequence) -> RunnerState | None:
        """The runner found on the sequence's port if its process started after the start line was written."""
        for state in self.runners.values():
            started = state.started_unix_s
            if state.runner.port == seq.port and started is not None and started >= seq.read_unix_s - START_LINE_READ_LAG_S:
                return state
        return None

    def _adopt_sequences(self) -> None:
        """A start sequence becomes the placement of the runner on its port whose process started after its start line
        was written (a forged start line naming a running runner's port is not that runner's), once per runner process
        (a later sequence naming the same process changes nothing). The newest such sequence for a port is the one
        Ollama wrote for it; older ones for that port are let go."""
        for seq in reversed(list(self._sequences)):
            if seq not in self._sequences:
                continue  # let go as older than one taken
            state = self._started_after(seq)
            if state is None:
                continue
            pid = state.runner.pid
            if self._placement_pid.get(seq.port) == pid and self.placements.get(seq.port) is not seq.reader:
                continue  # this process's own sequence was taken already
            self.placements[seq.port] = seq.reader
            self._placement_pid[seq.port] = pid
            for other in [o for o in self._sequences if o.port == seq.port and o is not seq and o.read_unix_s <= seq.read_unix_s]:
                self._sequences.remove(other)
            if seq.up:
                self._sequences.remove(seq)  # complete and taken: nothing more to read into it
        live = {s.runner.port for s in self.runners.values()}
        for port in [p for p in self.placements if p not in live][: max(0, len(self.placements) - MAX_WAIT_RUNNERS)]:
            del self.placements[port]  # runners come and go: a gone runner's is let go
            self._placement_pid.pop(port, None)

    def drain_waits(self) -> list[RequestWaitsRow]:
        """The runner waits joined to requests since the last call (one row per request, the latest)."""
        out, self._waits_queue = list(self._waits_queue.values()), {}
        return out

    def _waits_target(self) -> tuple[int | None, dict[int, int | None]]:
        """Whose the next wait lines are (they carry no port): the runner Ollama started last, or the only one; and each
        found runner's slot count by port, from its command line (-np), to hold the lines' slot ids to."""
        port = self._loading_port
        if port is None and len(self.runners) == 1:
            port = next(iter(self.runners.values())).runner.port
        return port, {state.runner.port: state.runner.n_parallel for state in self.runners.values()}

    def _fold_waits(
        self, events: list[LogEvent], port: int | None, slots_by_port: dict[int, int | None]
    ) -> list[tuple[int | None, int, float]]:
        """The runner's waits and task lines, in the order it printed them: the (port, task, when read) whose waits
        changed, to join to requests on the loop. Runs in the log's worker thread; each line costs the same however
        many came before (the joiner's tables are bounded: analysis.runner_wait_fold)."""
        started = [e.port for e in events if e.kind == EventKind.RUNNER_START and e.port is not None]
        if started:
            port = started[-1]  # like _fold_load_lines: the lines after a start are that runner's
        joiner = self._waits.get(port)
        if joiner is None:
            for old in list(self._waits)[: max(0, len(self._waits) - (MAX_WAIT_RUNNERS - 1))]:  # runners come and go
                del self._waits[old]
            joiner = self._waits[port] = WaitJoiner(slots_by_port.get(port) if port is not None else None)
        dropped_before = joiner.dropped
        changed: dict[tuple[int | None, int], float] = {}
        for event in events:
            tasks = []
            if event.kind == EventKind.RUNNER_WAIT and event.wait is not None:
                tasks = joiner.wait(event.wait)
            elif event.task_id is not None and event.kind == EventKind.LAUNCH:
                tasks = joiner.launch(event.slot_id, event.task_id)
            elif event.task_id is not None and event.kind == EventKind.NEW_PROMPT:
                tasks = joiner.new_prompt(event.task_id)
            elif event.task_id is not None and event.kind == EventKind.RELEASE:
                tasks = joiner.release(event.slot_id, event.task_id)
            for task in tasks:
                changed[(port, task.task_id)] = event.read_unix_s
        self.wait_lines_dropped += joiner.dropped - dropped_before
        # Only tasks the joiner still holds can be joined: a flood of launches leaves its newest MAX_TASKS_KEPT.
        return [(p, t, at) for (p, t), at in changed.items() if t in joiner.tasks]

    def _join_waits(self) -> None:
        by_task = {task: rid for (_pid, task), rid in self._tasks.items()} if len(self.runners) <= 1 else {}
        for (port, task_id), read_s in list(self._waits_unjoined.items()):
            task = self._waits.get(port, WaitJoiner()).tasks.get(task_id)
            if task is None:
                del self._waits_unjoined[(port, task_id)]
                continue
            rid = by_task.get(task_id)
            if rid is None and self.direct.unclaimed(task_id):
                rid = self.direct.record_id(task_id)
            if rid is not None:
                self._waits_queue[rid] = waits_row(rid, task, ts_unix_s=read_s, port=port)
                del self._waits_unjoined[(port, task_id)]
            elif self._clock() - read_s > 60.0:
                del self._waits_unjoined[(port, task_id)]  # no request was ever joined to it: let it go
