import sys

from fleet.cli.console import main

sys.exit(main())
