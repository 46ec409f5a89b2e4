"""``python -m collectors.gpu``: which GPU source this machine gets, and one sample from it."""

from collectors.gpu.report import main

raise SystemExit(main())
