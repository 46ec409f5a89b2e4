"""Folding one runner's lines, in the order it printed them, into each task's waits (``WaitJoiner``): which task a
wait is, when the prompt-cache lines name none (``analysis.runner_wait_lines``' module doc). Pure: no I/O, no clock."""

from __future__ import annotations

from analysis.runner_wait_lines import WaitLine, WaitLineKind
from analysis.runner_wait_tasks import TaskWaits, WaitKind

# Bounds on what one runner's lines can make the joiner keep (each line names its slot and task, and anyone can have
# lines printed): tasks whose waits are kept, task-less lines waiting for the next launch, slots believed.
MAX_TASKS_KEPT = 256
MAX_PENDING_LINES = 64
MAX_SLOTS_BELIEVED = 256  # the same bound as /slots' (collectors.ollama.slots.MAX_SLOTS)
# The lines that are waits, and the wait each one is (the other lines steer the joiner: slots, skipped saves, timing).
WAIT_OF_LINE: dict[WaitLineKind, WaitKind] = {
    WaitLineKind.SAVE: WaitKind.PROMPT_CACHE_SAVE,
    WaitLineKind.CACHE_LOAD: WaitKind.PROMPT_CACHE_LOAD,
    WaitLineKind.CHECKPOINT_RESTORE: WaitKind.CHECKPOINT_RESTORE,
    WaitLineKind.CHECKPOINT_ERASE: WaitKind.CHECKPOINT_ERASE,
    WaitLineKind.FULL_REPROCESS: WaitKind.FULL_REPROCESS,
    WaitLineKind.CHECKPOINT_CREATE: WaitKind.CHECKPOINT_CREATE,
}


class WaitJoiner:
    """Folds one runner's lines, in the order it printed them, into each task's waits.

    ``launch``, ``new_prompt`` and ``release`` are the task lines ``collectors.ollama.log`` already reads; ``wait``
    takes this module's lines. Each returns the tasks whose waits changed (to store again); each costs time
    independent of how many lines came before (the tables are bounded), so a flood folds in time linear in its lines.

    ``slots``: how many slots the runner has, as a channel other than its lines says (its command line's ``-np``, or
    its ``/slots``); a line naming a slot beyond them, or a slot count that disagrees, is not the runner's: dropped
    and counted in ``dropped``. Which task a wait belongs to is still only the lines' word: a request gets a task's
    waits only once ``/slots`` showed that task serving it (the reader's join)."""

    def __init__(self, slots: int | None = None) -> None:
        self.slots = min(slots, MAX_SLOTS_BELIEVED) if slots is not None and slots > 0 else None
        self.n_slots: int | None = self.slots
        self.tasks: dict[int, TaskWaits] = {}  # in launch order: the oldest is let go first
        self.dropped = 0  # lines naming a slot the runner does not have, or a slot count it does not run with
        self._busy: dict[int, int] = {}  # slot → task processing in it (at most ``slots`` entries)
        self._pending: list[WaitLine] = []  # task-less lines printed before the next launch
        self._launched: int | None = None  # the task launched last, until its prompt arrives
        self._last_save: tuple[int, WaitLine] | None = None  # (task, line) of the last save, until skipped or not

    def _slot_believed(self, slot_id: int | None) -> bool:
        limit = self.slots if self.slots is not None else MAX_SLOTS_BELIEVED
        if slot_id is None or 0 <= slot_id < limit:
            return True
        self.dropped += 1
        return False

    def launch(self, slot_id: int | None, task_id: int) -> list[TaskWaits]:
        if not self._slot_believed(slot_id):
            return []
        others = sum(1 for s, t in self._busy.items() if s != slot_id and t != task_id)
        self.tasks.pop(task_id, None)  # launched again (a restarted runner): now the newest
        task = self.tasks[task_id] = TaskWaits(task_id, slot_id, self.n_slots, others)
        if slot_id is not None:
            self._busy[slot_id] = task_id
        self._launched = task_id
        pending, self._pending = self._pending, []
        for line in pending:
            self._apply(task, line)
        while len(self.tasks) > MAX_TASKS_KEPT:  # the oldest launched: dicts keep insertion order
            del self.tasks[next(iter(self.tasks))]
        return [task]

    def new_prompt(self, task_id: int) -> list[TaskWaits]:
        task = self.tasks.get(task_id)
        if task is None:
            return []
        task.new_prompt_seen = True
        if self._launched == task_id:
            self._launched = None
        return [task]

    def release(self, slot_id: int | None, task_id: int) -> list[TaskWaits]:
        if not self._slot_believed(slot_id):
            return []
        if slot_id is not None and self._busy.get(slot_id) == task_id:
            del self._busy[slot_id]
        task = self.tasks.get(task_id)
        if task is None:
            return []
        task.released = True
        return [task]

    def wait(self, line: WaitLine) -> list[TaskWaits]:
        if not self._slot_believed(line.slot_id):
            return []
        if line.kind is WaitLineKind.N_SLOTS:
            if line.tokens is None or (self.slots is not None and line.tokens != self.slots) or line.tokens > MAX_SLOTS_BELIEVED:
                self.dropped += 1
                return []
            self.n_slots = line.tokens
            self._busy.clear()  # a new load: no task runs
            return []
        if line.kind is WaitLineKind.SAVE_SKIPPED:
            return self._save_skipped()
        if line.task_id is not None:
            task = self.tasks.get(line.task_id)
        elif self._launched is not None:
            task = self.tasks.get(self._launched)
        else:
            self._pending.append(line)
            if line.kind is WaitLineKind.SAVE:
                self._last_save = (-1, line)
            del self._pending[:-MAX_PENDING_LINES]  # bounded: a runner that never launches a task
            return []
        if task is None:
            return []
        self._apply(task, line)
        return [task]

    def _save_skipped(self) -> list[TaskWaits]:
        """The save before this line copied nothing ("already in the cache", "exceeds cache size limit")."""
        if self._last_save is None:
            return []
        owner, save = self._last_save
        self._last_save = None
        task = self.tasks.get(owner)
        wait = task.waits.get(WaitKind.PROMPT_CACHE_SAVE) if task is not None else None
        if task is not None and wait is not None:
            wait.count -= 1
            wait.size_bytes -= save.size_bytes or 0
            if wait.count <= 0:
                del task.waits[WaitKind.PROMPT_CACHE_SAVE]
            return [task]
        if save in self._pending:
            self._pending.remove(save)
        return []

    def _apply(self, task: TaskWaits, line: WaitLine) -> None:
        kind = WAIT_OF_LINE.get(line.kind)
        if line.kind is WaitLineKind.CACHE_UPDATE and line.duration_ms is not None:
            task.cache_update_ms += line.duration_ms
        if kind is None:
            return
        task.add(kind, line.size_bytes, line.tokens)
        if line.kind is WaitLineKind.SAVE:
            self._last_save = (task.task_id, line)
