"""``python -m registry_coordinator``: the command line, as the tests and systemd start it."""

import sys

from registry_coordinator.cli import main

sys.exit(main())
