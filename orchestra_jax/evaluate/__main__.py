"""`python -m orchestra_jax.evaluate ...`: the same as `orchestra eval ...`."""

import sys

from orchestra_jax.evaluate.cli import main

sys.exit(main())
