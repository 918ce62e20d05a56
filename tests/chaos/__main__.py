"""``python -m tests.chaos``: see :mod:`tests.chaos.harness`."""

import sys

from tests.chaos.harness import main

sys.exit(main())
