"""The Lab: experiments that make the phases visible (prompt length, context depth,
concurrency, interference, cold versus warm, prompt cache).

Run one with ``python -m collectors.lab``; in code, ``collectors.lab.runner.run_experiment``.
This package's ``__init__`` imports nothing, so the Lab page can read results
(``collectors.lab.results``) without pulling in the HTTP client.
"""
