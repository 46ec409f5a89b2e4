"""Joining a runner's /slots readings to in-flight requests and queueing their ``ProgressSample`` rows: a part of
``RunnerReader`` (``collectors.ollama.runners``)."""

from __future__ import annotations

from dataclasses import replace

from analysis.model_names import same_model
from analysis.records import ProgressSample, ProgressSource, RequestRecord
from collectors.ollama.direct_task import RunnerRef
from collectors.ollama.runner_state import ReaderState, RunnerState, Track
from collectors.ollama.slots import SlotReading


class RunnerJoin(ReaderState):
    """A busy slot joined to the in-flight request of its model (oldest request ↔ oldest task), its rows queued."""

    def _join(
        self,
        state: RunnerState,
        readings: list[SlotReading],
        requests: list[RequestRecord],
        ts: float,
        asked: float | None = None,
    ) -> None:
        pid = state.runner.pid
        if state.model is None:
            return  # which model it serves is not known yet (/api/ps not read): no join is safe
        self._claim_new_tasks(pid, state.model, readings, requests)
        for slot in readings:
            rid = self._tasks.get((pid, slot.task_id or 0)) if slot.task_id is not None else None
            if rid is not None and slot.processed_tokens is not None:
                self._add(rid, slot, ts)
        claims = {task: rid for (p, task), rid in self._tasks.items() if p == pid}
        ref = RunnerRef(pid, state.runner.port, state.model)
        for rid, slot in self.direct.slots_read(ref, readings, ts, claims, asked=asked):
            if slot.processed_tokens is not None:
                self._add(rid, slot, ts)

    def _claim_new_tasks(self, pid: int, model: str, readings: list[SlotReading], requests: list[RequestRecord]) -> None:
        """Proxied requests of this runner's model with no task yet take the tasks its slots began since the last poll."""
        mine = sorted((r for r in requests if same_model(r.model, model)), key=lambda r: (r.started_at_unix_s, r.id))
        taken = set(self._tasks.values())
        free = [r for r in mine if r.id not in taken and r.first_token_ns is None]
        new = sorted(
            (s for s in readings if s.is_processing and s.task_id is not None and (pid, s.task_id) not in self._tasks),
            key=lambda s: s.task_id or 0,
        )
        # Nothing in flight tells which new task is which request (the runner's count of a request's prompt comes
        # with its reply): the oldest request takes the oldest task, a tie-break only. When more tasks began than
        # requests, one may be a direct client's: the claim is checked against the request's own prompt count when
        # it finishes, and moved to the task of that size (DirectTasks.proxied_finished).
        if len(new) > len(free) > 0:
            self.claims_by_order += 1
        for slot, req in zip(new, free, strict=False):
            self._tasks[(pid, slot.task_id or 0)] = req.id

    def _track(self, rid: str) -> Track:
        track = self._tracks.get(rid)
        if track is None:
            track = self._tracks[rid] = Track(rid)
        return track

    def _add(self, rid: str, slot: SlotReading, ts: float) -> None:
        track = self._track(rid)
        key = (slot.processed_tokens, slot.cached_tokens, slot.decoded_tokens, slot.ctx_tokens)
        if key == track.last_key:
            return  # nothing moved since the last row
        track.last_key = key
        if slot.prompt_size_tokens is not None:
            self._sized(track, slot.prompt_size_tokens, exact=True)
        sample = ProgressSample(
            request_id=rid,
            ts_unix_s=ts,
            source=ProgressSource.SLOTS,
            processed_tokens=slot.processed_tokens or 0,
            prompt_tokens=track.prompt_tokens,
            cached_tokens=slot.cached_tokens,
            decoded_tokens=slot.decoded_tokens,
            ctx_used_tokens=slot.ctx_tokens,
            n_ctx=slot.n_ctx,
        )
        (track.decode_rows if slot.decoding else track.prefill_rows).append(sample)
        self._queue.append(sample)

    def _sized(self, track: Track, prompt_tokens: int, *, exact: bool) -> None:
        """The prompt's size is now known (exactly, or from a log line's rounded fraction): queue the earlier
        rows again with it. Rows keyed alike in the store, the later write wins."""
        if track.prompt_tokens == prompt_tokens:
            track.exact = track.exact or exact
            return
        if track.exact and (not exact or prompt_tokens < (track.prompt_tokens or 0)):
            return  # an exact size is only ever raised (a reading racing the prompt's last batch may read low)
        track.prompt_tokens, track.exact = prompt_tokens, exact
        for rows in (track.prefill_rows, track.decode_rows):
            for i, row in enumerate(rows):
                if row.prompt_tokens != prompt_tokens:
                    rows[i] = replace(row, prompt_tokens=prompt_tokens)
                    self._queue.append(rows[i])
