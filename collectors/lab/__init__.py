"""The Lab: experiments that make the phases visible (prompt length, context depth,
concurrency, interference, cold versus warm, prompt cache).

Run one with ``python -m collectors.lab``; in code, ``collectors.lab.runner.run_experiment``.
This package's ``__init__`` imports nothing, so ``collectors.lab.results`` (the run
documents) can be read without pulling in the HTTP client. Pages reach the Lab through
``collectors.api``.
"""
