"""`python -m benchmarks [BENCHMARK ...]` from the checkout's root."""

import sys

from . import main

sys.exit(main())
