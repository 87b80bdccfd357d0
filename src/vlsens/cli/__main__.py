"""``python -m vlsens.cli``: the ``vlsens`` command."""

import sys

from vlsens.cli import main

sys.exit(main())
