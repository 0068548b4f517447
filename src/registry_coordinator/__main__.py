import sys

from registry_coordinator.cli import main

sys.exit(main())
