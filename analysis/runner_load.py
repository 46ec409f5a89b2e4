"""Where a runner put its model, in its own words: the names store/ and pages/ still import from here.

The work lives in one module each: the load lines parsed (``analysis.runner_load_lines``), folded into a placement
(``analysis.runner_placement``), stored as rows (``analysis.runner_load_rows``) and worded
(``analysis.runner_load_words``); sim's imitation of Ollama's sizing is ``sim.ollama_placement``. New code imports
those; this module only re-exports, and goes once store/ and pages/ import them too.
"""

from __future__ import annotations

from analysis.runner_load_rows import RunnerDeviceRow as RunnerDeviceRow
from analysis.runner_load_rows import placement_from_rows as placement_from_rows
from analysis.runner_load_words import SOURCE_ASSUMED as SOURCE_ASSUMED
from analysis.runner_load_words import PlacementInUse as PlacementInUse
from analysis.runner_load_words import describe_layers as describe_layers
from analysis.runner_load_words import placement_in_use as placement_in_use
from analysis.runner_placement import RunnerPlacement as RunnerPlacement
