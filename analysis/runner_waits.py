"""The runner's own waits before a prompt is read: the names store/ and pages/ still import from here.

The work lives in one module each: the runner's wait lines parsed (``analysis.runner_wait_lines``), one task's waits
and their stored row (``analysis.runner_wait_tasks``), the lines folded into tasks (``analysis.runner_wait_fold``) and
worded (``analysis.runner_wait_words``). New code imports those; this module only re-exports, and goes once store/ and
pages/ import them too.
"""

from __future__ import annotations

from analysis.runner_wait_tasks import RequestWaitsRow as RequestWaitsRow
from analysis.runner_wait_tasks import TaskWaits as TaskWaits
from analysis.runner_wait_words import waits_label as waits_label
